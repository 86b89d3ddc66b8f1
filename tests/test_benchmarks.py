"""The GPU throughput script runs end to end on tiny configs, so it can run unchanged on a GPU."""

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
