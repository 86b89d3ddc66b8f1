"""A real Ray Tune search on one GPU with several trials sharing it (`resources: {gpu: 0.25}`), against one trial alone.

Two searches of the same small llama (alpha over a grid, each point trained to the full budget): first one trial alone
(one grid point, max_concurrent 1), then four trials at once. Per trial: its tokens/s (from its metrics.jsonl, past the
first records). For the GPU, sampled every half second with nvidia-smi while each search runs: its busy fraction, and the
memory in use just after each trial ended (a trial that ends must leave its memory to the next). The figures:
aggregate tokens/s of the shared GPU against one trial alone, and the busy fractions of both.

    python benchmarks/gpu_search.py --json runs/gpu-search.json               # on a CUDA machine (about 5 minutes)
    python benchmarks/gpu_search.py --device cpu --json runs/gpu-search.json  # the same stages on two cores, tiny sizes

benchmarks/gpu_check.sh runs it as its `search` stage; tests/test_benchmarks.py runs the CPU form (slow).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALPHA = "model.layers.mix_ln.alpha"


def search_file(folder: Path, device: str, alphas: list[float], share: float) -> Path:
    """The search: the tiny llama on two cores, a 71M-sized one on a GPU; every alpha trained to the full budget."""
    if device == "cuda":
        base, overrides, steps = str(ROOT / "recipes" / "llama-71m-mix.yaml"), {"train.batch_size": 64, "train.micro_batch_size": 64,
                                                                   "data.source": "builtin", "data.tokenizer": {"bpe": 8192},
                                                                   "data.pack": True, "model.vocab": 8192}, 120
        resources = {"cpu": 1, "gpu": share}
    else:
        base, overrides, steps = str(ROOT / "recipes" / "llama-tiny-mix.yaml"), {"model.width": 64, "model.heads": 2, "model.ffn": 172,
                                                                    "model.context": 64, "train.batch_size": 16}, 60
        resources = {"cpu": 1}
    overrides.update({"train.device": device, "train.eval_every": steps, "train.eval_batches": 2, "train.checkpoint_every": steps,
                      "train.grad_norm_every": 0, "train.log_every": 10})
    search = {"name": "gpu-search", "base": base, "steps": steps, "overrides": overrides, "space": {ALPHA: {"grid": alphas}},
              "sampler": {"grid": {}}, "trials_per_cell": len(alphas), "objective": {"metric": "val_loss", "mode": "min"},
              "divergence": {"max_loss": 20.0}, "resources": resources}
    path = folder / f"gpu-search-{len(alphas)}.yaml"
    path.write_text(yaml.safe_dump(search, sort_keys=False))
    return path


class GpuSampler:
    """nvidia-smi's utilization and memory in use, every half second, with the time (nothing where there is no GPU)."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []  # (time, busy %, memory used MiB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout.strip().splitlines()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                return
            busy, memory = (float(v) for v in out.split(","))
            self.samples.append((time.time(), busy, memory))

    def __enter__(self) -> "GpuSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def busy(self) -> float | None:
        return sum(s[1] for s in self.samples) / len(self.samples) / 100 if self.samples else None

    def memory_after(self, when: float) -> float | None:
        """Memory in use (MiB) at the first sample at least a second after `when`."""
        later = [s for s in self.samples if s[0] >= when + 1.0]
        return later[0][2] if later else None


def trial_rates(folder: Path) -> list[dict]:
    """Each trained run's tokens/s (its train records past step 10) and when it ended (its result.json's time)."""
    out = []
    for run in sorted(folder.glob("trials/*/*")):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rates = [r["tok_per_s"] for r in rows if r.get("event") == "train" and r["step"] > 10 and "tok_per_s" in r]
        if rates:
            out.append({"run": run.name, "tok_per_s": sum(rates) / len(rates), "ended": (run / "result.json").stat().st_mtime})
    return out


def measure(folder: Path, device: str, alphas: list[float], at_once: int, share: float) -> dict:
    import blockforge

    path = search_file(folder, device, alphas, share)
    started = time.perf_counter()
    with GpuSampler() as gpu:
        search = blockforge.run_search(path, out=folder / f"out-{at_once}", max_concurrent=at_once)
    trials = trial_rates(search.folder)
    for trial in trials:
        trial["memory_after_mib"] = gpu.memory_after(trial.pop("ended"))
    return {"at_once": at_once, "seconds": time.perf_counter() - started, "trials": trials,
            "aggregate_tok_per_s": sum(t["tok_per_s"] for t in trials) / max(1, len(trials)) * min(at_once, len(trials)),
            "busy": gpu.busy(), "memory_at_start_mib": gpu.samples[0][2] if gpu.samples else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("DEVICE", "cuda"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    share, at_once = (0.25, 4) if args.device == "cuda" else (0.0, 2)
    with tempfile.TemporaryDirectory() as tmp:
        alone = measure(Path(tmp), args.device, [0.25], 1, share)
        shared = measure(Path(tmp), args.device, [0.0, 0.25, 0.5, 0.75], at_once, share)
    one = alone["trials"][0]["tok_per_s"]
    report = {"device": args.device, "alone": alone, "shared": shared, "aggregate_vs_alone": shared["aggregate_tok_per_s"] / one}
    for what in (alone, shared):
        for trial in what["trials"]:
            print(f"{what['at_once']} at once: {trial['run']}: {trial['tok_per_s']:,.0f} tok/s" +
                  (f", GPU memory in use after it ended {trial['memory_after_mib']:,.0f} MiB" if trial["memory_after_mib"] is not None else ""))
    busy = lambda what: "-" if what["busy"] is None else f"{what['busy']:.0%}"  # noqa: E731
    print(f"one trial alone: {one:,.0f} tok/s, GPU busy {busy(alone)}; {at_once} at once: {shared['aggregate_tok_per_s']:,.0f} tok/s "
          f"together ({report['aggregate_vs_alone']:.2f}x), GPU busy {busy(shared)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
