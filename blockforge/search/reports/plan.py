"""Compute plans before launch: per cell and in total, what a search may cost, without Ray and without training.

Per cell: the model's parameters (total, non-embedding), the FLOPs of one trial and the worst-case number
of trials by stage, each stage of the cell's pipeline counting its own (search/stages/). A trial's FLOPs (blockforge.nn.flops) are

    steps * batch_size * 3 * F  +  evaluations * eval_batches * micro_batch * F

with F the forward FLOPs of one sample (a sequence of `context` tokens, or one image), evaluations =
steps / eval_every (at least the final one). A cell's points may differ in size (an FFN ramp, per-layer
heads): the largest of its base point, its baselines and each searched value alone is used. Worst case by
stage: exploration trials_per_cell (or the distinct points of an enumerated cell); confirmation every
finalist (top, or up to 2 * top points of the explored front with a cost axis, + baselines + the Pre-LN
reference) with `seeds` further seeds, plus finalists whose run was
stopped early finishing it; racing (max_seeds - seeds) further seeds for the winner, the runner-up and
the reference; promotion (sampled cells with a scheduler) every pruned exploration trial finishing with
all seeds; transfer every target's candidates with their seeds. With --gpu, --gpus and --mfu: GPU-hours at
that fraction of the GPU's dense bf16 peak, and a lower bound on the wall time: the larger of the GPU-hours
spread over the trials that run at once, and the longest chain of stages that must follow one another (in a
cell: exploration, confirmation, each racing round, promotion, one trial long each at least; a transfer
target after every proxy cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blockforge.errors import BlockforgeError
from blockforge.nn.flops import trial_flops
from blockforge.search.config import SearchPlan
from blockforge.tables import text_table

# Dense bf16 tensor-core peaks (TFLOP/s), each from its vendor's datasheet; "with sparsity" figures are twice these.
GPU_PEAKS = {
    "A100": (312.0, "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS (624 with sparsity)"),
    "H100": (989.0, "NVIDIA H100 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS with sparsity, 989 dense"),
    "H200": (989.0, "NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS with sparsity, 989 dense"),
    "L40S": (362.0, "NVIDIA L40S datasheet: BF16 362.05 TFLOPS (733 with sparsity)"),
    "B200": (2250.0, "NVIDIA HGX B200 datasheet: FP16/BF16 4.5 PFLOPS with sparsity per GPU, 2.25 dense"),
    "MI300X": (1307.0, "AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense"),
}
DEFAULT_MFU = 0.4  # ~1B-parameter bf16 training reaches 39-42% on H100-class GPUs (OLMo-core, llm-foundry)


@dataclass
class CellPlan:
    cell: str
    parameters: int
    non_embedding: int
    trial_flops: float
    trials: dict[str, int]  # stage -> worst-case trials
    target: bool = False  # a transfer target
    guided: bool = False  # waits for every cell before it in a guided search's order
    rounds: int = 0  # stages of this cell that wait for the one before, each at least one trial long (racing: per round)

    @property
    def total_trials(self) -> int:
        return sum(self.trials.values())

    @property
    def total_flops(self) -> float:
        return self.total_trials * self.trial_flops


def cell_plan(plan: SearchPlan, name: str, as_proxy: bool = False) -> CellPlan:
    """Cell `name`'s sizes and, per stage of its pipeline, the most trials that stage may train (its own count);
    `as_proxy`: of a full search of it (what a transfer target's trials are compared with)."""
    from blockforge.errors import SpecError
    from blockforge.search.stages.pipeline import rounds, worst_case

    sizes = []
    for probe in plan.probes(name):
        try:
            sizes.append(trial_flops(plan.recipe(plan.trial_overrides(plan.cell(name), probe))))
        except SpecError:
            continue  # a point no model is built at (its trials fail, free)
    parameters, non_embedding, flops = max(sizes, key=lambda s: s[2])
    target = name in plan.target_names() and not as_proxy
    return CellPlan(name, parameters, non_embedding, flops, worst_case(plan, name, as_proxy), target=target,
                    guided=plan.guided(name) and not as_proxy, rounds=rounds(plan, name, as_proxy))


def search_plan(plan: SearchPlan) -> list[CellPlan]:
    """Every proxy cell's plan, then each transfer target's."""
    return [cell_plan(plan, name) for name in plan.all_names()]


def _significant(value: float) -> str:
    """Three significant figures; thousands separated (0.0000228 -> 2.28e-05, 12.34 -> 12.3, 45678.9 -> 45,679)."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def format_plan(plan: SearchPlan, cells: list[CellPlan], *, gpu: str | None = None, gpus: int | None = None, mfu: float = DEFAULT_MFU,
                concurrency: int | None = None) -> str:
    """The plan as text: a table per cell and the totals; with `gpu`, GPU-hours and wall time."""
    stages = list(dict.fromkeys(stage for c in cells for stage in c.trials))  # in pipeline order
    rows = [[c.cell + (" (target)" if c.target else ""), f"{c.parameters:,}", f"{c.non_embedding:,}", f"{c.trial_flops:.3g}", *(c.trials.get(s, 0) for s in stages),
             c.total_trials, f"{c.total_flops:.3g}"] for c in cells]
    total_flops = sum(c.total_flops for c in cells)
    total_trials = sum(c.total_trials for c in cells)
    rows.append(["total", "", "", "", *(sum(c.trials.get(s, 0) for c in cells) for s in stages), total_trials, f"{total_flops:.3g}"])
    table = text_table(["cell", "parameters", "non-embedding", "FLOPs/trial", *stages, "trials (at most)", "FLOPs (at most)"], rows,
                       "lrrr" + "r" * (len(stages) + 2))
    lines = [f"Compute plan of {plan.name} (worst case; FLOPs as in blockforge.search.reports.plan):", table]
    lines += guided_lines(plan, cells)
    lines += storage_lines(plan, cells)
    if plan.confirm is not None and plan.confirm.length is not None:
        lines.append(f"length: the check's continuations counted in trials of the cell's own length (to {max(plan.confirm.length.factors):g}x the "
                     "steps, each length continuing from the one before).")
    if curve_key(plan) is not None:
        lines.append(curve_line(plan))
    if gpu is not None:
        if gpu not in GPU_PEAKS:
            raise BlockforgeError(f"--gpu {gpu}: unknown; choose one of {', '.join(GPU_PEAKS)} (dense bf16 peaks from their datasheets)")
        if not 0 < mfu <= 1:
            raise BlockforgeError(f"--mfu must be a fraction in (0, 1], not {mfu:g}")
        peak, source = GPU_PEAKS[gpu]
        per_trial = max(1, math.ceil(plan.resources.gpu)) if plan.resources.gpu else 1
        available = gpus or per_trial
        parallel = max(1, available // per_trial)
        if concurrency is not None:
            parallel = min(parallel, concurrency)
        speed = peak * 1e12 * mfu  # FLOP/s of one GPU
        gpu_hours = total_flops / speed / 3600
        spread = gpu_hours * 3600 / (parallel * per_trial)
        chain, longest = critical_path(cells, speed * per_trial)
        lines.append(f"On {available} x {gpu} at {mfu:.0%} MFU ({peak:g} TFLOP/s dense bf16 each; {source}): {_significant(gpu_hours)} GPU-hours; "
                     f"{per_trial} GPU(s) per trial, {parallel} trial(s) at once: at least {_duration(max(spread, chain))} of wall time "
                     f"(the GPU-hours spread over them: {_duration(spread)}; stages that follow one another: {_duration(chain)}, {longest}).")
    return "\n".join(lines)


# A checkpoint: float32 weights (4 bytes a parameter) and Adam's two moments (8 more); a run kept for reading only keeps 4.
WEIGHT_BYTES, CHECKPOINT_BYTES = 4, 12


def storage_bytes(plan: SearchPlan, cells: list[CellPlan]) -> tuple[int, int]:
    """(at most while the search runs, at its end): what its trials keep. By default a trial keeps its final weights; its
    newest checkpoint with the optimizer state stays while a later stage may continue it (a run stopped early in a cell that
    stops trials, or every run of a cell with a length check), until its cell is done. With keep_checkpoints, each trial
    keeps that many whole checkpoints."""
    keep = getattr(plan, "keep_checkpoints", None)
    at_most = end = 0
    for c in cells:
        if keep is not None:
            at_most += c.total_trials * keep * CHECKPOINT_BYTES * c.parameters
            end += c.total_trials * keep * CHECKPOINT_BYTES * c.parameters
            continue
        continued = plan.continues_completed or (not c.target and plan.stops_early(c.cell))
        at_most += c.total_trials * (CHECKPOINT_BYTES if continued else WEIGHT_BYTES) * c.parameters
        end += c.total_trials * WEIGHT_BYTES * c.parameters
    running = (plan.max_concurrent or 1) * CHECKPOINT_BYTES * max((c.parameters for c in cells), default=0)
    return at_most + running, end


def storage_lines(plan: SearchPlan, cells: list[CellPlan]) -> list[str]:
    at_most, end = storage_bytes(plan, cells)
    kept = (f"each trial's {plan.keep_checkpoints} newest checkpoints with optimizer state (keep_checkpoints)" if getattr(plan, "keep_checkpoints", None)
            else "each trial's final weights; a checkpoint with optimizer state only while a later stage may continue its run")
    return [f"storage: at most {_size(at_most)} while it runs, {_size(end)} at the end ({kept}; runs' logs and the prepared data aside)"]


def curve_key(plan: SearchPlan) -> str | None:
    """The key that asked for a learning-rate curve (confirm.lr_curve, confirm.lr, confirm.stability), or None."""
    from blockforge.spec.search import lr_curve_of

    found = lr_curve_of(plan.confirm)
    return None if found is None else found[1]


def curve_line(plan: SearchPlan) -> str:
    """What the lr curve column counts, and what a file's confirm.lr or confirm.stability now trains."""
    from blockforge.search.checks.lr_curve import grid, probe_steps, warmups
    from blockforge.search.stages.lr_curve import chain_probes

    cell = plan.cell_names()[0]
    g = grid(plan, cell)
    steps = probe_steps(plan, cell)
    length = f"{steps} steps" if steps != plan.settings[cell].steps else "the cell's own length"
    key = curve_key(plan)
    asked = "" if key == "confirm.lr_curve" else f"{key} ask{'s' if ' and ' not in key else ''} for the learning-rate curve (confirm.lr_curve): "
    return (f"lr curve: {asked}each finalist, baseline and the Pre-LN reference, per seed of the confirmation and per warm-up "
            f"({len(warmups(plan))}), trained from {g.lr(g.bottom):.3g} (lr_min on the grid; down to {g.lr(g.floor):.3g} while its lowest point is unstable or the best) "
            f"to lr_max {g.high:g} in coarse steps of x{g.step ** g.every:.3g}, up until a run is unstable, the edge found within x{g.step:.3g}: "
            f"at most {chain_probes(g)} probes a chain (probes of {length}), counted in trials of the cell's own length.")


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.0f} kB"


