"""Does a search (exploration + confirmation) find what the full grid with seeds says, and at what cost?

Known-answer cells at quickstart sizes: a llama at depths 6 and 12 (k = 0..3 and 0..6 Post-LN layers;
depth 6 enumerates its k, depth 12 samples 5 of 7) and the digits vit at depth 6 (k = 0..3). Ground
truth per cell: every k trained to the full budget with --seeds seeds, evaluated often enough to see
the curves; per k its mean ± sd, the set of k tied with the best (paired t, 95%) and each k's verdict
against Pre-LN. From the ground truth's curves, per cell: how well the ranking at each early-stopping
rung agrees with the final one (Kendall tau, pairs that cross, by how much) and what each pruning rule
would have stopped (plain ASHA; the search's guarded rule).

Then the cell's search is repeated with its own sampler and training seeds, at --max-concurrent 1 and
at the default concurrency. Per repeat: whether the ground truth's best-mean k got a full-budget run,
whether the chosen k is in the tied-best set, whether its verdict contradicts the direction the ground
truth supports (or claims a direction where the ground truth has none), and the steps it trained as a
fraction of the grid with seeds.

    python benchmarks/search_reliability.py [--cells llama-d6,llama-d12,vit-d6] [--seeds 5] [--repeats 3]
                                            [--truth-only] [--out runs/bench-reliability]
    python benchmarks/search_reliability.py --quick   # llama-d6 only, 3 seeds, one search: exits 1 if the search
                                                      # contradicts the ground truth or misses its tied-best set
                                                      # (make test-slow runs it; under 10 minutes on two cores)
    python benchmarks/search_reliability.py --multi   # a grid of cells (llama depths 4, 6, 8, 12, 16): the search with
                                                      # law-guided cells against the same search unguided, each repeated
                                                      # with every truth seed as its base seed, replayed from the grid

Multi-cell mode: the ground truth of every cell (every k, --seeds seeds, cached like any search folder) is computed
once; then each search is driven the way Tune drives it (searcher, no Ray) with every trial's curve taken from the
ground truth's run of the same k and seed, so a repeat costs seconds and both searches see exactly the same training.
Per cell and repeat: the chosen k (in the tied-best set?), the verdict against the ground truth's, overclaims, and the
compute (steps times FLOPs per step) as a share of the grid with all seeds; and the total across cells.

Every search folder is kept, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
from pathlib import Path

import yaml

from blockforge.search.evidence.evidence import evidence_by_cell, paired_difference, verdict
from blockforge.search.evidence.rungs import curve_of, kendall_tau
from blockforge.search.run.driver import run_search
from blockforge.spec.resolve import mix_ln_count

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "searches" / "quickstart.yaml"
ALPHA = "model.layers.mix_ln.alpha"


def llama(depth: int) -> dict:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["base"] = str((QUICKSTART.parent / data["base"]).resolve())
    data.update(cells={"model.depth": [depth]}, baselines=[{ALPHA: 0.0}])
    return data


def vit(depth: int) -> dict:
    """The digits vit at quickstart-like cost: 300 steps, alpha over [0, 0.5], ASHA after 100 steps."""
    return {
        "base": str((ROOT / "recipes" / "vit-digits-mix.yaml").resolve()), "steps": 300,
        "overrides": {"train.eval_batches": 8, "train.checkpoint_every": 100, "train.eval_every": 100},
        "cells": {"model.depth": [depth]}, "space": {ALPHA: {"uniform": [0.0, 0.5]}}, "baselines": [{ALPHA: 0.0}],
        "trials_per_cell": 5, "confirm": {"top": 2, "seeds": 2}, "objective": {"metric": "val_loss", "mode": "min"},
        "scheduler": {"asha": {"grace_steps": 100, "reduction_factor": 3}}, "sampler": {"tpe": {"seed": 0, "startup_trials": 3}},
        "divergence": {"max_loss": 20.0}, "resources": {"cpu": 1, "gpu": 0},
    }


CELLS = {"llama-d6": (llama, 6, 25), "llama-d12": (llama, 12, 25), "vit-d6": (vit, 6, 50),  # template, depth, truth's eval_every
         "llama-d4": (llama, 4, 25), "llama-d8": (llama, 8, 25), "llama-d16": (llama, 16, 25), "llama-d24": (llama, 24, 25)}


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**data, "name": name}, sort_keys=False))
    return path


def run(path: Path, out: Path, max_concurrent: int | None = None):
    return run_search(path, out=out, resume=(out / "search.json").exists(), max_concurrent=max_concurrent, progress_every_s=1e9)


def trained_steps(records) -> int:
    """Steps actually trained: each run folder once, at the furthest step any of its records reached."""
    furthest: dict[str, int] = {}
    for r in records:
        if r.status != "duplicate" and r.run_dir:
            furthest[r.run_dir] = max(furthest.get(r.run_dir, 0), r.steps)
    return sum(furthest.values())


def ground_truth(folder: Path, template: dict, depth: int, seeds: int, eval_every: int) -> dict:
    ks = list(range(mix_ln_count(0.5, depth) + 1))
    data = copy.deepcopy(template)
    data.update(cells={"model.depth": [depth], "train.seed": list(range(seeds))}, scheduler=None, confirm=None, baselines=[],
                space={ALPHA: {"grid": [k / depth for k in ks]}}, sampler={"grid": {}}, trials_per_cell=len(ks))
    data["overrides"] = {**data.get("overrides", {}), "train.eval_every": eval_every}
    outcome = run(write(folder, "grid", data), folder / "grid")
    values: dict[int, dict[int, float]] = {}
    curves: dict[int, dict[int, dict[int, float]]] = {}
    for r in outcome.records:
        if r.status == "completed":
            values.setdefault(r.post_ln_layers, {})[r.seed] = r.value
            curves.setdefault(r.post_ln_layers, {})[r.seed] = curve_of(Path(r.run_dir), "val_loss")
    return {**truth_of(values, curves), "steps": trained_steps(outcome.records)}


def truth_of(values: dict[int, dict[int, float]], curves: dict[int, dict[int, dict[int, float]]]) -> dict:
    """What the grid says, from every k's value per seed (k -> seed -> value) and curves: per k its mean and sd, the best
    mean, the k tied with it (paired t, 95%), and each k's verdict and mean difference against Pre-LN (k = 0)."""
    means = {k: statistics.mean(v.values()) for k, v in values.items()}
    best = min(means, key=means.get)
    tied = sorted(k for k in values if k == best or verdict(paired_difference(values[k], values[best]), "min") == "tied")
    verdicts = {k: "Pre-LN" if k == 0 else verdict(paired_difference(values[k], values[0]), "min") for k in values}
    to_pre = {k: paired_difference(values[k], values[0]).mean for k in values if k != 0}
    return {"values": values, "curves": curves, "means": means, "sd": {k: statistics.stdev(v.values()) for k, v in values.items()},
            "best": best, "tied_best": tied, "verdicts": verdicts, "to_pre": to_pre}


