"""`analyze`: the chosen measures over several targets, one JSON record and one PNG per measure.

Each record holds the inputs (targets, seeds, token budget, batch sizes, overrides) and, per target,
the numbers its figure is drawn from, so a figure can be redrawn (plots.replot) and compared.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

import blockforge.analysis.measures as measures
from blockforge.analysis.plots import plot
from blockforge.analysis.targets import Samples, label_targets, open_target, target_dataset, trained_model, untrained_model
from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, writable_folder
from blockforge.spec import Assignment

RECORD_FORMAT = 1
DEFAULT_TOKENS = 256 * 1024  # LM tokens for angular distance and layer-drop
DEFAULT_IMAGES = 1024  # vit images (all their tokens) for the same
DEFAULT_SEEDS = (0, 1, 2)


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
    from blockforge import __version__
    from blockforge.spec.family import get_family
    from blockforge.train.runtime import pick_device

    paths, overrides, seeds, out = list(paths), list(overrides), list(seeds), Path(out)
    chosen = {"grad_norms": grad_norms, "angular_distance": angular, "layer_drop": layer_drop}
    _check_settings(paths, out, chosen, tokens, images, seeds, batch_size, grad_batches)
    targets = [open_target(path, overrides) for path in paths]
    label_targets(targets, at_init=at_init)
    model_keys = [key for key, _ in overrides if key.startswith("model.")]
    for target in targets:
        if target.trained and not at_init and model_keys:
            raise BlockforgeError(
                f"--set {model_keys[0]}: a trained model's architecture is fixed by its spec.yaml; drop the override or pass --at-init"
            )
        if layer_drop:
            allowed = measures.drop_metrics(target.recipe.model.family)
            if drop_metric not in allowed:
                raise BlockforgeError(
                    f"--drop-metric {drop_metric} does not apply to {target.path} ({target.recipe.model.family}); "
                    f"choose one of: {', '.join(allowed)}"
                )
    writable_folder(out, "the analysis")
    torch_device = pick_device(device)

    inputs = {
        "targets": [{"path": str(t.path), "kind": t.kind, "label": t.label} for t in targets],
        "at_init": at_init, "overrides": [str(Assignment(*item)) for item in overrides], "seeds": seeds,
        "tokens": tokens, "images": images, "batch_size": batch_size, "grad_batches": grad_batches,
        "drop_metric": drop_metric, "device": str(torch_device), "blockforge": __version__, "torch": torch.__version__,
    }
    records = {name: {"analysis": name, "format": RECORD_FORMAT, "inputs": inputs, "results": []} for name, on in chosen.items() if on}
    if grad_norms:
        records["grad_norms_training"] = {"analysis": "grad_norms_training", "format": RECORD_FORMAT, "inputs": inputs, "results": []}
    datasets: dict = {}

    for target in targets:
        data = target_dataset(target, datasets)
        pad_id = getattr(data, "pad_id", None)
        spec = target.recipe.spec
        precision = target.recipe.train.precision
        untrained = at_init or not target.trained
        per_sample = get_family(spec.family).samples_to_items(spec)  # tokens per row, or 1 per image
        budget = math.ceil(tokens / per_sample) if per_sample > 1 else images
        models: dict = {}

        def model(seed):
            key = seed if untrained else "trained"
            if key not in models:
                models.clear()  # one model in memory at a time
                models[key] = untrained_model(target, seed, torch_device) if untrained else trained_model(target, torch_device)
            return models[key]

        common = {
            "label": target.label, "path": str(target.path), "kind": target.kind, "family": spec.family,
            "state": "init" if untrained else "trained", "step": None if untrained else target.step(),
            "seeds": seeds if untrained else None, "placements": [layer.placement_name for layer in spec.layers],
            "data": data.describe(),
        }

        if grad_norms:
            started = time.perf_counter()
            samples = Samples(data, batch_size, grad_batches * batch_size, fill_from_train=True)
            rows = np.concatenate([
                measures.grad_norms(model(seed), samples, pad_id=pad_id, precision=precision)
                for seed in (seeds if untrained else [None])
            ])
            records["grad_norms"]["results"].append({
                **common, "mean": rows.mean(0).tolist(), "std": rows.std(0).tolist(), "per_batch": rows.tolist(), "samples": samples.used,
            })
            echo(f"grad norms        {target.label}: {len(rows)} backward passes in {time.perf_counter() - started:.1f}s")
            logged = measures.logged_grad_norms(target.path) if target.kind == "run" else None
            if logged is not None:
                records["grad_norms_training"]["results"].append({**common, "state": "training", **logged})

        if angular:
            started = time.perf_counter()
            samples = Samples(data, batch_size, budget, fill_from_train=True)
            result = measures.angular_distance(model(seeds[0]), samples, pad_id=pad_id, precision=precision)
            records["angular_distance"]["results"].append({
                **common, "seeds": seeds[:1] if untrained else None,
                "distances": _nan_to_none(result.distances), "tokens": result.tokens, "samples": samples.used,
            })
            echo(f"angular distance  {target.label}: {result.tokens:,} tokens in {time.perf_counter() - started:.1f}s")

        if layer_drop:
            started = time.perf_counter()
            samples = Samples(data, batch_size, budget, fill_from_train=False)
            result = measures.layer_drop(model(seeds[0]), samples, drop_metric, pad_id=pad_id, precision=precision)
            records["layer_drop"]["results"].append({**common, "seeds": seeds[:1] if untrained else None, **result, "samples": samples.used})
            echo(f"layer-drop        {target.label}: {spec.depth + 1} evaluations in {time.perf_counter() - started:.1f}s")

    if "grad_norms_training" in records and not records["grad_norms_training"]["results"]:
        del records["grad_norms_training"]  # no run target logged per-layer norms
    for name, record in records.items():
        atomic_write_json(out / f"{name}.json", record)
        plot(record, out / f"{name}.png")
    return records
