"""Exported models: model.safetensors + the resolved spec.yaml + recipe.yaml + metrics.json + a model card.

`export_run` turns a run folder into an exported model, written beside its destination and put in place
whole; `load` rebuilds the model from an export (or from a run's latest checkpoint) in eval mode, after
checking the weights' names, dtypes and shapes against spec.yaml, their checksum, and that they were
written for that spec (tensorfile, checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator

import torch
import yaml
from torch import nn

from blockforge.errors import BlockforgeError, CorruptFolderError
from blockforge.families.conversion import GENERATION_FILE, SOURCE_FILE, read_source
from blockforge.families.formats import FileNames
from blockforge.io import atomic_write_json, atomic_write_text, read_json, writes_into
from blockforge.nn.build import build_model, layer_parameter_counts, parameter_count
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.recipe import read_yaml
from blockforge.spec.serialize import load_spec, save_spec
from blockforge.tables import markdown_table
from blockforge.train.checkpoint import apply_weights, latest_checkpoint, read_weights, save_weights

EXPORT_FIX = "export the run again"
RUN_FIX = "the checkpoint is damaged; `blockforge train RECIPE --out RUN --resume` continues from the newest intact one"


def weights_of(folder: Path) -> tuple[Path, str]:
    """The weights of an export, or of a run's latest checkpoint, and what to do when they are damaged."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists():
        return folder / "model.safetensors", EXPORT_FIX
    checkpoint = latest_checkpoint(folder)
    if checkpoint is None:
        raise CorruptFolderError(f"{folder}: neither an exported model (model.safetensors) nor a run with a checkpoint; check the path")
    return checkpoint / "model.safetensors", RUN_FIX


def load(path: str | os.PathLike, *, device: str | torch.device = "cpu", attention: str | None = None) -> nn.Module:
    """The model in an export or run folder (a local path, or a URI such as s3://bucket/model), in eval mode. `attention`
    swaps the kernel (e.g. 'sdpa' on CPU).

    Anything missing, damaged or not matching spec.yaml is one BlockforgeError sentence: CorruptFolderError,
    or SpecError for a spec.yaml that is not a valid spec.
    """
    from blockforge.storage import Storage, fetch_folder, is_uri

    folder = fetch_folder(Storage.open(path)) if is_uri(path) else Path(path)  # a URI's folder: a local copy, kept up to date
    if not folder.is_dir():
        raise BlockforgeError(f"{folder}: no such folder; give an export or run folder")
    if not (folder / "spec.yaml").exists():
        return _load_other_format(folder, device, attention)
    spec = load_spec(folder / "spec.yaml")
    if attention is not None:
        spec = dataclasses.replace(spec, attention=attention)
    path, fix = weights_of(folder)
    # Checked against a model on the meta device first: a spec.yaml edited to a huge size allocates nothing.
    weights = read_weights(path, build_model(spec, device="meta"), spec, source="spec.yaml", fix=fix)
    model = build_model(spec, device=device)
    apply_weights(model, weights)
    return _with_tokenizer(model.eval(), folder / "tokenizer")


def tokenizer_folder(folder: Path) -> Path:
    """Where a run or export folder keeps its tokenizer: tokenizer/, or the folder itself (a transformers export)."""
    return folder / "tokenizer" if (folder / "tokenizer").is_dir() else folder