def rung_agreement(truth: dict, rungs: list[int]) -> list[dict]:
    """Per rung step: Kendall tau of the ranking there against the final one (mean over seeds), and the pairs that cross."""
    rows = []
    seeds = sorted(set.intersection(*(set(v) for v in truth["curves"].values())))
    for step in rungs:
        taus, crossings, pairs = [], [], 0
        for seed in seeds:
            at = {k: truth["curves"][k][seed][step] for k in truth["curves"] if step in truth["curves"][k][seed]}
            final = {k: truth["values"][k][seed] for k in at}
            taus.append(kendall_tau([at[k] for k in sorted(at)], [final[k] for k in sorted(at)]))
            for a, b in itertools.combinations(sorted(at), 2):
                pairs += 1
                if (at[a] - at[b]) * (final[a] - final[b]) < 0:
                    crossings.append(abs(at[a] - at[b]))
        rows.append({"step": step, "tau": statistics.mean(taus), "pairs": pairs, "crossing": len(crossings),
                     "largest_crossing_margin": max(crossings, default=0.0)})
    return rows


def plain_asha_at(truth: dict, rung: int, reduction_factor: float) -> dict:
    """What ASHA without a guard would stop at `rung` if every k reached it together, seed by seed: how often the
    ground truth's best-mean k is among those stopped."""
    seeds = sorted(set.intersection(*(set(v) for v in truth["curves"].values())))
    stopped_best = 0
    for seed in seeds:
        at = sorted((truth["curves"][k][seed].get(rung, float("inf")), k) for k in truth["curves"])
        keep = max(1, round(len(at) / reduction_factor))
        stopped_best += truth["best"] in {k for _, k in at[keep:]}
    return {"rung": rung, "seeds": len(seeds), "best_stopped": stopped_best}


