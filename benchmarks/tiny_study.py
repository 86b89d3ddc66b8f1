"""Tiny CPU study: Pre-LN, Post-LN and Mix-LN tiny llamas on the builtin corpus, several seeds each, analysed.

Trains `recipes/llama-tiny-{pre,post,mix}.yaml` once per seed into RUNS/<variant>-s<seed> (a finished run
is reused), prints validation perplexity as mean ± sample std over seeds, runs the three analyses on
every run with blockforge.analysis.analyze (and gradient norms of the untrained recipes), then
averages each analysis over seeds per variant: printed per layer, drawn as figures in the format
`blockforge analyze` writes.

    python benchmarks/tiny_study.py --runs /tmp/tinystudy/runs --out /tmp/analysis-figures/tiny_study [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np

from blockforge.analysis import analyze, plot
from blockforge.io import atomic_write_json
from blockforge.spec import load_recipe
from blockforge.train.loop import train

VARIANTS = ("pre", "post", "mix")


def trained_runs(runs: Path, seeds: list[int]) -> dict[str, list[Path]]:
    folders = {}
    for variant in VARIANTS:
        for seed in seeds:
            folder = runs / f"{variant}-s{seed}"
            result = folder / "result.json"
            if not (result.exists() and json.loads(result.read_text())["status"] == "completed"):
                print(f"training {folder.name} ...", flush=True)
                train(load_recipe(f"recipes/llama-tiny-{variant}.yaml", [("train.seed", seed)]), folder, resume=folder.exists(), progress=False)
            folders.setdefault(variant, []).append(folder)
    return folders


def mean_std(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.4g} ± {values.std(ddof=1) if len(values) > 1 else 0.0:.2g}"


def variant_of(result: dict) -> str:
    return result["label"].rsplit("-s", 1)[0]


def averaged(record: dict) -> dict:
    """The record with one result per variant, averaged over its seeds (per-seed values kept)."""
    merged = copy.deepcopy(record)
    merged["results"] = []
    for variant in VARIANTS:
        group = [r for r in record["results"] if variant_of(r) == variant]
        if not group:
            continue
        result = {**group[0], "label": f"{variant} ({len(group)} seeds)", "runs": [r["path"] for r in group]}
        name = record["analysis"]
        if name == "grad_norms":
            rows = np.concatenate([r["per_batch"] for r in group])
            result.update(mean=rows.mean(0).tolist(), std=rows.std(0).tolist(), per_batch=rows.tolist())
        elif name == "grad_norms_training":
            result["norms"] = np.mean([r["norms"] for r in group], axis=0).tolist()
        elif name == "angular_distance":
            tables = np.array([[[np.nan if v is None else v for v in row] for row in r["distances"]] for r in group])
            result["distances"] = [[None if np.isnan(v) else v for v in row] for row in tables.mean(0).tolist()]
        elif name == "layer_drop":
            result["change"] = np.mean([r["change"] for r in group], axis=0).tolist()
            result["change_std"] = np.std([r["change"] for r in group], axis=0, ddof=1).tolist()
            result["baseline"] = float(np.mean([r["baseline"] for r in group]))
        merged["results"].append(result)
    return merged


def profile(mean: np.ndarray) -> str:
    slope = np.polyfit(np.arange(len(mean)), np.log(mean), 1)[0]
    return f"slope {slope:+.3f}/layer, cv {mean.std() / mean.mean():.2f}"


def print_per_layer(title: str, record: dict, cell) -> None:
    results = record["results"]
    print(f"\n{title}")
    print("layer " + "".join(f"{r['label']:>24}" for r in results))
    for layer in range(len(results[0]["placements"])):
        print(f"{layer:>5} " + "".join(f"{cell(r, layer):>24}" for r in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="folder of the runs (trained when missing)")
    parser.add_argument("--out", required=True, help="folder for the figures and JSON")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tokens", type=int, default=256 * 1024)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs, out = Path(args.runs), Path(args.out)
    started = time.perf_counter()
    folders = trained_runs(runs, seeds)

    print("validation perplexity after 400 steps (mean ± sample std over seeds)")
    for variant, group in folders.items():
        ppl = [json.loads((f / "result.json").read_text())["metrics"]["val_ppl"] for f in group]
        print(f"  {variant:>5}: {mean_std(ppl)}   (seeds: {', '.join(f'{p:.2f}' for p in ppl)})")

    echo = lambda line: print("  " + line, flush=True)  # noqa: E731
    init = analyze([f"recipes/llama-tiny-{v}.yaml" for v in VARIANTS], out / "init", grad_norms=True, angular=True, echo=echo)
    every = [f for group in folders.values() for f in group]
    records = analyze(every, out / "runs", grad_norms=True, angular=True, layer_drop=True, tokens=args.tokens, echo=echo)
    merged = {name: averaged(record) for name, record in records.items()}
    for name, record in merged.items():
        atomic_write_json(out / "by_variant" / f"{name}.json", record)
        plot(record, out / "by_variant" / f"{name}.png")

    print_per_layer("gradient norm at init (3 seeds x 4 batches)", init["grad_norms"],
                    lambda r, i: f"{r['mean'][i]:.3g} ± {r['std'][i]:.2g}")
    for r in init["grad_norms"]["results"]:
        print(f"  {r['label']}: {profile(np.asarray(r['mean']))}")
    print_per_layer("gradient norm at the trained weights (seeds x 4 batches)", merged["grad_norms"],
                    lambda r, i: f"{r['mean'][i]:.3g} ± {r['std'][i]:.2g}")
    for r in merged["grad_norms"]["results"]:
        print(f"  {r['label']}: {profile(np.asarray(r['mean']))}")
    history = merged["grad_norms_training"]["results"]
    for step in (25, 100, 200, 400):
        if step in history[0]["steps"]:
            index = history[0]["steps"].index(step)
            print_per_layer(f"logged gradient norm at step {step} (mean over seeds)", merged["grad_norms_training"],
                            lambda r, i: f"{r['norms'][index][i]:.3g}")
            for r in history:
                print(f"  {r['label']}: {profile(np.asarray(r['norms'][index]))}")
    print_per_layer("angular distance to the next layer's input d(x_l, x_l+1), trained (mean over seeds)", merged["angular_distance"],
                    lambda r, i: f"{r['distances'][0][i]:.3f}")
    print_per_layer("angular distance at init d(x_l, x_l+1) (seed 0)", init["angular_distance"],
                    lambda r, i: f"{r['distances'][0][i]:.3f}")
    print_per_layer("layer-drop: change in val_loss (mean ± std over seeds)", merged["layer_drop"],
                    lambda r, i: f"{r['change'][i]:+.3g} ± {r['change_std'][i]:.2g}")
    for r in merged["layer_drop"]["results"]:
        print(f"  {r['label']}: full-model val_loss {r['baseline']:.3f}")
    print(f"\ntotal {time.perf_counter() - started:.0f}s; figures and JSON in {out}")


if __name__ == "__main__":
    main()
