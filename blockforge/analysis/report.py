"""`analyze`: the chosen measures over several targets, one JSON record and one PNG per measure.

Each record holds the inputs (targets, seeds, token budget, batch sizes, overrides) and, per target,
the numbers its figure is drawn from, so a figure can be redrawn (plots.replot) and compared.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

import blockforge.analysis.measures as measures
from blockforge.analysis.defaults import DEFAULT_IMAGES, DEFAULT_SEEDS, DEFAULT_TOKENS
from blockforge.analysis.plots import plot
from blockforge.analysis.targets import Samples, label_targets, open_target, target_dataset, trained_model, untrained_model
from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, writable_folder
from blockforge.spec import Assignment

RECORD_FORMAT = 1


def _check_settings(paths, out: Path, chosen: dict, tokens, images, seeds, batch_size, grad_batches) -> None:
    if not paths:
        raise BlockforgeError("give at least one target: a run folder, an export folder or a recipe YAML")
    if not any(chosen.values()):
        raise BlockforgeError("choose at least one analysis: --grad-norms, --angular or --layer-drop (or --all)")
    for name, value in (("--tokens", tokens), ("--images", images), ("--batch-size", batch_size), ("--grad-batches", grad_batches)):
        if value < 1:
            raise BlockforgeError(f"{name} must be 1 or more, not {value}")
    if not seeds:
        raise BlockforgeError("--seeds needs at least one seed, e.g. --seeds 0,1,2")
    if out.exists() and not out.is_dir():
        raise BlockforgeError(f"{out}: is a file; give a folder for --out")


def _nan_to_none(table: np.ndarray) -> list:
    return [[None if math.isnan(v) else v for v in row] for row in table.tolist()]


def analyze(
    paths: Iterable[str | os.PathLike],
    out: str | os.PathLike,
    *,
    grad_norms: bool = False,
    angular: bool = False,
    layer_drop: bool = False,
    at_init: bool = False,
    overrides: Iterable = (),
    tokens: int = DEFAULT_TOKENS,
    images: int = DEFAULT_IMAGES,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    batch_size: int = 16,
    grad_batches: int = 4,
    drop_metric: str = "val_loss",
    device: str = "auto",
    echo: Callable[[str], None] = lambda line: None,
) -> dict[str, dict]:
    """Measure every target and write <analysis>.json and <analysis>.png into `out`; returns the records.

    Trained targets are measured at their weights unless `at_init`; recipes always at initialization,
    where gradient norms are averaged over `seeds` (one model per seed) and the other measures use the
    first seed. Gradient norms take `grad_batches` batches of `batch_size`; angular distance takes
    `tokens` LM tokens or `images` images, layer-drop the same budget from validation data only.
    """
    from blockforge.train.runtime import pick_device

    paths, overrides, out = list(paths), list(overrides), Path(out)
    settings = _Settings(at_init=at_init, seeds=list(seeds), tokens=tokens, images=images, batch_size=batch_size,
                         grad_batches=grad_batches, drop_metric=drop_metric)
    chosen = {"grad_norms": grad_norms, "angular_distance": angular, "layer_drop": layer_drop}
    _check_settings(paths, out, chosen, tokens, images, settings.seeds, batch_size, grad_batches)
    targets = [open_target(path, overrides) for path in paths]
    label_targets(targets, at_init=at_init)
    _check_targets(targets, overrides, settings, layer_drop)
    writable_folder(out, "the analysis")
    torch_device = pick_device(device)

    records = _empty_records(chosen, _inputs(targets, overrides, settings, torch_device))
    measuring = {"grad_norms": _measure_grad_norms, "angular_distance": _measure_angular, "layer_drop": _measure_layer_drop}
    datasets: dict = {}
    for target in targets:
        measured = _Measured(target, settings, torch_device, datasets)
        for name, measure in measuring.items():
            if chosen[name]:
                measure(measured, records, echo)

    if "grad_norms_training" in records and not records["grad_norms_training"]["results"]:
        del records["grad_norms_training"]  # no run target logged per-layer norms
    for name, record in records.items():
        atomic_write_json(out / f"{name}.json", record)
        plot(record, out / f"{name}.png")
    return records


@dataclass(frozen=True)
class _Settings:
    """How every target is measured."""

    at_init: bool
    seeds: list[int]
    tokens: int
    images: int
    batch_size: int
    grad_batches: int
    drop_metric: str


def _check_targets(targets: list, overrides: list, settings: _Settings, layer_drop: bool) -> None:
    """Refuse what does not apply to a target: a model override on trained weights, a layer-drop metric its family lacks."""
    model_keys = [key for key, _ in overrides if key.startswith("model.")]
    for target in targets:
        if target.trained and not settings.at_init and model_keys:
            raise BlockforgeError(
                f"--set {model_keys[0]}: a trained model's architecture is fixed by its spec.yaml; drop the override or pass --at-init"
            )
        if layer_drop:
            allowed = measures.drop_metrics(target.recipe.model.family)
            if settings.drop_metric not in allowed:
                raise BlockforgeError(
                    f"--drop-metric {settings.drop_metric} does not apply to {target.path} ({target.recipe.model.family}); "
                    f"choose one of: {', '.join(allowed)}"
                )


def _inputs(targets: list, overrides: list, settings: _Settings, torch_device: torch.device) -> dict:
    """What every record says it was measured from, so a figure can be redrawn and compared."""
    from blockforge import __version__

    return {
        "targets": [{"path": str(t.path), "kind": t.kind, "label": t.label} for t in targets],
        "at_init": settings.at_init, "overrides": [str(Assignment(*item)) for item in overrides], "seeds": settings.seeds,
        "tokens": settings.tokens, "images": settings.images, "batch_size": settings.batch_size, "grad_batches": settings.grad_batches,
        "drop_metric": settings.drop_metric, "device": str(torch_device), "blockforge": __version__, "torch": torch.__version__,
    }


def _empty_records(chosen: dict[str, bool], inputs: dict) -> dict[str, dict]:
    """One record per chosen analysis (and, with gradient norms, one for the norms a run logged while it trained)."""
    names = [name for name, on in chosen.items() if on] + (["grad_norms_training"] if chosen["grad_norms"] else [])
    return {name: {"analysis": name, "format": RECORD_FORMAT, "inputs": inputs, "results": []} for name in names}


class _Measured:
    """One target as it is measured: its data, its models (one in memory at a time: a seed's at initialization, or the
    trained one), the sample budget of angular distance and layer-drop, and what every result of it starts with."""

    def __init__(self, target, settings: _Settings, torch_device: torch.device, datasets: dict):
        from blockforge.spec.family import get_family

        self.target, self.settings, self.device = target, settings, torch_device
        self.data = target_dataset(target, datasets)
        self.pad_id = getattr(self.data, "pad_id", None)
        self.spec = spec = target.recipe.spec
        self.precision = target.recipe.train.precision
        self.untrained = settings.at_init or not target.trained
        per_sample = get_family(spec.family).samples_to_items(spec)  # tokens per row, or 1 per image
        self.budget = math.ceil(settings.tokens / per_sample) if per_sample > 1 else settings.images
        self._models: dict = {}
        self.common = {
            "label": target.label, "path": str(target.path), "kind": target.kind, "family": spec.family,
            "state": "init" if self.untrained else "trained", "step": None if self.untrained else target.step(),
            "seeds": settings.seeds if self.untrained else None, "placements": [layer.placement_name for layer in spec.layers],
            "data": self.data.describe(),
        }

    @property
    def first_seeds(self) -> list[int] | None:
        """The seeds a one-model measure says it used (the first; None for trained weights)."""
        return self.settings.seeds[:1] if self.untrained else None

    def model(self, seed):
        key = seed if self.untrained else "trained"
        if key not in self._models:
            self._models.clear()
            self._models[key] = untrained_model(self.target, seed, self.device) if self.untrained else trained_model(self.target, self.device)
        return self._models[key]


def _measure_grad_norms(m: _Measured, records: dict, echo: Callable[[str], None]) -> None:
    """Per-layer gradient norms, over every seed at initialization; a run's logged norms beside them."""
    started = time.perf_counter()
    settings, target = m.settings, m.target
    samples = Samples(m.data, settings.batch_size, settings.grad_batches * settings.batch_size, fill_from_train=True)
    rows = np.concatenate([
        measures.grad_norms(m.model(seed), samples, pad_id=m.pad_id, precision=m.precision)
        for seed in (settings.seeds if m.untrained else [None])
    ])
    records["grad_norms"]["results"].append({
        **m.common, "mean": rows.mean(0).tolist(), "std": rows.std(0).tolist(), "per_batch": rows.tolist(), "samples": samples.used,
    })
    echo(f"grad norms        {target.label}: {len(rows)} backward passes in {time.perf_counter() - started:.1f}s")
    logged = measures.logged_grad_norms(target.path) if target.kind == "run" else None
    if logged is not None:
        records["grad_norms_training"]["results"].append({**m.common, "state": "training", **logged})


