"""Exported models: model.safetensors + the resolved spec.yaml + recipe.yaml + metrics.json + a model card.

`export_run` turns a run folder into an exported model; `load` rebuilds the model from an export (or
from a run's latest checkpoint) in eval mode, refusing weights that do not fit the spec.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, atomic_write_text, writable_folder
from blockforge.nn.build import build_model, layer_parameter_counts, parameter_count
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.recipe import read_yaml
from blockforge.spec.serialize import load_spec, save_spec
from blockforge.tables import markdown_table
from blockforge.train.checkpoint import latest_checkpoint, load_weights, save_weights


def weights_path(folder: Path) -> Path:
    """The weights of an export, or of a run's latest checkpoint."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists():
        return folder / "model.safetensors"
    checkpoint = latest_checkpoint(folder)
    if checkpoint is None:
        raise BlockforgeError(f"{folder}: neither an exported model (model.safetensors) nor a run with a checkpoint; check the path")
    return checkpoint / "model.safetensors"


def load(path: str | os.PathLike, *, device: str | torch.device = "cpu", attention: str | None = None) -> nn.Module:
    """The model in an export or run folder, in eval mode. `attention` swaps the kernel (e.g. 'sdpa' on CPU)."""
    import dataclasses

    folder = Path(path)
    if not folder.is_dir():
        raise BlockforgeError(f"{folder}: no such folder; give an export or run folder")
    if not (folder / "spec.yaml").exists():
        raise BlockforgeError(f"{folder}: spec.yaml is missing, so this is not a blockforge export or run folder")
    spec = load_spec(folder / "spec.yaml")
    if attention is not None:
        spec = dataclasses.replace(spec, attention=attention)
    model = build_model(spec, device=device)
    load_weights(model, weights_path(folder))
    return model.eval()


def architecture_table(spec: ResolvedSpec, model: nn.Module) -> str:
    headers, rows = spec.layer_table()
    rows = [row + [f"{count:,}"] for row, count in zip(rows, layer_parameter_counts(model))]
    return markdown_table(headers + ["parameters"], rows, "rl" + "r" * (len(headers) - 1))


def model_card(spec: ResolvedSpec, model: nn.Module, recipe: dict, result: dict, data: dict, extra: str = "") -> str:
    placements = ", ".join(f"{name} x{n}" for name, n in Counter(layer.placement_name for layer in spec.layers).items())
    metrics = result.get("metrics") or {}
    metric_lines = "\n".join(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}" for key, value in sorted(metrics.items()))
    train = recipe.get("train", {})
    data_lines = "\n".join(f"- {key}: {value}" for key, value in data.items())
    return f"""# blockforge {spec.family} ({placements})

A {spec.family} model of {parameter_count(model):,} parameters: width {spec.width}, depth {spec.depth},
norm {spec.norm}{', final norm' if spec.final_norm else ''}{', tied embeddings' if spec.tie_embeddings else ''}.
Architecture hash `{spec.arch_hash()}`.

```python
import blockforge
model = blockforge.load("path/to/this/folder")
```

## Architecture

{architecture_table(spec, model)}

## Training

- status: {result.get('status', 'unknown')} after {result.get('step', '?')} of {train.get('steps', '?')} steps
- optimizer {train.get('optimizer')}, peak lr {train.get('lr')}, batch {train.get('batch_size')}, seed {train.get('seed')}

## Data

{data_lines or '- (not recorded)'}

## Final metrics

{metric_lines or '- (none recorded)'}
{extra}"""


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, extra_card: str = "") -> Path:
    """Write the run's latest weights and records into `out_dir` as an exported model."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "spec.yaml").exists():
        raise BlockforgeError(f"{run_dir}: not a run folder (spec.yaml is missing); give the folder `blockforge train --out` wrote")
    if out_dir.resolve() == run_dir.resolve():
        raise BlockforgeError(f"{out_dir}: export into a new folder, not the run folder itself")
    model = load(run_dir)
    spec = model.spec
    writable_folder(out_dir, "the export")
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {"status": "partial"}
    data = json.loads((run_dir / "data.json").read_text()) if (run_dir / "data.json").exists() else {}
    recipe = read_yaml(run_dir / "recipe.yaml") if (run_dir / "recipe.yaml").exists() else {}
    save_weights(model, out_dir / "model.safetensors")
    save_spec(spec, out_dir / "spec.yaml")
    if (run_dir / "recipe.yaml").exists():
        shutil.copyfile(run_dir / "recipe.yaml", out_dir / "recipe.yaml")
    if (run_dir / "tokenizer").is_dir():
        shutil.copytree(run_dir / "tokenizer", out_dir / "tokenizer", dirs_exist_ok=True)
    atomic_write_json(out_dir / "metrics.json", {"status": result.get("status"), "step": result.get("step"), **(result.get("metrics") or {})})
    atomic_write_text(out_dir / "README.md", model_card(spec, model, recipe, result, data, extra_card))
    return out_dir
