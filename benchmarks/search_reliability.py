"""Does a search (exploration + confirmation) find what the full grid with seeds says, and at what cost?

A known-answer cell at quickstart sizes (default depth 8: k = 0..4 Post-LN layers). Ground truth: every
k trained to the full budget with 5 seeds; per k its mean ± sd, the set of k statistically tied with the
best (paired t, 95%, over the 5 seeds) and each k's verdict against Pre-LN. Then the quickstart's search
(enumerated exploration with ASHA, then confirmation) is repeated with different sampler and training
seeds. Printed: how often the chosen k is in the tied-best set, how often its verdict against Pre-LN
agrees with the ground truth's, how often it overclaims (says better or worse where the ground truth
does not), and the steps it trained as a fraction of the grid-with-seeds.

    python benchmarks/search_reliability.py [--depth 8] [--seeds 5] [--repeats 5] [--max-seeds N] [--out runs/bench-reliability]

Every search folder is kept, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from blockforge.search.driver import run_search
from blockforge.search.evidence import paired_difference, verdict
from blockforge.search.report import evidence_by_cell

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "searches" / "quickstart.yaml"


def search_file(folder: Path, name: str, **changes) -> Path:
    """The quickstart search with `changes` (top-level keys replaced); its base path made absolute."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["base"] = str((QUICKSTART.parent / data["base"]).resolve())
    data.update(name=name, **changes)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(path: Path, out: Path):
    return run_search(path, out=out, resume=(out / "search.json").exists(), progress_every_s=1e9)


def trained_steps(records) -> int:
    """Steps actually trained: each run folder once, at the furthest step any of its records reached."""
    furthest: dict[str, int] = {}
    for r in records:
        if r.status != "duplicate" and r.run_dir:
            furthest[r.run_dir] = max(furthest.get(r.run_dir, 0), r.steps)
    return sum(furthest.values())


def ground_truth(folder: Path, depth: int, seeds: int, steps: int) -> dict:
    grid = [k / depth for k in range(depth // 2 + 1)]
    path = search_file(folder, "grid", cells={"model.depth": [depth], "train.seed": list(range(seeds))}, scheduler=None, confirm=None,
                       space={"model.layers.mix_ln.alpha": {"grid": grid}}, sampler={"grid": {}}, baselines=[], trials_per_cell=len(grid))
    outcome = run(path, folder / "grid")
    values: dict[int, dict[int, float]] = {}
    for r in outcome.records:
        if r.status == "completed":
            values.setdefault(r.post_ln_layers, {})[r.seed] = r.value
    means = {k: statistics.mean(v.values()) for k, v in values.items()}
    best = min(means, key=means.get)
    tied = sorted(k for k in values if k == best or verdict(paired_difference(values[k], values[best]), "min") == "tied")
    verdicts = {k: "Pre-LN" if k == 0 else verdict(paired_difference(values[k], values[0]), "min") for k in values}
    return {"values": values, "means": means, "sd": {k: statistics.stdev(v.values()) for k, v in values.items()}, "best": best,
            "tied_best": tied, "verdicts": verdicts, "steps": trained_steps(outcome.records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5, help="seeds per k in the ground truth")
    parser.add_argument("--repeats", type=int, default=5, help="searches, each with its own sampler and training seeds")
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--confirm-seeds", type=int, default=2)
    parser.add_argument("--max-seeds", type=int, default=None, help="race the leaders up to this many further seeds")
    parser.add_argument("--out", default="runs/bench-reliability")
    args = parser.parse_args()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    steps = yaml.safe_load(QUICKSTART.read_text())["steps"]

    truth = ground_truth(folder, args.depth, args.seeds, steps)
    print(f"ground truth, depth {args.depth}, {steps} steps, seeds 0..{args.seeds - 1}:")
    for k in sorted(truth["means"]):
        print(f"  k={k}: val_loss {truth['means'][k]:.4f} ± {truth['sd'][k]:.3f}  vs Pre-LN: {truth['verdicts'][k]}")
    print(f"  best k={truth['best']}; tied with the best (paired t, 95%): {truth['tied_best']}; grid steps {truth['steps']}")

    confirm = {"top": args.top, "seeds": args.confirm_seeds, **({"max_seeds": args.max_seeds} if args.max_seeds else {})}
    rows = []
    for r in range(1, args.repeats + 1):
        name = f"search-{r}"
        base_seed = 1000 * r  # training seeds apart from the ground truth's
        data = yaml.safe_load(QUICKSTART.read_text())
        path = search_file(folder, name, cells={"model.depth": [args.depth]}, confirm=confirm,
                           overrides={**data["overrides"], "train.seed": base_seed}, sampler={"tpe": {"seed": r, "startup_trials": 3}},
                           baselines=[{"model.layers.mix_ln.alpha": 0.0}])
        outcome = run(path, folder / name)
        plan_cell = f"depth={args.depth}"
        from blockforge.search.config import load_search

        evidence = evidence_by_cell(load_search(path), outcome.records)[plan_cell]
        chosen = evidence.winner.post_ln_layers
        row = {"repeat": r, "chosen_k": chosen, "n": evidence.winner.n, "verdict": evidence.verdict,
               "truth_verdict": truth["verdicts"][chosen], "in_tied_best": chosen in truth["tied_best"],
               "verdict_agrees": evidence.verdict == truth["verdicts"][chosen], "steps": trained_steps(outcome.records)}
        # a tie where the ground truth (more seeds) separates is a lack of power; a direction it does not support is an error
        row["overclaims"] = evidence.verdict in ("better", "worse") and evidence.verdict != row["truth_verdict"]
        row["fraction"] = row["steps"] / truth["steps"]
        rows.append(row)
        print(json.dumps(row))
    total = sum(r["steps"] for r in rows) / (len(rows) * truth["steps"])
    print("\nrepeat  chosen k  n  verdict  truth's verdict  in tied-best  verdict agrees  overclaims  steps/grid")
    for r in rows:
        print(f"{r['repeat']:6d}  {r['chosen_k']:8d}  {r['n']}  {r['verdict']:7s}  {r['truth_verdict']:15s}  {str(r['in_tied_best']):12s}"
              f"  {str(r['verdict_agrees']):14s}  {str(r['overclaims']):10s}  {r['fraction']:.2f}")
    print(f"chosen k in the tied-best set: {sum(r['in_tied_best'] for r in rows)} of {len(rows)}; verdict agrees: "
          f"{sum(r['verdict_agrees'] for r in rows)} of {len(rows)}; overclaims: {sum(r['overclaims'] for r in rows)} of {len(rows)}; compute {total:.0%} of the grid with {args.seeds} seeds")
    (folder / "summary.json").write_text(json.dumps({"truth": {k: v for k, v in truth.items() if k != "values"}, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