def _measure_angular(m: _Measured, records: dict, echo: Callable[[str], None]) -> None:
    started = time.perf_counter()
    samples = Samples(m.data, m.settings.batch_size, m.budget, fill_from_train=True)
    result = measures.angular_distance(m.model(m.settings.seeds[0]), samples, pad_id=m.pad_id, precision=m.precision)
    records["angular_distance"]["results"].append({
        **m.common, "seeds": m.first_seeds,
        "distances": _nan_to_none(result.distances), "tokens": result.tokens, "samples": samples.used,
    })
    echo(f"angular distance  {m.target.label}: {result.tokens:,} tokens in {time.perf_counter() - started:.1f}s")


def _measure_layer_drop(m: _Measured, records: dict, echo: Callable[[str], None]) -> None:
    started = time.perf_counter()
    samples = Samples(m.data, m.settings.batch_size, m.budget, fill_from_train=False)
    result = measures.layer_drop(m.model(m.settings.seeds[0]), samples, m.settings.drop_metric, pad_id=m.pad_id, precision=m.precision)
    records["layer_drop"]["results"].append({**m.common, "seeds": m.first_seeds, **result, "samples": samples.used})
    echo(f"layer-drop        {m.target.label}: {m.spec.depth + 1} evaluations in {time.perf_counter() - started:.1f}s")
