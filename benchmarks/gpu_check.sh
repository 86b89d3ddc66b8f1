#!/usr/bin/env bash
# Every GPU check in one command, for a machine with one CUDA GPU and PyTorch, transformers, timm and
# pytest already installed (blockforge runs from this checkout; ray, optuna, datasets and gguf are not
# needed for these checks but the search stage's, which needs ray and optuna: ../shared/tools/device_wheels.sh packs them
# to take along; the data stage's streaming row runs only where `datasets` imports). Each stage has its own
# time limit, and its log lands in $OUT (default runs/gpu-check). STAGES picks stages (default: all five, in this order).
# DEVICE=cpu runs the data and search stages on the CPU (tests/test_gpu_search.py runs the search stage that way).
#
#     bash benchmarks/gpu_check.sh
#     STAGES="tests train" bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, timm; print("torch", torch.__version__, "transformers", transformers.__version__, "timm", timm.__version__)'

STAGES=${STAGES:-tests throughput data search train}
stage() { [[ " $STAGES " == *" $1 "* ]]; }

if stage tests; then
  echo "== tests/test_gpu.py"
  timeout "${TESTS_LIMIT:-120}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/tests.log"
  echo "tests rc ${PIPESTATUS[0]}"
fi

if stage throughput; then
  echo "== throughput against transformers and timm"
  timeout "${THROUGHPUT_LIMIT:-330}" python3 benchmarks/gpu_throughput.py --json "$OUT/throughput.json" 2>&1 | tee "$OUT/throughput.log"
  echo "throughput rc ${PIPESTATUS[0]}"
fi

if stage data; then
  echo "== the Trainer at 130M on a prepared set, against the synthetic-batch figure of the throughput stage"
  timeout "${DATA_LIMIT:-300}" python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/data.log"
import json, os, pathlib, subprocess, sys, time

out = pathlib.Path(sys.argv[1])
recipe = os.environ.get("DATA_RECIPE", "recipes/llama-130m-pre.yaml")
device, batch, steps = os.environ.get("DEVICE", "cuda"), int(os.environ.get("DATA_BATCH", "64")), int(os.environ.get("DATA_STEPS", "60"))
sets = ["--set", "data.source=builtin", "--set", "data.tokenizer={bpe: 8192}", "--set", "data.pack=true", "--set", "model.vocab=32000"]
run_sets = sets + ["--set", f"train.device={device}", "--set", f"train.steps={steps}", "--set", f"train.batch_size={batch}",
                   "--set", f"train.micro_batch_size={batch}", "--set", "train.log_every=10", "--set", f"train.eval_every={steps}",
                   "--set", "train.eval_batches=2", "--set", f"train.checkpoint_every={steps}", "--set", "train.grad_norm_every=0"]
bf = [sys.executable, "-m", "blockforge"]
started = time.perf_counter()
subprocess.run(bf + ["prepare", recipe, *sets, "--out", "/tmp/gpu-data-set", "--workers", "1", "--no-progress"], check=True)
print(f"prepared the builtin corpus in {time.perf_counter() - started:.1f} s")

def rate(run):
    rows = [json.loads(l) for l in pathlib.Path(run, "metrics.jsonl").read_text().splitlines() if l.strip()]
    train = [r["tok_per_s"] for r in rows if r["event"] == "train" and r["step"] > 10]  # after the first records' warm-up
    return sum(train) / len(train)

subprocess.run(bf + ["train", recipe, *run_sets, "--set", "data.prepared=/tmp/gpu-data-set", "--out", "/tmp/gpu-data-prepared",
                     "--no-progress"], check=True)
prepared = rate("/tmp/gpu-data-prepared")
line = {"prepared_tok_per_s": prepared}
synthetic_file = out / "throughput.json"
if synthetic_file.exists():
    rows = {r["model"]: r for r in json.loads(synthetic_file.read_text())["rows"]}
    synthetic = rows.get("llama-130m blockforge pre", {}).get("tok_or_img_per_s")
    if synthetic:
        line.update(synthetic_tok_per_s=synthetic, prepared_vs_synthetic=prepared / synthetic)
try:
    import datasets  # noqa: F401
except ImportError:
    line["streaming"] = "not run: datasets is not installed here"
