"""Ray Tune's cost per trial, against a ~60-second training run done directly.

The direct run is `Trainer.run()` in this process; the search runs the same recipe (alphas with
different Post-LN counts, the same FLOPs) through `blockforge search` on a local Ray, one trial at a
time. Training-step time, the noisy part that Ray does not touch, is taken out of both sides (each
run records it); what the search spends beyond the direct runs' own set-up, evaluation and
checkpoints, less the once-per-search summary and plots, is Ray's cost per trial: actor start, Tune's
scheduling and reports, the ledger.

    python benchmarks/search_overhead.py [--steps 200] [--trials 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from blockforge.search.config import load_search
from blockforge.search.driver import ensure_ray, run_search
from blockforge.search.ledger import Ledger
from blockforge.search.report import write_reports
from blockforge.train.loop import Trainer

RECIPE = str(Path(__file__).resolve().parent.parent / "recipes" / "llama-tiny-mix.yaml")


def write_search(folder: Path, steps: int, alphas: list[float]) -> Path:
    search = {
        "name": "overhead", "base": RECIPE, "steps": steps,
        "overrides": {"train.eval_every": 50, "train.checkpoint_every": 50},
        "space": {"model.layers.mix_ln.alpha": {"grid": alphas}}, "trials_per_cell": len(alphas),
        "sampler": {"grid": {}}, "resources": {"cpu": 2},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    return path


def step_seconds(run_dir: Path) -> float:
    """Seconds a run spent in training steps (result.json's elapsed: no set-up, evaluation or checkpoints)."""
    return json.loads((run_dir / "result.json").read_text())["elapsed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (about 60 s on two cores by default)")
    parser.add_argument("--trials", type=int, default=2, help="trials in the search, run one after another")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bf-overhead-"))
    alphas = [round(0.125 * (i + 1), 4) for i in range(args.trials)]  # distinct Post-LN counts, the same FLOPs
    path = write_search(folder, args.steps, alphas)
    plan = load_search(path)
    recipe = plan.recipe(plan.trial_overrides({}, {"model.layers.mix_ln.alpha": alphas[0]}))

    import torch

    torch.set_num_threads(2)
    Trainer(recipe, folder / "warm", progress=False)  # corpus, tokenizer and token caches
    start = time.perf_counter()
    Trainer(recipe, folder / "direct", progress=False).run()
    direct = time.perf_counter() - start
    direct_other = direct - step_seconds(folder / "direct")

    ensure_ray(None)  # Ray's own start-up is paid once per session, not per trial: keep it out
    start = time.perf_counter()
    outcome = run_search(path, out=folder / "out", progress_every_s=1e9)
    searched = time.perf_counter() - start
    assert all(r.status == "completed" for r in outcome.records), [r.status for r in outcome.records]
    trial_steps = sum(step_seconds(Path(d)) for d in {r.run_dir for r in outcome.records})
    start = time.perf_counter()
    write_reports(folder / "out", plan, Ledger(folder / "out" / "trials.jsonl"))
    reports = time.perf_counter() - start
    # Training steps are the noisy, Ray-independent part: take them out of both sides. What remains of
    # the search beyond the direct runs' own set-up, evaluation and checkpoints is Ray's (and the
    # search's) cost; the final reports are paid once per search and shown apart.
    per_trial = (searched - trial_steps - reports - args.trials * direct_other) / args.trials
    print(f"direct Trainer.run()                 {direct:7.1f} s  ({direct - direct_other:.1f} s in training steps)")
    print(f"search of {args.trials} trials, one at a time   {searched:7.1f} s  ({trial_steps:.1f} s in training steps)")
    print(f"  summary, CSV and plots (once)      {reports:7.1f} s")
    print(f"Ray cost per trial                   {per_trial:7.1f} s  = {per_trial / direct:.1%} of a {direct:.0f}-second trial")
    print("  (actor start, Tune scheduling and reports, ledger, beyond the direct run's own set-up, evaluation and checkpoints)")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
