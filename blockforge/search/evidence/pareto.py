"""The front of a search with a cost axis, with its evidence.

A candidate's costs are known exactly (computed from its spec, or measured once); its quality is a claim
about noisy training, so it is compared seed by seed. A candidate is on the front unless another is no
more costly on every cost and better in quality by a paired 95% interval that excludes zero; one that
another matches on cost without such an interval is listed as tied with it. The front's hypervolume (each
objective scaled to [0, 1] over the cell's candidates, the reference point at 1.1) comes with a 95% interval
from resampling the seeds all candidates share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blockforge.search.evidence.evidence import Candidate, Difference, dominates, paired_difference, verdict
from blockforge.spec.search import mode_sign


@dataclass
class FrontPoint:
    candidate: Candidate
    costs: dict[str, float]
    dominated_by: list[tuple[Candidate, Difference]] = field(default_factory=list)
    tied_with: list[tuple[Candidate, Difference]] = field(default_factory=list)

    @property
    def on_front(self) -> bool:
        return not self.dominated_by


@dataclass
class Front:
    points: list[FrontPoint]  # every candidate with the confirmation's seeds, the front first, each part by its first cost
    hypervolume: float | None
    low: float | None
    high: float | None
    seeds: int  # the seeds the hypervolume's interval resamples

    def front(self) -> list[FrontPoint]:
        return [p for p in self.points if p.on_front]


def _no_more_costly(a: dict, b: dict, costs: list[tuple[str, str]]) -> bool:
    return all((a[c] <= b[c]) if mode == "min" else (a[c] >= b[c]) for c, mode in costs)


def front_evidence(candidates: list[Candidate], costs: list[tuple[str, str]], mode: str, resamples: int = 1000, seed: int = 0) -> Front:
    """The front of `candidates` (each with its costs and replicates) under the evidence rule, and its hypervolume."""
    points = [FrontPoint(c, dict(c.costs)) for c in candidates if all(k in c.costs for k, _ in costs)]
    for p in points:
        for q in points:
            if q is p or not _no_more_costly(q.costs, p.costs, costs):
                continue
            diff = paired_difference(q.candidate.values, p.candidate.values)  # q - p, seed by seed
            if diff is None or diff.low is None:
                continue
            if verdict(diff, mode) == "better":
                p.dominated_by.append((q.candidate, diff))
            elif not diff.excludes_zero():
                p.tied_with.append((q.candidate, diff))
    first = costs[0][0] if costs else None
    points.sort(key=lambda p: (not p.on_front, p.costs.get(first, 0.0)))
    shared = sorted(set.intersection(*(set(p.candidate.values) for p in points))) if points else []
    if len(points) < 1 or not costs:
        return Front(points, None, None, None, len(shared))
    signs = np.array([mode_sign(mode), *(mode_sign(m) for _, m in costs)])
    cost_part = np.array([[p.costs[c] for c, _ in costs] for p in points])

    def hv(quality: np.ndarray) -> float:
        raw = np.column_stack([quality, cost_part]) * signs  # every objective to minimise
        low, high = raw.min(axis=0), raw.max(axis=0)
        scaled = (raw - low) / np.where(high > low, high - low, 1.0)
        kept = [x for x in scaled if not any(dominates(list(y), list(x)) for y in scaled if y is not x)]
        return hypervolume(np.array(kept), np.full(raw.shape[1], 1.1))

    means = np.array([p.candidate.mean for p in points])
    value = hv(means)
    if len(shared) < 2:
        return Front(points, value, None, None, len(shared))
    rng = np.random.default_rng(seed)
    table = np.array([[p.candidate.values[s] for s in shared] for p in points])
    draws = [hv(table[:, rng.integers(0, len(shared), len(shared))].mean(axis=1)) for _ in range(resamples)]
    return Front(points, value, float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5)), len(shared))


def hypervolume(points: np.ndarray, reference: np.ndarray) -> float:
    """The volume dominated by `points` (every coordinate to minimise) up to `reference`, exactly, by slicing
    along the first coordinate (fine for the few points of one cell)."""
    points = np.array([p for p in points if np.all(p < reference)])
    if len(points) == 0:
        return 0.0
    if points.shape[1] == 1:
        return float(reference[0] - points[:, 0].min())
    order = np.argsort(points[:, 0])
    points = points[order]
    volume = 0.0
    for i, p in enumerate(points):
        upper = points[i + 1, 0] if i + 1 < len(points) else reference[0]
        if upper <= p[0]:
            continue
        volume += (upper - p[0]) * hypervolume(points[: i + 1, 1:], reference[1:])
    return float(volume)
