"""What healthy, slow and unstable runs look like at the sizes this project trains on CPUs: the measurements the stability
rules' thresholds (blockforge/train/stability.py RULE) are chosen from.

The quickstart's llama (width 64, context 64, batch 16, 150 steps, the built-in corpus) at depths 4, 8 and 12, Pre-LN,
Post-LN and Mix-LN (alpha 0.25), trained over learning rates 3e-3 * 2**j (j = -3 ... 6: 3.75e-4 to 0.192, the curve's
coarse grid around the quickstart's rate), warm-up 10%, two seeds. Every step's training loss is taken from the loop; each
run's final validation loss is measured on the first 4 and on the first 8 validation batches, each beside the count
model's loss on exactly those tokens (train/stability.count_baseline), and the whole split's unigram baseline is kept too.

The summary judges every model and seed's sweep by train/stability.judge_sweep, on 4 and on 8 batches, and shows:
- what each run learnt as a fraction of the most a lower learning rate of its sweep learnt (collapsed runs against the
  rest: where `collapse` sits), and the runs that learnt under `learnt` nats;
- how far two seeds' final losses lie apart at the same model and learning rate (`noise`);
- each sweep's edge (largest stable learning rate) on 4 and on 8 batches, and every run whose state differs between them;
- what the old absolute rule (0.15 nats below the whole split's baseline) called the same runs.

    python benchmarks/stability_thresholds.py                  # about 40 minutes on two cores
    python benchmarks/stability_thresholds.py --quick          # depth 4, Pre-LN and Mix-LN, one seed (about 4 minutes)
    python benchmarks/stability_thresholds.py --json runs/stability-thresholds.json
    python benchmarks/stability_thresholds.py --from-json runs/stability-thresholds.json   # judge saved runs by today's rules
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LRS = [3e-3 * 2.0**j for j in range(-3, 7)]
WARMUP = 0.1
OLD_LEARNT = 0.15  # the absolute rule this replaced: unstable when the final loss lay less than this below the whole split's baseline


def run(folder: Path, depth: int, alpha: float, lr: float, seed: int, steps: int) -> dict:
    import blockforge
    from blockforge.train.loop import Trainer
    from blockforge.train.stability import count_baseline
    from blockforge.train.task import evaluate

    sets = [("model.width", 64), ("model.heads", 2), ("model.ffn", 172), ("model.context", 64), ("model.depth", depth),
            ("model.layers.mix_ln.alpha", alpha), ("train.batch_size", 16), ("train.lr", lr), ("train.warmup", WARMUP),
            ("train.steps", steps), ("train.seed", seed), ("train.eval_batches", 8), ("train.checkpoint_every", 0),
            ("train.grad_norm_every", 0), ("train.divergence.max_loss", 20.0)]
    recipe = blockforge.load_recipe(ROOT / "recipes" / "llama-tiny-mix.yaml", sets)
    losses: list[float] = []
    trainer = Trainer(recipe, folder / f"d{depth}-a{alpha}-lr{lr:g}-s{seed}", progress=False,
                      callbacks=[lambda t, info: losses.append(info.loss)])
    result = trainer.run()
    log_probs = trainer.data.unigram_log_probs()
    out = {"depth": depth, "alpha": alpha, "lr": lr, "warmup": WARMUP, "seed": seed, "status": str(result.status),
           "whole_split_baseline": math.log(trainer.data_info["unigram_val_ppl"]), "losses": losses}
    for batches in (4, 8):
        chosen = trainer.val_batches[:batches]
        out[f"baseline_{batches}"] = count_baseline(chosen, log_probs, trainer.pad_id)
        out[f"val_{batches}"] = (evaluate(trainer.model, chosen, trainer.runtime, trainer.pad_id)["val_loss"]
                                 if result.status == "completed" else None)
    return out


def judged(r: dict, batches: int):
    """A saved run's Stability by today's rule, its learnt measured on `batches` validation batches."""
    from blockforge.train.stability import judge_curve

    diverged = "diverged" if r["status"] == "diverged" else None
    return judge_curve(r["losses"], int(r["warmup"] * len(r["losses"])), final_loss=r[f"val_{batches}"], baseline=r[f"baseline_{batches}"],
                       diverged=diverged)


def sweeps(runs: list[dict]) -> dict[tuple, list[dict]]:
    """The runs by model and seed: (depth, alpha, seed) -> its runs in order of learning rate."""
    out: dict[tuple, list[dict]] = {}
    for r in runs:
        out.setdefault((r["depth"], r["alpha"], r["seed"]), []).append(r)
    return {key: sorted(found, key=lambda r: r["lr"]) for key, found in sorted(out.items())}


def edge(points) -> str:
    """The largest learning rate of a judged sweep below its first unstable one ('-' when the lowest is unstable)."""
    largest = None
    for p in points:
        if p.state == "unstable":
            break
        if p.state == "stable":
            largest = p.lr
    return "did not train" if largest is None and all(p.state == "did not train" for p in points) else (
        "-" if largest is None else f"{largest:.3g}" + ("" if points[-1].state != "stable" else " (top)"))


def summarize(runs: list[dict], seconds: float) -> None:
    from blockforge.train.stability import RULE, judge_sweep

    print(f"\n{len(runs)} runs" + (f" in {seconds:.0f} s" if seconds else "") + f"; the rule: {RULE}")
    fractions, flips, untrained = [], [], []
    print("per model and seed: edge on 4 batches | on 8 batches; states by lr (s stable, u unstable, d did not train; 4/8)")
    for (depth, alpha, seed), found in sweeps(runs).items():
        judged_by = {b: judge_sweep([(r["lr"], judged(r, b)) for r in found]) for b in (4, 8)}
        for r, p4, p8 in zip(found, judged_by[4], judged_by[8]):
            if p4.state != p8.state:
                flips.append(f"depth {depth} alpha {alpha} seed {seed} lr {r['lr']:.3g}: {p4.state} on 4, {p8.state} on 8")
            if p8.state == "did not train":
                untrained.append((depth, alpha, seed, r["lr"], p8.learnt))
        best = None
        for r, p in zip(found, judged_by[8]):  # what each finished run learnt against the most a lower lr learnt
            if p.learnt is not None and best is not None and best >= RULE.learnt and not judged(r, 8).unstable:
                fractions.append((p.learnt / best, depth, alpha, seed, r["lr"]))
            if p.state != "unstable" and p.learnt is not None:
                best = p.learnt if best is None else max(best, p.learnt)
        states = " ".join(f"{p4.state[0]}{'' if p4.state == p8.state else '/' + p8.state[0]}" for p4, p8 in zip(judged_by[4], judged_by[8]))
        print(f"  depth {depth:2d} alpha {alpha:<4} seed {seed}: {edge(judged_by[4]):>14} | {edge(judged_by[8]):>14}   {states}")
    print("\nlearnt as a fraction of the most a lower lr of its sweep learnt (8 batches), runs that did not diverge or rise:")
    for low, high in [(-math.inf, 0.2), (0.2, 0.35), (0.35, 0.5), (0.5, 0.65), (0.65, 0.8), (0.8, math.inf)]:
        inside = [f for f in fractions if low <= f[0] < high]
        print(f"  [{low:g}, {high:g}): {len(inside)} runs" + (f": {[(d, a, round(lr, 4)) for _, d, a, s, lr in inside]}" if 0 < len(inside) <= 10 else ""))
    print(f"runs that learnt under {RULE.learnt:g} nats where no lower lr learnt more (did not train): "
          + (", ".join(f"depth {d} alpha {a} seed {s} lr {lr:.3g} ({learnt:+.3f})" for d, a, s, lr, learnt in untrained) or "none"))
    print(f"states that differ between 4 and 8 evaluation batches: {len(flips)}" + "".join(f"\n  {line}" for line in flips))
    pairs = {}
    for r in runs:
        if r["val_8"] is not None:
            pairs.setdefault((r["depth"], r["alpha"], r["lr"]), []).append(r["val_8"])
    spread = [abs(v[0] - v[1]) / math.sqrt(2) for v in pairs.values() if len(v) == 2]
    if spread:
        print(f"seed-to-seed spread of a final loss (sd estimated from pairs, {len(spread)} pairs): median {statistics.median(spread):.3f}, "
              f"90th percentile {sorted(spread)[int(0.9 * len(spread))]:.3f} nats (the rule's noise: {RULE.noise:g})")
    print(f"largest rise of the loss level above its lowest after warm-up: {max(judged(r, 8).rise for r in runs):.3f} nats (the rule: {RULE.rise:g})")
    gaps = [(r["whole_split_baseline"] - r["baseline_4"], r["whole_split_baseline"] - r["baseline_8"]) for r in runs[:1]]
    print(f"the whole split's baseline minus the scored tokens' own: {gaps[0][0]:+.3f} (4 batches), {gaps[0][1]:+.3f} (8 batches) nats")
    old = [r for r in runs if r["val_8"] is not None and not r["whole_split_baseline"] - r["val_8"] > OLD_LEARNT]
    print(f"runs the old absolute rule (within {OLD_LEARNT:g} of the whole split's baseline) called unstable: {len(old)} of "
          f"{sum(r['val_8'] is not None for r in runs)} finished")


RECORD = [(8, 0.0, 0), (8, 0.25, 0), (4, 0.0, 0), (12, 1.0, 0)]  # (depth, alpha, seed): the sweeps tests/train/test_stability_rule.py judges


def record(runs: list[dict], path: Path) -> None:
    """The sweeps in RECORD as tests/train/recorded_sweeps.json keeps them: each run's learning rate, its own verdict (a
    divergence or a rise), its final loss on 4 and 8 validation batches beside those tokens' count baseline and the whole
    split's, and the states judge_sweep gives on 8 batches (read against each run's loss curve before they were kept); and
    one run that collapsed yet passed the absolute test this rule replaced (more than OLD_LEARNT below the whole split's
    baseline, within OLD_LEARNT of its scored tokens' own count level)."""
    from blockforge.train.stability import judge_sweep

    found = sweeps(runs)
    out, below = {}, None
    for key in RECORD:
        if key not in found:
            continue
        name = f"depth {key[0]} alpha {key[1]} seed {key[2]}"
        kept = [{"lr": r["lr"], "unstable": judged(r, 8).unstable, **{k: r[k] for k in ("val_4", "val_8", "baseline_4", "baseline_8",
                                                                                       "whole_split_baseline")}} for r in found[key]]
        states = judge_sweep([(r["lr"], judged(r, 8)) for r in found[key]])
        out[name] = {"runs": kept, "states": {str(p.lr): p.state for p in states}}
        for r, p in zip(found[key], states):
            if (below is None and p.state == "unstable" and r["val_8"] is not None and r["val_8"] < r["whole_split_baseline"] - OLD_LEARNT
                    and r["baseline_8"] - r["val_8"] < OLD_LEARNT):
                below = [name, r["lr"]]
    path.write_text(json.dumps({"source": "benchmarks/stability_thresholds.py", "sweeps": out, "collapse_below_whole_split": below}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="depth 4, Pre-LN and Mix-LN, one seed")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", type=Path, help="write every run's numbers (and losses) here, after each run")
    parser.add_argument("--from-json", type=Path, help="judge the runs saved by --json again, by the rules as they are now (no training)")
    parser.add_argument("--record", type=Path, help="with --from-json: write the recorded sweeps the tests judge (RECORD) here")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores, shared by what else runs on them)")
    args = parser.parse_args()
    if args.from_json:
        runs = [r for r in json.loads(args.from_json.read_text()) if r["status"] in ("completed", "diverged")]
        return record(runs, args.record) if args.record else summarize(runs, 0.0)
    import torch

    torch.set_num_threads(args.threads)
    depths, alphas, seeds = ([4], [0.0, 0.25], [0]) if args.quick else ([4, 8, 12], [0.0, 0.25, 1.0], [0, 1])
    done = json.loads(args.json.read_text()) if args.json and args.json.exists() else []  # a stopped benchmark goes on
    done = [r for r in done if r["status"] in ("completed", "diverged")]  # a run stopped with it trains again
    have = {(r["depth"], r["alpha"], r["seed"], r["lr"]) for r in done}
    runs, started = list(done), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for depth in depths:
            for alpha in alphas:
                for seed in seeds:
                    for lr in LRS:
                        if (depth, alpha, seed, lr) in have:
                            continue
                        r = run(Path(tmp), depth, alpha, lr, seed, args.steps)
                        runs.append(r)
                        print(f"depth {depth} alpha {alpha} seed {seed} lr {lr:.3g}: {r['status']}, val_4 {r['val_4']}, val_8 {r['val_8']}, "
                              f"baselines {r['baseline_4']:.3f}/{r['baseline_8']:.3f}", flush=True)
                        if args.json:
                            args.json.parent.mkdir(parents=True, exist_ok=True)
                            args.json.write_text(json.dumps(runs))
    summarize(runs, time.perf_counter() - started)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
