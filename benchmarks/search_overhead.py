"""Ray Tune's cost per trial: one ~60-second training run directly, and as a one-trial search.

The direct run is `Trainer.run()` in this process; the search runs the same recipe through
`blockforge search` on a local Ray (actor start, imports, reports at every evaluation, checkpoints).
Printed: both wall times, the trial's own time as Tune measured it, and the overhead ratios.

    python benchmarks/search_overhead.py [--steps 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from blockforge.search.config import load_search
from blockforge.search.driver import ensure_ray, run_search
from blockforge.train.loop import Trainer

RECIPE = str(Path(__file__).resolve().parent.parent / "recipes" / "llama-tiny-mix.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (about 60 s on two cores by default)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bf-overhead-"))
    search = {
        "name": "overhead", "base": RECIPE, "steps": args.steps,
        "overrides": {"train.eval_every": 50, "train.checkpoint_every": 50},
        "space": {"model.layers.mix_ln.alpha": {"choice": [0.25]}}, "trials_per_cell": 1,
        "sampler": {"random": {"seed": 0}}, "resources": {"cpu": 2},
    }
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    plan = load_search(path)
    recipe = plan.recipe(plan.trial_overrides({}, {"model.layers.mix_ln.alpha": 0.25}))

    import torch

    torch.set_num_threads(2)
    Trainer(recipe, folder / "warm", progress=False)  # corpus, tokenizer and token caches
    start = time.perf_counter()
    Trainer(recipe, folder / "direct", progress=False).run()
    direct = time.perf_counter() - start

    ensure_ray(None, plan)  # Ray's own start-up is paid once per search, not per trial: keep it out
    start = time.perf_counter()
    outcome = run_search(path, out=folder / "search", progress_every_s=1e9)
    searched = time.perf_counter() - start
    import json

    tune_results = sorted((folder / "search" / "tune").glob("*/result.json"))
    trial_time = json.loads(tune_results[0].read_text().splitlines()[-1])["time_total_s"]
    assert outcome.records[0].status == "completed"
    print(f"direct Trainer.run()            {direct:7.1f} s")
    print(f"trial time inside Tune          {trial_time:7.1f} s  (overhead {trial_time / direct - 1:+.1%})")
    print(f"whole one-trial search          {searched:7.1f} s  (overhead {searched / direct - 1:+.1%}, incl. actor start and reports)")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