# What a saved tokenizer encodes with: tokenizer.json (blockforge's BPE and every fast tokenizer), or a slow one's files.
VOCABULARIES = (("tokenizer.json",), ("tokenizer.model",), ("spiece.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
TOKENIZER_FIX = "copy it back from the run or model folder this one was written from, or export the model again"


def check_tokenizer(folder: Path) -> None:
    """A saved tokenizer (its tokenizer_config.json in `folder`) refused in one sentence naming its missing vocabulary
    file, before transformers says so in several lines that name none."""
    if any(all((folder / name).is_file() for name in names) for names in VOCABULARIES):
        return
    begun = next((names for names in VOCABULARIES if any((folder / name).is_file() for name in names)), VOCABULARIES[0])
    missing = next(name for name in begun if not (folder / name).is_file())
    raise CorruptFolderError(f"{folder / missing}: is missing, and the tokenizer saved beside it (tokenizer_config.json) cannot "
                             f"encode text without it; {TOKENIZER_FIX}")


def read_tokenizer(folder: Path):
    """The tokenizer a run or export folder keeps (blockforge.data.Tokenizer). A file of it missing or damaged is one
    sentence naming the file; anything else transformers cannot read, its own words on one line."""
    from blockforge.data.tokenizer import load_tokenizer
    from blockforge.errors import DataError
    from blockforge.families.llama_hf import TOKENIZER_FILES

    where = tokenizer_folder(folder)
    if (where / "tokenizer_config.json").is_file():
        check_tokenizer(where)
    try:
        return load_tokenizer(where)
    except DataError as err:
        for name in TOKENIZER_FILES:  # a damaged JSON file is named (transformers gives only a line and column)
            if name.endswith(".json") and (where / name).is_file():
                read_json(where / name, TOKENIZER_FIX)
        raise DataError(" ".join(str(err).split())) from None


def _with_tokenizer(model: nn.Module, tokenizer: Path) -> nn.Module:
    if (tokenizer / "tokenizer_config.json").is_file():
        check_tokenizer(tokenizer)
        model.tokenizer_dir = tokenizer  # its token ids go with the model into other libraries (to_hf_llama)
    return model


def _load_other_format(folder: Path, device, attention: str | None) -> nn.Module:
    """A folder `export --format` wrote for another library, read back by the format that wrote it."""
    from blockforge.spec.family import FAMILIES
    from blockforge.train.checkpoint import model_layout
    from blockforge.train.tensorfile import read_tensors

    for family in FAMILIES.values():
        for exporter in family.exports.values():
            found = exporter.read(folder) if exporter.read is not None else None
            if found is None:
                continue
            spec, tensors = found
            if attention is not None:
                spec = dataclasses.replace(spec, attention=attention)
            model = build_model(spec, device=device)
            if tensors is None or isinstance(tensors, FileNames):  # held under blockforge's own names: checked by name, dtype and shape
                names = tensors.names if tensors is not None else {}
                expected = {names.get(name, name): shape for name, shape in model_layout(build_model(spec, device="meta")).items()}
                found = read_tensors(folder / "model.safetensors", expected, fix=EXPORT_FIX, source=f"its {exporter.library} config")
                ours = {theirs: name for name, theirs in names.items()}
                apply_weights(model, {ours.get(name, name): tensor for name, tensor in found.tensors.items()})
            else:  # converted by the format: every tensor, tied ones under both names
                with torch.no_grad():
                    model.load_state_dict(tensors, strict=True)
            return _with_tokenizer(model.eval(), folder)
    raise CorruptFolderError(f"{folder}: spec.yaml is missing, so this is not a blockforge export or run folder "
                             "(nor a transformers folder blockforge exported)")


def architecture_table(spec: ResolvedSpec, model: nn.Module) -> str:
    headers, rows = spec.layer_table()
    rows = [row + [f"{count:,}"] for row, count in zip(rows, layer_parameter_counts(model))]
    return markdown_table(headers + ["parameters"], rows, "rl" + "r" * (len(headers) - 1))


NATIVE_USAGE = """```python
import blockforge
model = blockforge.load("path/to/this/folder")
```
"""


def parametrization_text(spec: ResolvedSpec) -> str:
    """What the card says of the parametrization: nothing for the standard one; for muP and CompleteP, the base sizes and
    what they multiply in the forward pass (which every export reproduces) and in training (which fine-tuning should keep)."""
    if spec.parametrization == "standard":
        return ""
    base = [f"base width {spec.base_width}"] if spec.base_width else []
    if spec.parametrization == "completep":
        base.append(f"base depth {spec.base_depth}, depth exponent {spec.depth_alpha:g}")
    headers = ["parameter group", "init std", "learning rate", "Adam eps", "weight decay", "forward"]
    name = {"mup": "muP", "completep": "CompleteP"}.get(spec.parametrization, spec.parametrization)
    return f"""
## Parametrization

{name} ({', '.join(base)}): its forward multipliers are part of this model (every export computes them); to fine-tune it
as it was trained, scale each group's settings as below.

{markdown_table(headers, spec.transfer_factors(), "l" + "r" * (len(headers) - 1))}
"""


def model_card(spec: ResolvedSpec, model: nn.Module, recipe: dict, result: dict, data: dict, extra: str = "", usage: str = NATIVE_USAGE,
               source: dict | None = None) -> str:
    """The model card: what the model is and how to load it; for a trained model how it was trained and on what, for a
    converted one where it came from (and nothing about training it did not have)."""
    placements = ", ".join(f"{name} x{n}" for name, n in Counter(layer.placement_name for layer in spec.layers).items())
    head = f"""A {spec.family} model of {parameter_count(model):,} parameters: width {spec.width}, depth {spec.depth},
norm {spec.norm}{', final norm' if spec.final_norm else ''}{', tied embeddings' if spec.tie_embeddings else ''}.
Architecture hash `{spec.arch_hash()}`."""
    if source:
        origin = source.get("base_model") or source.get("name_or_path") or "a transformers model"
        license_line = f"- license: {source['license']} (the source's)\n" if source.get("license") else "- license: not stated by the source\n"
        return f"""# blockforge {spec.family} converted from {source.get('class', source['model_type'])}

{head}

Converted from `{origin}` ({source['model_type']}, stored in {source.get('dtype', 'float32')}); blockforge checked its logits
against the source's on random tokens past its longest window. blockforge did not train it.

{usage}
## Provenance

- source: {origin}
- class: {source.get('class', '?')} (model_type {source['model_type']})
{license_line}
## Architecture

{architecture_table(spec, model)}
{parametrization_text(spec)}{extra}"""
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    metric_lines = "\n".join(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}" for key, value in sorted(metrics.items()))
    train = recipe.get("train") if isinstance(recipe.get("train"), dict) else {}
    data_lines = "\n".join(f"- {key}: {value}" for key, value in data.items())
    lines = []
    if result.get("status") is not None:
        of = f" of {train['steps']}" if "steps" in train else ""
        lines.append(f"- status: {result['status']} after {result.get('step', '?')}{of} steps")
    if train:
        lines.append(f"- optimizer {train.get('optimizer', 'adam')}, peak lr {train.get('lr')}, batch {train.get('batch_size')}, seed {train.get('seed')}")
    training = "\n".join(lines) or "- no training record (result.json and recipe.yaml are missing)"
    return f"""# blockforge {spec.family} ({placements})

{head}

{usage}
## Architecture

{architecture_table(spec, model)}
{parametrization_text(spec)}
## Training

{training}

## Data

{data_lines or '- (not recorded)'}

## Final metrics

{metric_lines or '- (none recorded)'}
{extra}"""


def _replaceable(out: Path, force: bool, run_dir: Path | None) -> None:
    """Refuse an --out that holds anything but an earlier export (that one only with --force), or lies under a file."""
    if out.exists() and not out.is_dir():
        raise BlockforgeError(f"{out}: is a file; choose a folder for --out")
    blocking = next((parent for parent in out.absolute().parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise BlockforgeError(f"{out}: lies under {blocking}, which is a file; choose a folder for --out")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise BlockforgeError(f"{out}: is not empty; pass --force to replace the export in it, or choose another --out")
    if run_dir is not None and run_dir.resolve().is_relative_to(out.resolve()):
        raise BlockforgeError(f"{out}: holds the run folder {run_dir} itself; choose another --out")
    exported = any((out / name).exists() for name in ("model.safetensors", "model.gguf"))  # what each format writes its weights to
    if not exported or (out / "checkpoints").exists() or (out / "search.json").exists():
        raise BlockforgeError(f"{out}: holds files that are not an earlier export, and --force replaces only an export; choose another --out")


def _remove_abandoned(out: Path) -> None:
    """Remove what an export into `out` killed before it finished left beside it (.NAME.partial-PID-*, its process gone)."""
    from blockforge.lock import process_alive

    for leftover in out.parent.glob(f".{out.name}.partial-*") if out.parent.is_dir() else ():
        pid = leftover.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def export_folder(out: str | os.PathLike, *, force: bool = False, run_dir: str | os.PathLike | None = None) -> Iterator[Path]:
    """An empty folder beside `out` to write an export into; it replaces `out` only once the block finished.

    A non-empty `out` is refused unless `force` (and then only an earlier export, never the run itself).
    """
    out = Path(out)
    _replaceable(out, force, Path(run_dir) if run_dir is not None else None)
    _remove_abandoned(out)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage, old = out.parent / f".{out.name}.partial-{tag}", out.parent / f".{out.name}.old-{tag}"
    with writes_into(out.parent, "the export", "free space there or choose another --out"):
        stage.mkdir(parents=True)
    try:
        yield stage
        if out.exists() and any(out.iterdir()):
            out.rename(old)  # the earlier export steps aside, then goes once the new one is in place
        os.replace(stage, out)  # over an empty folder, or into a free name
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if old.exists() and not out.exists():
            old.rename(out)  # the swap failed half-way: the earlier export comes back


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, extra_card: str = "", force: bool = False,
               format: str = "blockforge", dtype: str | None = None, target: str | None = None) -> Path:
    """Write the run's latest weights and records (or a model folder's: a converted model's too) into `out_dir` as an
    exported model in `format` (see EXPORT_FORMATS), its weights at `dtype` (fp32, bf16 or fp16; other libraries'
    formats only; default float32, or a converted model's source precision); `force` replaces an earlier export there;
    `target` (vllm) refuses first what that serving engine cannot run."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "spec.yaml").exists():
        raise BlockforgeError(f"{run_dir}: not a run folder (spec.yaml is missing); give the folder `blockforge train --out` wrote")
    if out_dir.resolve() == run_dir.resolve():
        raise BlockforgeError(f"{out_dir}: export into a new folder, not the run folder itself")
    torch_dtype = export_dtype(dtype, format)
    _replaceable(out_dir, force, run_dir)
    if format != "blockforge" or target is not None:
        exporter = export_format(format, load_spec(run_dir / "spec.yaml"), target)
        with export_folder(out_dir, force=force, run_dir=run_dir) as stage:
            _convert_into(run_dir, stage, exporter, extra_card, torch_dtype)
        return out_dir
    model = load(run_dir)
    spec = model.spec
    result, data, recipe = _run_records(run_dir)
    source = read_source(run_dir)
    with export_folder(out_dir, force=force, run_dir=run_dir) as stage:
        save_weights(model, stage / "model.safetensors", spec)
        save_spec(spec, stage / "spec.yaml")
        with writes_into(stage, "the export", "free space there or choose another --out"):
            for record in (SOURCE_FILE, GENERATION_FILE):  # where it came from
                if (run_dir / record).exists():
                    shutil.copyfile(run_dir / record, stage / record)
            if (run_dir / "recipe.yaml").exists():  # what it was trained with, and on
                atomic_write_text(stage / "recipe.yaml", yaml.safe_dump(recipe, sort_keys=False))
            if (run_dir / "data.json").exists():
                atomic_write_json(stage / "data.json", data)
            if (run_dir / "tokenizer").is_dir():
                shutil.copytree(run_dir / "tokenizer", stage / "tokenizer")
        if source is None:
            metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
            atomic_write_json(stage / "metrics.json", {"status": result.get("status"), "step": result.get("step"), **metrics})
        atomic_write_text(stage / "README.md", model_card(spec, model, recipe, result, data, extra_card, source=source))
    return out_dir


def export_dtype(dtype: str | None, format: str) -> torch.dtype | None:
    """The torch dtype `--dtype` names (None: the format's default); blockforge's own format keeps float32."""
    from blockforge.errors import unknown_choice_message
    from blockforge.families.formats import DTYPES

    if dtype is None:
        return None
    if dtype not in EXPORT_DTYPES:
        raise BlockforgeError(f"--dtype: {unknown_choice_message(dtype, EXPORT_DTYPES)}")
    if format == "blockforge" and dtype != "fp32":
        raise BlockforgeError(f"--dtype {dtype}: blockforge's own format keeps float32, the precision blockforge.load builds; "
                              "give --format hf or timm for a narrower export")
    return DTYPES[dtype]


EXPORT_DTYPES = ("fp32", "bf16", "fp16")


# Other libraries' formats: the native export is written to a scratch folder, then converted by the
# family's ExportFormat (families/formats.py), which verifies what it writes.

EXPORT_FORMATS = ("blockforge", "hf", "timm", "gguf")


def export_format(format: str, spec: ResolvedSpec, target: str | None = None):
    """The family's ExportFormat for `format`, after it accepted `spec` (and, with `target`, that serving engine did);
    refused in one sentence otherwise."""
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
    if target is not None:
        check_target(target, format, spec)
    exporter.check(spec)
    return exporter


# Serving engines an export can be checked for (--target): the format each reads, and what it cannot run of a spec.
def _vllm_problems(spec: ResolvedSpec) -> list[str]:
    from blockforge.families.hf_export import vllm_problems

    return vllm_problems(spec)


EXPORT_TARGETS = {"vllm": ("hf", _vllm_problems)}


def check_target(target: str, format: str, spec: ResolvedSpec) -> None:
    """Refuse, by name, what serving engine `target` cannot run of `spec` in `format`."""
    from blockforge.errors import unknown_choice_message

    if target not in EXPORT_TARGETS:
        raise BlockforgeError(f"--target: {unknown_choice_message(target, tuple(EXPORT_TARGETS))}")
    reads, problems = EXPORT_TARGETS[target]
    if format != reads:
        raise BlockforgeError(f"--target {target} serves --format {reads} exports; give --format {reads}")
    found = problems(spec)
    if found:
        raise BlockforgeError(f"--target {target}: {target} cannot run this model as exported: {'; '.join(found)}; export it without "
                              f"--target to serve it with transformers")


def check_export_format(format: str, spec: ResolvedSpec, target: str | None = None) -> None:
    """Refuse `format` (and `target`) for `spec` before any training or writing (search exports call it before a retrain)."""
    if format != "blockforge" or target is not None:
        export_format(format, spec, target)


def _run_records(run_dir: Path) -> tuple[dict, dict, dict]:
    """The run's result, data description and recipe (empty where a record is missing; a damaged one refused)."""
    damaged = "it is damaged; fix or delete it and export again"
    result = read_json(run_dir / "result.json", damaged) if (run_dir / "result.json").exists() else {}
    data = read_json(run_dir / "data.json", damaged) if (run_dir / "data.json").exists() else {}
    recipe = read_yaml(run_dir / "recipe.yaml") if (run_dir / "recipe.yaml").exists() else {}
    if not isinstance(result, dict) or not isinstance(data, dict) or not isinstance(recipe, dict):
        raise CorruptFolderError(f"{run_dir}: result.json, data.json or recipe.yaml is not a mapping; {damaged}")
    return result, *_without_local_sets(data, recipe)


def _without_local_sets(data: dict, recipe: dict) -> tuple[dict, dict]:
    """The run's data description and recipe as an export carries them: without the folder its node read a prepared set
    from (its cache, or a local path), which names that machine and nothing elsewhere; a set in a storage (a URI) is
    named still, and every set by its fingerprint."""
    from blockforge.storage import is_uri

    def local(where) -> bool:
        return isinstance(where, str) and not is_uri(where)

    data = {key: value for key, value in data.items() if not (key == "prepared" and local(value))}
    recipe_data = recipe.get("data")
    if isinstance(recipe_data, dict) and local(recipe_data.get("prepared")):
        recipe = {**recipe, "data": {key: value for key, value in recipe_data.items() if key != "prepared"}}
    return data, recipe


def _convert_into(run_dir: Path, out_dir: Path, exporter, extra_card: str = "", dtype: torch.dtype | None = None) -> None:
    """The run in another library's format: its native export in a scratch folder, then converted into (empty) `out_dir`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".native-", dir=out_dir) as scratch:
        native = export_run(run_dir, Path(scratch) / "native", extra_card=extra_card)
        model = load(native, attention="sdpa")  # the kernel does not change what the model computes; sdpa runs anywhere
        result, data, recipe = _run_records(run_dir)
        card = model_card(model.spec, model, recipe, result, data, extra_card, usage=exporter.usage(model.spec, native), source=read_source(native))
        exporter.write(model, native, out_dir, card, dtype)


def _front_matter(folder: Path) -> dict:
    """The YAML header of a model card (README.md) in `folder`, {} when there is none or it does not read."""
    import yaml

    card = folder / "README.md"
    if not card.is_file():
        return {}
    text = card.read_text(errors="replace")
    if not text.startswith("---"):
        return {}
    header = text[3:].split("\n---", 1)[0]
    try:
        fields = yaml.safe_load(header)
    except yaml.YAMLError:
        return {}
    return fields if isinstance(fields, dict) else {}


def _public_name(name: str) -> str:
    """`name` as a card may show it: a hub id as it is, a local path by its last part."""
    if not name:
        return ""
    return _hub_name(name) or Path(name.rstrip("/")).name


def _hub_name(name: str) -> str | None:
    """`name` when it looks like a hub id (org/model) rather than a local path."""
    parts = name.split("/")
    return name if len(parts) == 2 and all(parts) and not Path(name).exists() and not name.startswith((".", "~")) else None


def _save_tokenizer(tokenizer, folder: Path) -> None:
    """A tokenizer into `folder`: a transformers tokenizer saved, or a folder's tokenizer files copied as they are."""
    from blockforge.data.tokenizer import load_tokenizer
    from blockforge.errors import DataError
    from blockforge.families.llama_hf import TOKENIZER_FILES

    folder.mkdir()
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(folder)
    else:
        source = Path(tokenizer)
        copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
        if "tokenizer_config.json" not in copied:
            raise BlockforgeError(f"{source}: no tokenizer here (tokenizer_config.json is missing); give the folder the tokenizer was saved to")
        for name in copied:
            shutil.copyfile(source / name, folder / name)
    try:
        load_tokenizer(folder)
    except DataError as err:
        raise BlockforgeError(f"the tokenizer given to save does not read back ({err}); give another") from None


def save(model: nn.Module, out: str | os.PathLike, *, tokenizer=None, force: bool = False, base_model: str | None = None,
         license: str | None = None) -> Path:
    """Write an in-memory model as a blockforge model folder, which blockforge.load, `blockforge generate` and
    `blockforge export --format hf` read: model.safetensors, spec.yaml and a card, and its tokenizer (`tokenizer`: a
    transformers tokenizer or a folder holding one; by default that of the folder a converted model was read from).

    A model from blockforge.from_hf keeps its source: source.json (class, base model, license, precision, token ids)
    and generation_config.json (eos lists, sampling defaults), so it leaves again as the class it came as, with the same
    tokenizer and generation settings. `base_model` and `license` default to those of the source folder's model card.
    """
    from blockforge.families.llama_hf import _float32_cpu_copy

    spec = getattr(model, "spec", None)
    if not isinstance(spec, ResolvedSpec):
        raise BlockforgeError(f"save takes a blockforge model (from blockforge.build_model, load or from_hf), not a {type(model).__name__}; "
                              "convert a transformers model first with blockforge.from_hf")
    if not str(out).strip():
        raise BlockforgeError("save needs a folder to write the model into, not an empty path")
    for flag, value in (("--base-model", base_model), ("--license", license)):
        if value is not None and (not value.strip() or any(ord(c) < 32 or c == "\x7f" for c in value)):
            raise BlockforgeError(f"{flag} {value!r}: must be one line of printable text (a hub id such as org/name, a license id "
                                  "such as apache-2.0), which the card's header names as it is")
    record = getattr(model, "hf_source", None)
    folder = Path(record["folder"]) if record and record.get("folder") else None
    if tokenizer is None and folder is not None and (folder / "tokenizer_config.json").is_file():
        tokenizer = folder
    card_fields = _front_matter(folder) if folder is not None else {}
    model = _float32_cpu_copy(model)
    with export_folder(out, force=force) as stage:
        save_weights(model, stage / "model.safetensors", spec)
        save_spec(spec, stage / "spec.yaml")
        if tokenizer is not None:
            _save_tokenizer(tokenizer, stage / "tokenizer")
        source = None
        if record is not None:
            source = {
                # a hub id as it is; a local folder by its name only (its path on this machine means nothing elsewhere)
                "model_type": record["model_type"], "class": record.get("class"), "name_or_path": _public_name(record.get("name_or_path") or ""),
                "base_model": base_model or card_fields.get("base_model") or _hub_name(record.get("name_or_path") or "") or None,
                "license": license or card_fields.get("license"), "dtype": record.get("dtype", "float32"),
                "token_ids": dict(getattr(model, "token_ids", None) or {}),
            }
            atomic_write_json(stage / SOURCE_FILE, source)
            if folder is not None and (folder / GENERATION_FILE).is_file():
                from blockforge.families.conversion import check_generation

                check_generation(folder / GENERATION_FILE, "correct it or delete it in the source folder, then convert again")
                shutil.copyfile(folder / GENERATION_FILE, stage / GENERATION_FILE)
            elif record.get("generation_config"):
                from transformers import GenerationConfig

                GenerationConfig.from_dict(dict(record["generation_config"])).save_pretrained(stage)
        atomic_write_text(stage / "README.md", model_card(spec, model, {}, {}, {}, source=source))
    return Path(out)