else:
    docs = pathlib.Path("/tmp/gpu-data-docs.jsonl")
    from blockforge.data.corpus import builtin_documents
    from blockforge.storage import cache_root
    texts, _ = builtin_documents(cache_root())
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    stream = ["--set", "data.source=hf", "--set", "data.dataset=json", "--set", f"data.path={docs}", "--set", "data.val_split=null",
              "--set", "data.streaming=true"]
    subprocess.run(bf + ["train", recipe, *run_sets, *stream, "--out", "/tmp/gpu-data-streaming", "--no-progress"], check=True)
    line["streaming_tok_per_s"] = rate("/tmp/gpu-data-streaming")
    line["prepared_vs_streaming"] = prepared / line["streaming_tok_per_s"]
print("data:", json.dumps(line))
(out / "data.json").write_text(json.dumps(line, indent=1))
PY
  echo "data rc ${PIPESTATUS[0]}"
fi

if stage search; then
  echo "== a Ray Tune search with four trials sharing the GPU (resources: {gpu: 0.25}), against one trial alone"
  timeout "${SEARCH_LIMIT:-480}" python3 benchmarks/gpu_search.py --device "${DEVICE:-cuda}" --json "$OUT/search.json" 2>&1 | tee "$OUT/search.log"
  echo "search rc ${PIPESTATUS[0]}"
fi

stage train || exit 0
echo "== the training loop on CUDA: straight; preempted by SIGTERM and resumed; compiled; generation"
timeout "${TRAIN_LIMIT:-240}" python3 - <<'PY' 2>&1 | tee "$OUT/train.log"
import json, pathlib, signal, subprocess, sys, time

tiny = ["recipes/base/llama-tiny.yaml", "--set", "train.device=cuda", "--set", "train.steps=200", "--set", "train.checkpoint_every=20",
        "--set", "train.eval_every=100", "--set", "train.grad_norm_every=10", "--no-progress"]
bf = [sys.executable, "-m", "blockforge"]

def train_lines(run):
    rows = [json.loads(l) for l in pathlib.Path(run, "metrics.jsonl").read_text().splitlines() if l.strip()]
    return {r["step"]: r for r in rows if r["event"] == "train"}, [r for r in rows if r["event"] == "eval"]

start = time.perf_counter()
subprocess.run(bf + ["train", *tiny, "--out", "/tmp/gpu-straight"], check=True)
print(f"straight run: {time.perf_counter() - start:.1f} s")
proc = subprocess.Popen(bf + ["train", *tiny, "--out", "/tmp/gpu-resumed"], stderr=subprocess.PIPE, text=True)
pointer = pathlib.Path("/tmp/gpu-resumed/checkpoints/latest.json")
while proc.poll() is None and not (pointer.exists() and json.loads(pointer.read_text())["step"] >= 60):
    time.sleep(0.01)
proc.send_signal(signal.SIGTERM)
err = proc.communicate()[1]
print("after SIGTERM: rc", proc.returncode, "|", err.strip().splitlines()[-1] if err.strip() else "")
subprocess.run(bf + ["train", *tiny, "--out", "/tmp/gpu-resumed", "--resume"], check=True)
(a, ea), (b, eb) = train_lines("/tmp/gpu-straight"), train_lines("/tmp/gpu-resumed")
common = sorted(set(a) & set(b))
print("train steps logged", len(a), len(b), "| max |loss difference|", max(abs(a[s]["loss"] - b[s]["loss"]) for s in common),
      "| final val_loss", ea[-1]["val_loss"], eb[-1]["val_loss"], "| tok/s", round(a[max(a)]["tok_per_s"]))

start = time.perf_counter()
subprocess.run(bf + ["train", *tiny, "--set", "train.compile=true", "--out", "/tmp/gpu-compiled"], check=True)
c, ec = train_lines("/tmp/gpu-compiled")
print(f"compiled run: {time.perf_counter() - start:.1f} s, final val_loss", ec[-1]["val_loss"], "(eager", ea[-1]["val_loss"], ") | tok/s", round(c[max(c)]["tok_per_s"]))
subprocess.run(bf + ["generate", "/tmp/gpu-straight", "--prompt", "The os module", "--max-new-tokens", "24", "--device", "cuda", "--seed", "0"], check=True)
PY
echo "train rc ${PIPESTATUS[0]}"
