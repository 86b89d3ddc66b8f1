"""The tiny recipes of each per-layer knob against Pre-LN: one run each on the built-in corpus (or digits).

    python benchmarks/knob_recipes.py [--runs runs/knob-recipes] [--seed 0]

Prints val_ppl (llama) or val_acc (vit) per recipe, its ratio to the Pre-LN recipe's, the unigram
baseline and the wall time; finished runs are reused, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from blockforge.spec import load_recipe
from blockforge.train.loop import Trainer

LLAMA = ["pre", "lns", "dyt", "hybridnorm", "gqa", "local-global", "mix"]
VIT = ["pre", "layerscale", "mix"]


def run(recipe_file: str, folder: Path, seed: int) -> tuple[dict, float, dict]:
    if (folder / "result.json").exists():
        result = json.loads((folder / "result.json").read_text())
        return result["metrics"] or {}, result.get("elapsed", float("nan")), json.loads((folder / "data.json").read_text())
    started = time.perf_counter()
    resume = (folder / "checkpoints").exists()
    trainer = Trainer(load_recipe(recipe_file, [("train.seed", seed)]), folder, resume=resume, progress=False)
    result = trainer.run()
    return result.metrics or {}, time.perf_counter() - started, trainer.data_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/knob-recipes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = Path(args.runs)
    rows = []
    for family, names, metric in (("llama-tiny", LLAMA, "val_ppl"), ("vit-digits", VIT, "val_acc")):
        reference = None
        for name in names:
            metrics, seconds, data = run(f"recipes/{family}-{name}.yaml", runs / f"{family}-{name}", args.seed)
            value = metrics.get(metric, float("nan"))
            reference = value if name == "pre" else reference
            rows.append((f"{family}-{name}", metric, value, value / reference, data.get("unigram_val_ppl"), seconds))
            print(f"{family}-{name:13s} {metric} {value:8.3f}  vs pre {value / reference:6.3f}  ({seconds:.0f} s)", flush=True)
    (runs / "summary.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