MULTI = ["llama-d4", "llama-d6", "llama-d8", "llama-d12", "llama-d16", "llama-d24"]


def multi_search(guided: bool, top: int, cells: list[str], after: int = 3) -> dict:
    """The searched grid: quickstart's settings over every depth of MULTI, each cell enumerating its k (no ASHA: its rungs
    cannot be trusted on these curves), confirming its best (`top`) and Pre-LN with 2 more seeds; with the first three cells
    guiding."""
    data = llama(4)
    data.update(cells={"model.depth": [CELLS[c][1] for c in cells]}, trials_per_cell=13, scheduler=None, baselines=[{ALPHA: 0.0}],
                confirm={"top": top, "seeds": 2})
    if guided:
        data["guide"] = {"after": after}
    return data


def replay(path: Path, out: Path, truths: dict[int, dict], base: int, seeds: int):
    """Drive the search in `path` along the ground truth: a trial of k Post-LN layers at depth L with seed s gets the curve
    of the truth's run of that k at L with truth seed (s - base + rotation) mod seeds; returns (plan, records)."""
    import shutil

    from blockforge.search.config import load_search
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.run.searcher import CellSearcher

    sys_path = str(ROOT / "tests")
    import sys

    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from search.conftest import drive_curves  # noqa: E402  (the tests' driver: Tune's calls, one trial at a time)

    class Fifo:  # no early stopping (the searches replayed here have no scheduler)
        def on_trial_result(self, *args) -> str:
            return "CONTINUE"

        def on_trial_complete(self, *args) -> None:
            pass

    plan = load_search(path)
    shutil.rmtree(out, ignore_errors=True)

    def curve(config):
        recipe = plan.recipe([tuple(p) for p in config["overrides"]])
        truth = truths[recipe.spec.depth]
        seed = (recipe.train.seed - plan.settings[config["cell"]].base_seed + base) % seeds
        return dict(truth["curves"][recipe.spec.post_ln_count()][seed])

    drive_curves(CellSearcher(plan, out), Fifo(), curve, limit=10000)
    return plan, Ledger(out / "trials.jsonl").records()


def multi_rows(name: str, plan, records, truths: dict[int, dict], seeds: int, base: int) -> list[dict]:
    """Per cell of one replayed search: the chosen k against the ground truth, its verdict, and its compute."""
    from blockforge.search.reports.plan import cell_plan

    evidence = evidence_by_cell(plan, records)
    rows = []
    for cell in plan.cell_names():
        truth = truths[plan.settings[cell].depth]
        per_step = cell_plan(plan, cell).trial_flops / plan.settings[cell].steps
        spent = trained_steps([r for r in records if r.cell == cell]) * per_step
        grid = len(truth["values"]) * seeds * plan.settings[cell].steps * per_step
        e = evidence[cell]
        chosen = e.winner.post_ln_layers
        diff = e.vs_reference.mean if e.vs_reference else 0.0
        truth_diff = truth["to_pre"].get(chosen, 0.0)
        rows.append({"search": name, "base_seed": base, "cell": cell, "chosen_k": chosen, "tied_best": truth["tied_best"],
                     "in_tied_best": chosen in truth["tied_best"], "verdict": e.verdict, "truth_verdict": truth["verdicts"][chosen],
                     "contradicts": e.verdict in ("better", "worse") and diff * truth_diff < 0,
                     "overclaims": e.verdict in ("better", "worse") and truth["verdicts"][chosen] == "tied",
                     "explored_k": sorted({r.post_ln_layers for r in records if r.cell == cell and r.stage == "explore"
                                           and r.status == "completed"}),
                     "flops": spent, "grid_flops": grid})
    return rows


def multi_replays(out: Path, cells: list[str], truths: dict[int, dict], seeds: int, top: int) -> list[dict]:
    """Both searches (unguided, guided) replayed once per truth seed as base seed: the rows of multi_rows."""
    rows = []
    for guided in (False, True):
        name = "guided" if guided else "unguided"
        path = write(out, f"multi-{name}-top{top}-{len(cells)}", multi_search(guided, top, cells))
        for base in range(seeds):
            plan, records = replay(path, out / f"replay-{name}-top{top}-{len(cells)}-{base}", truths, base, seeds)
            rows += multi_rows(name, plan, records, truths, seeds, base)
    return rows