def guided_lines(plan: SearchPlan, cells: list[CellPlan]) -> list[str]:
    """With guidance: what the explore column counts in guided cells, and the worst case if every window grew to its cell's
    whole range (the unguided worst case)."""
    if plan.guide is None:
        return []
    from blockforge.search.stages.guidance import GuidedExplore

    guided = [c for c in cells if plan.guided(c.cell)]
    extra = {c.cell: GuidedExplore.unguided(plan, c.cell) - c.trials.get(GuidedExplore.key(), 0) for c in guided}
    trials = sum(c.total_trials for c in cells) + sum(extra.values())
    flops = sum(c.total_flops for c in cells) + sum(extra[c.cell] * c.trial_flops for c in guided)
    return [f"guide: cells run in the order {', '.join(plan.order)}: the first {plan.guide.after} at once, then each after the cells "
            f"before it, guided by them. A guided cell's explore column counts a window one k wide with {plan.guide.margin} more on "
            f"each side (the guided worst case); if every window grew to its cell's whole range: {trials} trials, {flops:.3g} FLOPs "
            "(the unguided worst case)."]


def critical_path(cells: list[CellPlan], trial_speed: float) -> tuple[float, str]:
    """(seconds, what) of the longest chain of stages that wait for each other, at `trial_speed` FLOP/s per trial:
    a proxy cell's stages one after another; a transfer target's trials after the slowest proxy cell."""
    proxies = [(c.rounds * c.trial_flops / trial_speed, c.cell) for c in cells if not c.target and not c.guided]
    guided = [(c.rounds * c.trial_flops / trial_speed, c.cell) for c in cells if c.guided]  # one after another, after the rest
    if guided:
        first = max(proxies, default=(0.0, ""))
        proxies = [(first[0] + sum(t for t, _ in guided), f"{first[1]}'s stages then each guided cell's ({', '.join(c for _, c in guided)})")]
    slowest = max(proxies, default=(0.0, ""))
    chains = [(t, f"{cell}'s stages") if "then" not in cell else (t, cell) for t, cell in proxies]
    chains += [(slowest[0] + c.trial_flops / trial_speed, f"{slowest[1]}'s stages then target {c.cell}") for c in cells if c.target]
    return max(chains, default=(0.0, "no stage"))


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2g} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
