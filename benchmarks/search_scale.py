"""The search driver at cluster scale, without a cluster: blockforge's own cost per trial, reports and memory.

The real CellSearcher and CellScheduler are driven the way Tune drives them (suggest, a result at every
evaluation, completion), one trial after another, along synthetic curves of known answer (the best k is 20% of
the depth, the best learning rate 3e-3; each seed shifts every model alike; Post-LN layers start slower), with
the live view's throttled updates. No Ray and no training: what is timed is the driver's own work. The time
spent inside the Optuna samplers is measured apart (wrapped), so the table separates blockforge's share from the
sampler's, whose TPE costs O(trials in its study) per ask by design.

Runs (each in a process of its own, so its peak memory is its own):
  growth    1 cell x 100 and 1 cell x 1,000 trials, random sampler
  large     1 cell x 10,000 trials, random sampler
  cells     50 cells x 200 trials, TPE

    python benchmarks/search_scale.py            # all runs (about 25 minutes on two cores)
    python benchmarks/search_scale.py --quick    # 100 and 1,000 trials only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

RECIPE = str(Path(__file__).resolve().parent.parent / "recipes" / "llama-tiny-mix.yaml")


def write_search(folder: Path, cells: int, trials: int, sampler: str) -> Path:
    grid = {"model.depth": [8 + 2 * i for i in range(10)], "model.width": [64 + 32 * i for i in range(cells // 10)]}
    search = {
        "name": "scale", "base": RECIPE, "steps": 150,
        "overrides": {"train.eval_every": 25, "train.checkpoint_every": 150, "model.heads": None, "model.head_dim": 32,
                      "model.ffn": None, "model.ffn_mult": 2.6875, "model.ffn_multiple_of": 4},
        "cells": grid if cells > 1 else {"model.depth": [12]},  # 50 cells: 10 depths x 5 widths
        "space": {"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.5]}, "train.lr": {"loguniform": [1.0e-3, 1.0e-2]}},
        "baselines": [{"model.layers.mix_ln.alpha": 0.0, "train.lr": 3.0e-3}],
        "trials_per_cell": trials, "confirm": {"top": 2, "seeds": 2},
        "scheduler": {"asha": {"grace_steps": 50, "reduction_factor": 3}},
        "sampler": {"tpe": {"seed": 0, "startup_trials": 10}} if sampler == "tpe" else {"random": {"seed": 0}},
        "divergence": {"max_loss": 20.0}, "resources": {"cpu": 1},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    return path


def _unit(*parts) -> random.Random:
    return random.Random(int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16))


def curve(config: dict, depth: int) -> dict[int, float]:
    overrides = dict(config["overrides"])
    alpha, lr, seed = overrides.get("model.layers.mix_ln.alpha") or 0.0, overrides["train.lr"], overrides["train.seed"]
    k = int(math.floor(alpha * depth + 1e-9))
    final = (5.9 + 0.03 * (k - round(0.2 * depth)) ** 2 + 0.15 * math.log(lr / 3e-3) ** 2
             + _unit("seed", config["cell"], seed).gauss(0, 0.04) + _unit("own", config["identity"]).gauss(0, 0.02))
    return {step: final + 1.6 * math.exp(-3.0 * step / 150 / (1.0 + 0.15 * k)) for step in range(25, 151, 25)}


class Timed:
    """Wraps a sampler's methods and adds the seconds spent in them to `clock['sampler']`."""

    def __init__(self, inner, clock: dict):
        self.inner, self.clock = inner, clock

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.clock["sampler"] += time.perf_counter() - started

        return call


