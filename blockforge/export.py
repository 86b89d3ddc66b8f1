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


NATIVE_USAGE = """```python
import blockforge
model = blockforge.load("path/to/this/folder")
```
"""


def model_card(spec: ResolvedSpec, model: nn.Module, recipe: dict, result: dict, data: dict, extra: str = "", usage: str = NATIVE_USAGE) -> str:
    placements = ", ".join(f"{name} x{n}" for name, n in Counter(layer.placement_name for layer in spec.layers).items())
    metrics = result.get("metrics") or {}
    metric_lines = "\n".join(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}" for key, value in sorted(metrics.items()))
    train = recipe.get("train", {})
    data_lines = "\n".join(f"- {key}: {value}" for key, value in data.items())
    return f"""# blockforge {spec.family} ({placements})

A {spec.family} model of {parameter_count(model):,} parameters: width {spec.width}, depth {spec.depth},
norm {spec.norm}{', final norm' if spec.final_norm else ''}{', tied embeddings' if spec.tie_embeddings else ''}.
Architecture hash `{spec.arch_hash()}`.

{usage}
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


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, extra_card: str = "", format: str = "blockforge") -> Path:
    """Write the run's latest weights and records into `out_dir` as an exported model (`format`: see EXPORT_FORMATS)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "spec.yaml").exists():
        raise BlockforgeError(f"{run_dir}: not a run folder (spec.yaml is missing); give the folder `blockforge train --out` wrote")
    if out_dir.resolve() == run_dir.resolve():
        raise BlockforgeError(f"{out_dir}: export into a new folder, not the run folder itself")
    if format != "blockforge":
        return export_converted(run_dir, out_dir, format, extra_card)
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


# Other libraries' formats: the native export is written to a scratch folder, then converted by the
# family's ExportFormat (families/formats.py), which verifies what it writes.

EXPORT_FORMATS = ("blockforge", "hf", "timm")


def export_format(format: str, spec: ResolvedSpec):
    """The family's ExportFormat for `format`, after it accepted `spec`; refused in one sentence otherwise."""
    from blockforge.errors import unknown_choice_message
    from blockforge.spec.family import FAMILIES

    if format not in EXPORT_FORMATS:
        raise BlockforgeError(f"--format: {unknown_choice_message(format, EXPORT_FORMATS)}")
    exporter = FAMILIES[spec.family].exports.get(format)
    if exporter is None:
        offered = [name for name, family in FAMILIES.items() if format in family.exports]
        raise BlockforgeError(
            f"--format {format} exports {' and '.join(offered) or 'no'} models, and this is a {spec.family} model; "
            "export it with --format blockforge, which blockforge.load reads"
        )
    exporter.check(spec)
    return exporter


def check_export_format(format: str, spec: ResolvedSpec) -> None:
    """Refuse `format` for `spec` before any training or writing (search exports call it before a retrain)."""
    if format != "blockforge":
        export_format(format, spec)


def _run_records(run_dir: Path) -> tuple[dict, dict, dict]:
    """The run's result, data description and recipe (empty where a record is missing)."""
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {"status": "partial"}
    data = json.loads((run_dir / "data.json").read_text()) if (run_dir / "data.json").exists() else {}
    recipe = read_yaml(run_dir / "recipe.yaml") if (run_dir / "recipe.yaml").exists() else {}
    return result, data, recipe


def export_converted(run_dir: Path, out_dir: Path, format: str, extra_card: str = "") -> Path:
    """The run exported in another library's format: the native export in a scratch folder, then converted into `out_dir`."""
    import tempfile

    exporter = export_format(format, load_spec(run_dir / "spec.yaml"))
    writable_folder(out_dir, "the export")
    with tempfile.TemporaryDirectory(prefix=".native-", dir=out_dir) as scratch:
        native = export_run(run_dir, Path(scratch) / "native", extra_card=extra_card)
        model = load(native, attention="sdpa")  # the kernel does not change what the model computes; sdpa runs anywhere
        result, data, recipe = _run_records(run_dir)
        card = model_card(model.spec, model, recipe, result, data, extra_card, usage=exporter.usage(model.spec))
        exporter.write(model, native, out_dir, card)
    return out_dir