def multi(args) -> None:
    truths = {}
    cells = args.cells.split(",") if args.cells != ",".join(CELLS) else MULTI
    for cell in cells:
        make, depth, eval_every = CELLS[cell]
        folder = Path(args.out) / cell
        folder.mkdir(parents=True, exist_ok=True)
        truths[depth] = ground_truth(folder, make(depth), depth, args.seeds, eval_every)
    rows = multi_replays(Path(args.out), cells, truths, args.seeds, args.top)
    grid_flops = sum(r["grid_flops"] for r in rows if r["search"] == "unguided" and r["base_seed"] == 0)
    print(f"\nmulti-cell reliability: {len(cells)} cells, ground truth every k x {args.seeds} seeds; each search repeated with every truth seed as base")
    print("search    cell       chosen k (tied-best)        verdict (truth's)     overclaims  contradicts  compute / cell's grid")
    for r in rows:
        print(f"{r['search']:9s} {r['cell']:10s} {str(r['chosen_k']) + ' ' + str(r['tied_best']):26s} {r['verdict'] + ' (' + r['truth_verdict'] + ')':21s} "
              f"{str(r['overclaims']):11s} {str(r['contradicts']):12s} {r['flops'] / r['grid_flops']:.0%}  explored {r['explored_k']}")
    for name in ("unguided", "guided"):
        mine = [r for r in rows if r["search"] == name]
        repeats = args.seeds
        total = sum(r["flops"] for r in mine) / repeats
        print(f"{name}: chosen k in the tied-best set {sum(r['in_tied_best'] for r in mine)}/{len(mine)}, contradictions "
              f"{sum(r['contradicts'] for r in mine)}, overclaims {sum(r['overclaims'] for r in mine)}; compute {total / grid_flops:.1%} of the "
              f"{args.seeds}-seed grid in total (mean over {repeats} repeats; per cell: "
              + ", ".join(f"{c} {statistics.mean(r['flops'] / r['grid_flops'] for r in mine if r['cell'] == c):.0%}" for c in dict.fromkeys(r['cell'] for r in mine)) + ")")
    (Path(args.out) / "multi.json").write_text(json.dumps(rows, indent=1, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--seeds", type=int, default=5, help="seeds per k in the ground truth")
    parser.add_argument("--repeats", type=int, default=3, help="searches per cell and concurrency, each with its own seeds")
    parser.add_argument("--truth-only", action="store_true")
    parser.add_argument("--out", default="runs/bench-reliability")
    parser.add_argument("--quick", action="store_true", help="one known-answer cell (llama-d6), 3 seeds, one search; exit 1 when it fails")
    parser.add_argument("--multi", action="store_true", help="the multi-cell grid: guided against unguided, replayed from the ground truth")
    parser.add_argument("--top", type=int, default=2, help="--multi: the finalists each cell confirms (confirm.top)")
    args = parser.parse_args()
    if args.multi:
        multi(args)
        return
    if args.quick:
        args.cells, args.seeds, args.repeats = "llama-d6", 3, 1
    report = {}
    for cell in args.cells.split(","):
        make, depth, eval_every = CELLS[cell]
        template = make(depth)
        folder = Path(args.out) / cell
        folder.mkdir(parents=True, exist_ok=True)
        truth = ground_truth(folder, template, depth, args.seeds, eval_every)
        steps = template["steps"]
        grace = template["scheduler"]["asha"]["grace_steps"]
        rungs = [s for s in range(eval_every, steps, eval_every)]
        agreement = rung_agreement(truth, rungs)
        print(f"\n{cell}: ground truth, {steps} steps, seeds 0..{args.seeds - 1}")
        for k in sorted(truth["means"]):
            print(f"  k={k}: val_loss {truth['means'][k]:.4f} ± {truth['sd'][k]:.3f}  vs Pre-LN: {truth['verdicts'][k]}")
        print(f"  best k={truth['best']}; tied with the best: {truth['tied_best']}; grid steps {truth['steps']}")
        for row in agreement:
            print(f"  step {row['step']:4d}{' (ASHA rung)' if row['step'] == grace else ''}: Kendall tau vs final {row['tau']:+.2f}; "
                  f"{row['crossing']} of {row['pairs']} pairs cross, the largest margin {row['largest_crossing_margin']:.3f}")
        plain = plain_asha_at(truth, grace, template["scheduler"]["asha"]["reduction_factor"])
        print(f"  ASHA without a guard at step {grace}, all k compared: it would stop the best-mean k={truth['best']} on "
              f"{plain['best_stopped']} of {plain['seeds']} seeds")
        entry = {"truth": {k: v for k, v in truth.items() if k not in ("values", "curves")}, "agreement": agreement, "plain_asha": plain,
                 "repeats": []}
        report[cell] = entry
        if args.truth_only:
            continue
        for concurrency, r in itertools.product((None,) if args.quick else (1, None), range(1, args.repeats + 1)):
            name = f"search-{r}-mc{concurrency or 'default'}"
            data = copy.deepcopy(template)
            data["overrides"] = {**data.get("overrides", {}), "train.seed": 1000 * r + (0 if concurrency == 1 else 500)}
            data["sampler"] = {"tpe": {"seed": r + (0 if concurrency == 1 else 100), "startup_trials": 3}}
            path = write(folder, name, data)
            outcome = run(path, folder / name, max_concurrent=concurrency)
            from blockforge.search.config import load_search

            evidence = evidence_by_cell(load_search(path), outcome.records)[f"depth={depth}"]
            chosen = evidence.winner.post_ln_layers
            full = {rec.post_ln_layers for rec in outcome.records if rec.status == "completed"}
            diff = evidence.vs_reference.mean if evidence.vs_reference else 0.0
            truth_diff = truth["to_pre"].get(chosen, 0.0)
            row = {"repeat": r, "concurrency": concurrency or "default", "chosen_k": chosen, "n": evidence.winner.n,
                   "verdict": evidence.verdict, "truth_verdict": truth["verdicts"][chosen], "best_k_trained": truth["best"] in full,
                   "in_tied_best": chosen in truth["tied_best"], "steps": trained_steps(outcome.records),
                   # a verdict whose direction the ground truth's mean difference opposes is an error; a direction
                   # where the ground truth (more seeds) finds none is an overclaim; a tie where it separates is power
                   "contradicts": evidence.verdict in ("better", "worse") and diff * truth_diff < 0,
                   "overclaims": evidence.verdict in ("better", "worse") and truth["verdicts"][chosen] == "tied"}
            row["fraction"] = row["steps"] / truth["steps"]
            entry["repeats"].append(row)
            print(json.dumps(row))
        rows = entry["repeats"]
        print(f"\n{cell}: repeat  concurrency  chosen k  n  verdict  truth's  best k full  in tied-best  contradicts  overclaims  steps/grid")
        for row in rows:
            print(f"        {row['repeat']:6d}  {str(row['concurrency']):11s}  {row['chosen_k']:8d}  {row['n']}  {row['verdict']:7s}  "
                  f"{row['truth_verdict']:7s}  {str(row['best_k_trained']):11s}  {str(row['in_tied_best']):12s}  {str(row['contradicts']):11s}  "
                  f"{str(row['overclaims']):10s}  {row['fraction']:.2f}")
        print(f"{cell}: best k trained in {sum(r['best_k_trained'] for r in rows)}/{len(rows)}, chosen k tied-best in "
              f"{sum(r['in_tied_best'] for r in rows)}/{len(rows)}, contradictions {sum(r['contradicts'] for r in rows)}, overclaims "
              f"{sum(r['overclaims'] for r in rows)}, compute {statistics.mean(r['fraction'] for r in rows):.0%} of the grid with {args.seeds} seeds")
    (Path(args.out) / "summary.json").write_text(json.dumps(report, indent=2, default=str))
    if args.quick:
        rows = [row for entry in report.values() for row in entry["repeats"]]
        failed = [row for row in rows if row["contradicts"] or not row["in_tied_best"] or not row["best_k_trained"]]
        print(f"quick check: {len(rows) - len(failed)} of {len(rows)} searches found the known answer")
        raise SystemExit(1 if failed or not rows else 0)


if __name__ == "__main__":
    main()