def run(cells: int, trials: int, sampler: str) -> dict:
    from ray.tune.search import Searcher

    from blockforge.search.config import OBJECTIVE, load_search, trial_dir
    from blockforge.search.reports.live import ProgressView
    from blockforge.search.reports.report import write_reports
    from blockforge.search.run.scheduler import CellScheduler
    from blockforge.search.run.searcher import CellSearcher

    folder = Path(tempfile.mkdtemp(prefix="bf-scale-"))
    plan = load_search(write_search(folder, cells, trials, sampler))
    search_dir = folder / "out"
    clock = {"sampler": 0.0}
    searcher, scheduler = CellSearcher(plan, str(search_dir)), CellScheduler(plan, str(search_dir))
    for cell in searcher.cells.values():
        explore = cell.stages[0]
        explore.sampler = Timed(explore.sampler, clock)
    view = ProgressView(searcher.ledger, plan, every_s=10.0, scheduler=scheduler)

    class Trial:
        def __init__(self, trial_id, config):
            self.trial_id, self.config = trial_id, config

    marks, driver, handed, idle = [], 0.0, 0, 0  # marks: (trials handed out, driver seconds, sampler seconds)
    started_all = time.perf_counter()
    while True:
        trial_id = f"t{handed}-{idle}"
        t0 = time.perf_counter()
        config = searcher.suggest(trial_id)
        driver += time.perf_counter() - t0
        if config == Searcher.FINISHED:
            break
        if config is None:
            idle += 1
            time.sleep(0.001)
            continue
        handed += 1
        run_dir = trial_dir(search_dir, config["cell"], config["identity"])
        run_dir.mkdir(parents=True, exist_ok=True)
        result, stop = {}, False
        lines = []
        for step, value in curve(config, plan.settings[config["cell"]].depth).items():  # the trial's own work: not timed
            lines.append(json.dumps({"step": step, "event": "eval", "val_loss": value}))
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(lines[-1] + "\n")
            result = {OBJECTIVE: value, "val_loss": value, "step": step}
            t0 = time.perf_counter()
            searcher.on_trial_result(trial_id, result)
            stop = scheduler.on_trial_result(None, Trial(trial_id, config), result) == "STOP"
            driver += time.perf_counter() - t0
            if stop:
                break
        t0 = time.perf_counter()
        if not stop:
            scheduler.on_trial_complete(None, Trial(trial_id, config), result)
        searcher.on_trial_complete(trial_id, result)
        view.update(journal=True)
        driver += time.perf_counter() - t0
        marks.append((handed, driver, clock["sampler"]))
    total_wall = time.perf_counter() - started_all
    driving_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    write_reports(search_dir, plan, searcher.ledger)
    reports = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def per_trial(first: int, last: int) -> tuple[float, float]:
        (n0, d0, s0), (n1, d1, s1) = marks[first], marks[last]
        return ((d1 - d0) - (s1 - s0)) / (n1 - n0), (s1 - s0) / (n1 - n0)

    explored = min(cells * trials, len(marks) - 1)  # exploration: the trials the sampler asked for
    window = max(1, explored // 10)  # the last tenth of exploration, against the whole of it
    whole = per_trial(0, explored)
    late = per_trial(explored - window, explored)
    return {"cells": cells, "trials": trials, "sampler": sampler, "handed": handed, "mean_ms": 1e3 * whole[0], "late_ms": 1e3 * late[0],
            "sampler_mean_ms": 1e3 * whole[1], "sampler_late_ms": 1e3 * late[1], "window": window, "driver_s": driver, "wall_s": total_wall,
            "reports_s": reports, "peak_mib": peak / 2**20, "driving_peak_mib": driving_peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the growth runs only (100 and 1,000 trials)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # cells,trials,sampler: run one in this process
    args = parser.parse_args()
    if args.one:
        cells, trials, sampler = args.one.split(",")
        print(json.dumps(run(int(cells), int(trials), sampler)))
        return
    runs = [(1, 100, "random"), (1, 1000, "random")] + ([] if args.quick else [(1, 10000, "random"), (50, 200, "tpe")])
    rows = []
    for cells, trials, sampler in runs:
        done = subprocess.run([sys.executable, __file__, "--one", f"{cells},{trials},{sampler}"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['cells']} x {r['trials']} ({r['sampler']}): {r['handed']} trials handed out; blockforge's own driver time per trial "
              f"{r['mean_ms']:.2f} ms over the exploration, {r['late_ms']:.2f} ms over its last {r['window']} trials (the sampler's "
              f"{r['sampler_mean_ms']:.2f} and {r['sampler_late_ms']:.2f} ms apart); reports {r['reports_s']:.1f} s; peak memory "
              f"{r['peak_mib']:.0f} MiB ({r['driving_peak_mib']:.0f} before the reports)", flush=True)
    base = rows[0]["mean_ms"]  # the 100-trial search's cost per trial
    print("\n| run | trials | blockforge ms/trial (all; last tenth) | vs 100 trials | sampler ms/trial (all; last tenth) | reports s | peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cells']} cell(s) x {r['trials']}, {r['sampler']} | {r['handed']} | {r['mean_ms']:.2f}; {r['late_ms']:.2f} | "
              f"{r['late_ms'] / base:.2f}x | {r['sampler_mean_ms']:.2f}; {r['sampler_late_ms']:.2f} | {r['reports_s']:.1f} | {r['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
