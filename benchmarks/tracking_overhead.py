"""What experiment tracking costs, as ratios measured in one run: W&B (offline) and MLflow (a local file store).

  1. a single run: a 4-layer llama of width 32 (a step of a few ms) and of width 256 (tens of ms) trained --steps steps
     with its metrics logged every 2 steps (five times as often as the recipes' default), with
     `tracking: {report_to: [wandb, mlflow]}` against none, alternating --repeats times;
     the ratio of the medians of the wall time of the training loop (from the first step to the end, so the
     trackers' start, which happens before the first step, is reported on its own);
  2. a search: the shipped quickstart driven along synthetic curves (no training), with its trackers updated after
     every trial as the driver does, against none: the driver's seconds per trial spent on tracking. Trials log
     nothing themselves, so this is the whole per-trial cost, and it is paid on the driver, not in the trial.

    python benchmarks/tracking_overhead.py                  # about two minutes on two cores
    python benchmarks/tracking_overhead.py --json runs/tracking-overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def offline_trackers(folder: Path) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(folder), WANDB_SILENT="true", MLFLOW_TRACKING_URI=f"file://{folder}/mlruns",
                      MLFLOW_ALLOW_FILE_STORE="true")


def single_run(folder: Path, steps: int, repeats: int, width: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_data import write_recipe

    import blockforge
    from blockforge.train.loop import Trainer

    torch.set_num_threads(1)
    folder.mkdir(parents=True, exist_ok=True)
    path = write_recipe(folder, steps=steps, eval_every=steps // 2, checkpoint_every=0, grad_norm_every=0, log_every=2, batch_size=8,
                        micro_batch_size=8)
    sizes = [("model.width", width), ("model.ffn", 4 * width), ("model.depth", 4)]
    times: dict[str, list[float]] = {"none": [], "wandb+mlflow": []}
    starts = []
    for i in range(repeats):
        for name in times:
            sets = sizes + ([("tracking.report_to", ["wandb", "mlflow"])] if name != "none" else [])
            recipe = blockforge.load_recipe(path, sets)
            begun = time.perf_counter()
            trainer = Trainer(recipe, folder / f"run-{name}-{i}", progress=False)
            ready = time.perf_counter()
            if name != "none":
                starts.append(ready - begun)
            first = {}
            trainer.callbacks.append(lambda t, step: first.setdefault("at", time.perf_counter()))
            trainer.run()
            times[name].append(time.perf_counter() - first["at"])
    base, tracked = statistics.median(times["none"]), statistics.median(times["wandb+mlflow"])
    return {"width": width, "step_ms": round(1000 * base / steps, 2), "steps": steps, "repeats": repeats, "loop_s": {k: [round(v, 3) for v in t] for k, t in times.items()},
            "ratio": round(tracked / base, 4), "tracker_start_s": round(statistics.median(starts), 3)}


def search_driver(folder: Path) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from search.test_api import quickstart

    from blockforge.search.config import load_search
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.records.store import SearchStore
    from blockforge.search.reports.findings import Findings
    from blockforge.search.reports.tracked import SearchTracking
    from blockforge.storage import Storage

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, report_to in (("none", []), ("wandb+mlflow", ["wandb", "mlflow"])):
        plan = load_search(ROOT / "searches" / "quickstart.yaml", [("tracking.report_to", report_to)])
        where = folder / f"search-{name}"
        tracking = SearchTracking.open(plan, SearchStore(Storage.open(where)))
        spent = [0.0]

        def each(handed, tracking=tracking, where=where, spent=spent):
            if tracking is not None:
                begun = time.perf_counter()
                tracking.update(Ledger(where / "trials.jsonl").records())
                spent[0] += time.perf_counter() - begun
            return False

        begun = time.perf_counter()
        quickstart(where, folder / "node", each=each, plan=plan)
        records = Ledger(where / "trials.jsonl").records()
        if tracking is not None:
            started = time.perf_counter()
            tracking.finish(records, Findings.of(plan, records))
            spent[0] += time.perf_counter() - started
        out[name] = {"trials": len(records), "wall_s": round(time.perf_counter() - begun, 3), "tracking_s": round(spent[0], 3),
                     "tracking_s_per_trial": round(spent[0] / len(records), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="blockforge-tracking-") as scratch:
        folder = Path(scratch)
        offline_trackers(folder)
        figures = {"single_run": [single_run(folder / f"single-{w}", args.steps, args.repeats, w) for w in (32, 256)],
                   "search": search_driver(folder / "search")}
    print(json.dumps(figures, indent=1))
    for run in figures["single_run"]:
        print(f"single run, width {run['width']} ({run['step_ms']:.1f} ms a step): {run['steps']} steps, metrics every 2: loop time with "
              f"W&B + MLflow / without = {run['ratio']:.3f} (trackers started in {run['tracker_start_s']:.2f} s before the first step)")
    search = figures["search"]["wandb+mlflow"]
    print(f"search: {search['trials']} trials, the driver spent {search['tracking_s_per_trial'] * 1000:.0f} ms per trial on tracking "
          "(trials log nothing themselves)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
