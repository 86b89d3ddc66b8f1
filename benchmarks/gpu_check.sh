#!/usr/bin/env bash
# Every GPU check in one command, for a machine with one CUDA GPU and PyTorch, transformers, timm and
# pytest already installed (blockforge runs from this checkout; ray, optuna, datasets and gguf are not
# needed for these checks). Each stage has its own time limit, and its log lands in $OUT (default
# runs/gpu-check). STAGES picks stages (default: all three, in this order).
#
#     bash benchmarks/gpu_check.sh
#     STAGES="tests train" bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers, timm; print("torch", torch.__version__, "transformers", transformers.__version__, "timm", timm.__version__)'

STAGES=${STAGES:-tests throughput train}
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
