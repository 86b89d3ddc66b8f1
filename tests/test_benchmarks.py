"""The benchmark scripts run: the GPU throughput script on tiny configs, the reliability checks and their replay harness."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_throughput_script_runs_on_tiny_configs(tmp_path):
    out = tmp_path / "throughput.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), "--device", "cpu", "--tiny", "--no-compile",
               "--sizes", "130m", "--steps", "1", "--warmup", "1", "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["numerics"]["ok"] and result["numerics"]["fp32_vs_hf_max_abs_logit"] <= 1e-4
    models = {row["model"] for row in result["rows"]}
    assert models == {"llama-130m blockforge pre", "llama-130m blockforge mix", "llama-130m hf LlamaForCausalLM",
                      "vit-small blockforge pre", "vit-small blockforge mix", "vit-small timm VisionTransformer"}
    assert all(row["tok_or_img_per_s"] > 0 for row in result["rows"])
    assert "blockforge pre / HF" in done.stdout


@pytest.mark.slow
def test_the_quick_reliability_check_finds_the_known_answer(tmp_path):
    """One known-answer cell searched as a user would: re-measured whenever search code changes (make test-slow)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_reliability.py"), "--quick", "--out", str(tmp_path / "rel")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "quick check: 1 of 1 searches found the known answer" in done.stdout


def test_the_multi_cell_replay_scores_both_searches_against_a_known_grid(tmp_path):
    """The multi-cell benchmark's replay, on a made-up grid whose best k is 1 at every depth: both searches find it, and
    the guided one trains fewer k of the cell it guides than the unguided one (the harness the 25% figure comes from)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.search_reliability import multi_rows, multi_search, replay, truth_of, write

    cells, seeds = ["llama-d4", "llama-d6", "llama-d8", "llama-d12"], 3

    def loss(k: int, seed: int) -> float:  # best at k = 1 by a margin well over the seed noise
        return 5.9 + 0.1 * (k - 1) ** 2 + 0.01 * ((7 * seed + 3 * k) % 5 - 2)

    truths = {}
    for depth in (4, 6, 8, 12):
        values = {k: {s: loss(k, s) for s in range(seeds)} for k in range(depth // 2 + 1)}
        truths[depth] = truth_of(values, {k: {s: {150: v} for s, v in by_seed.items()} for k, by_seed in values.items()})
    rows = {}
    for guided in (False, True):
        name = "guided" if guided else "unguided"
        path = write(tmp_path, name, multi_search(guided, 2, cells))
        plan, records = replay(path, tmp_path / f"replay-{name}", truths, 0, seeds)
        rows[name] = {r["cell"]: r for r in multi_rows(name, plan, records, truths, seeds, 0)}
    for name, by_cell in rows.items():
        assert [r["chosen_k"] for r in by_cell.values()] == [1, 1, 1, 1], name
        assert all(r["verdict"] == "better" and r["truth_verdict"] == "better" and not r["overclaims"] for r in by_cell.values()), name
    assert rows["unguided"]["depth=12"]["explored_k"] == list(range(7))
    assert len(rows["guided"]["depth=12"]["explored_k"]) < 7
    assert rows["guided"]["depth=12"]["flops"] < rows["unguided"]["depth=12"]["flops"]
    assert [rows["guided"][c]["flops"] for c in ("depth=4", "depth=6", "depth=8")] == \
        [rows["unguided"][c]["flops"] for c in ("depth=4", "depth=6", "depth=8")]  # the guiding cells are searched in full


@pytest.mark.slow
def test_the_data_throughput_benchmark_measures_every_path(tmp_path):
    out = tmp_path / "data.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "data_throughput.py"), "--documents", "3000", "--files", "4", "--batches", "1",
               "--resume-rows", "20000", "--steps", "5", "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["paths"]["prepared_tokens_per_s"] > result["paths"]["streaming_tokens_per_s"] > 0
    assert result["paths"]["prepared_vs_memmap"] > 0 and result["check"]["cpu_s_per_gb"] > 0
    # two workers may encode more of the last part: it can start before the parts ahead of it end
    assert result["preparation"]["two_workers"]["tokens_encoded"] >= result["preparation"]["one_worker"]["tokens_encoded"] > 0
    assert set(result["resume"]["order_saved_s"]) == {"0", "1000", "1000000", "100000000"}
    assert "| prepared set's reader, tokens of rows/s per core" in done.stdout


@pytest.mark.slow
def test_the_tracking_benchmark_measures_a_run_and_a_search(tmp_path):
    out = tmp_path / "tracking.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tracking_overhead.py"), "--steps", "20", "--repeats", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [run["width"] for run in result["single_run"]] == [32, 256] and all(run["ratio"] > 0 for run in result["single_run"])
    assert result["search"]["wandb+mlflow"]["trials"] == result["search"]["none"]["trials"] > 10
    assert result["search"]["none"]["tracking_s"] == 0 < result["search"]["wandb+mlflow"]["tracking_s"]
