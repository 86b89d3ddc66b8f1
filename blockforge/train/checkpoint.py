"""Checkpoints: safetensors for weights, optimizer state and RNG states, JSON for the rest; nothing pickled.

A checkpoint is a folder `checkpoints/step-NNNNNNNN/` written completely (as `.partial-step-NNNNNNNN/`,
then renamed) before `checkpoints/latest.json` is atomically switched to it, so a run killed at any
moment leaves the previous checkpoint intact; the last two are kept (a search's trials keep one, and a run no stage will
continue keeps only its final weights: keep_final_weights). Each safetensors file carries a
checksum, the weights also the resolved spec they belong to, and state.json the checksums of the three
files, so a checkpoint is read back only whole and unchanged (see tensorfile). Resuming takes the newest
intact checkpoint and says which one it skipped, and why.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from blockforge.errors import BlockforgeError, CorruptFolderError, SpecError, warn
from blockforge.io import atomic_write_json, read_json, writes_into
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.serialize import spec_from_yaml
from blockforge.spec.strict import to_plain
from blockforge.train.tensorfile import SPEC, Layout, TensorFile, first_difference, layout, read_tensors, spec_metadata, write_tensors

CHECKPOINT_FORMAT = 2  # 2: checksums in every file and in state.json
KEEP = 2  # checkpoints kept: the newest, and one to fall back to
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
_NAME = re.compile(r"^step-(\d{8,})$")


def _options(sharded: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Sharded (FSDP) models gather full tensors to the CPU of every rank; others are full already.
    return StateDictOptions(full_state_dict=sharded, cpu_offload=sharded)


def tied_duplicates(model: nn.Module) -> set[str]:
    """Names of parameters tied to an earlier one (a tied head): written once, under the first name."""
    seen, duplicates = set(), set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            duplicates.add(name)
        seen.add(id(parameter))
    return duplicates


def model_tensors(model: nn.Module, sharded: bool = False) -> dict[str, torch.Tensor]:
    """The model's weights as full CPU tensors, tied duplicates dropped (safetensors refuses shared memory)."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=_options(True))
    else:
        state = model.state_dict()
    duplicates = tied_duplicates(model)
    return {name: tensor.detach().cpu().contiguous() for name, tensor in state.items() if name not in duplicates}


def model_layout(model: nn.Module) -> Layout:
    """What a weights file for `model` must hold: names, dtypes and shapes (a model on the meta device will do)."""
    duplicates = tied_duplicates(model)
    return layout({name: tensor for name, tensor in model.state_dict().items() if name not in duplicates})


# ---- writing ----------------------------------------------------------------------------------


def weights_metadata(spec: ResolvedSpec) -> dict[str, str]:
    return spec_metadata(to_plain(spec))


def save_weights(model: nn.Module, path: Path, spec: ResolvedSpec | None = None) -> str:
    """Write the model's weights, tied to `spec` (default: the model's own); returns their checksum."""
    return write_tensors(Path(path), model_tensors(model), weights_metadata(spec or model.spec))


def _optimizer_to_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Flatten an optimizer state dict keyed by parameter name into tensors and JSON."""
    tensors, scalars = {}, {}
    for name, slots in state["state"].items():
        for slot, value in slots.items():
            key = f"state.{name}.{slot}"
            if torch.is_tensor(value):
                tensors[key] = value.detach().cpu().contiguous()
            else:
                scalars[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[str, dict[str, Any]] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        name, slot = key.removeprefix("state.").rsplit(".", 1)
        state.setdefault(name, {})[slot] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]  # JSON made it a list
    return {"state": state, "param_groups": groups}


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    numpy_state = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(numpy_state[1].astype(np.int64))
    return tensors


def _restore_rng(tensors: dict[str, torch.Tensor], python_state: list) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(("MT19937", tensors["numpy_keys"].numpy().astype(np.uint32), 0, 0, 0.0))
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))


def step_of(folder: Path) -> int | None:
    match = _NAME.match(Path(folder).name)
    return int(match.group(1)) if match else None


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """The run's finished checkpoint folders, newest first (by step, whatever latest.json says)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir()]
    return sorted(found, key=step_of, reverse=True)


def _prune(root: Path, step: int, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to `step`; later ones (left by a run resumed from an older one) go."""
    kept = 0
    for folder in checkpoint_folders(root.parent):
        if step_of(folder) <= step and kept < keep:
            kept += 1
            continue
        shutil.rmtree(folder, ignore_errors=True)


FINAL = "model.safetensors"  # in a run folder kept for reading only: the weights of its newest checkpoint, without the rest


def keep_final_weights(run_dir: Path) -> int:
    """Thin a run nothing will continue to its final weights: the newest whole checkpoint's model.safetensors becomes the
    run folder's own (what load, eval, export and analyze read), then the checkpoints (optimizer and RNG states) go.
    Either order of a kill leaves a readable run. Returns the bytes freed."""
    run_dir = Path(run_dir)
    whole = [folder for folder in checkpoint_folders(run_dir) if (folder / "state.json").is_file() and (folder / FINAL).is_file()]
    if not whole:
        return 0
    freed = sum(f.stat().st_size for f in (run_dir / "checkpoints").rglob("*") if f.is_file())
    with writes_into(run_dir, "the run's final weights", "free space there"):
        if not (run_dir / FINAL).is_file():
            staged = run_dir / f".{FINAL}.thin"
            shutil.copyfile(whole[0] / FINAL, staged)
            staged.replace(run_dir / FINAL)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return freed - (run_dir / FINAL).stat().st_size


def save_checkpoint(
    run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, *, keep: int = KEEP,
    sharded: bool = False, write: bool = True,
) -> Path | None:
    """Write a checkpoint for `state['step']` and point latest.json at it; older ones beyond `keep` go.

    With a sharded model every rank must call this (the weights are gathered to rank 0); only `write` ranks
    write. A failed write (a full disk) removes what it wrote and is one WriteError naming the folder.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    weights = model_tensors(model, sharded)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=_options(sharded))  # keyed by parameter name
    if not write:
        return None
    tensors, meta = _optimizer_to_tensors(optimizer_state)
    root = Path(run_dir) / "checkpoints"
    step = state["step"]
    folder = root / f"step-{step:08d}"
    partial = root / f".partial-{folder.name}"
    previous = [step_of(p) for p in checkpoint_folders(run_dir) if step_of(p) < step]
    fix = (f"free space there and continue with --resume (from the intact checkpoint of step {previous[0]})" if previous
           else "free space there and train again")
    try:
        with writes_into(root, f"the checkpoint of step {step}", fix):
            for stale in root.glob(".partial-*"):  # left by a run killed while writing
                shutil.rmtree(stale, ignore_errors=True)
            partial.mkdir(parents=True)
            files = {
                "model.safetensors": write_tensors(partial / "model.safetensors", weights, weights_metadata(model.spec)),
                "optimizer.safetensors": write_tensors(partial / "optimizer.safetensors", tensors),
                "rng.safetensors": write_tensors(partial / "rng.safetensors", _rng_tensors()),
            }
            python_state = random.getstate()
            record = dict(state, format=CHECKPOINT_FORMAT, optimizer=meta, files=files,
                          python_rng=[python_state[0], list(python_state[1]), python_state[2]])
            atomic_write_json(partial / "state.json", record)
            if folder.exists():
                shutil.rmtree(folder)
            partial.rename(folder)
            atomic_write_json(root / "latest.json", {"step": step, "path": folder.name})
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    _prune(root, step, keep)
    return folder


# ---- reading ----------------------------------------------------------------------------------


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


class OutsideRunError(CorruptFolderError):
    """A latest.json naming something other than a checkpoint folder of its run (never followed, never skipped)."""


LATEST_FIX = "continue the run with `blockforge train RECIPE --out RUN --resume`, which finds the newest intact checkpoint"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder checkpoints/latest.json names (None when there is no latest.json); refuses one outside the run."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest.json"
    if not pointer.exists():
        return None
    record = read_json(pointer, LATEST_FIX)
    name = record.get("path") if isinstance(record, dict) else None
    if not isinstance(name, str):
        raise CorruptFolderError(f"{pointer}: has no \"path\" naming a checkpoint folder; {LATEST_FIX}")
    folder = root / name
    if step_of(Path(name)) is None or name != Path(name).name or not _inside(folder, root):
        raise OutsideRunError(f"{pointer}: names '{name}', which is not a step-NNNNNNNN folder inside {root}; "
                              "point it at one of those folders or delete it")
    if not folder.is_dir():
        raise CorruptFolderError(f"{pointer}: names {name}, which does not exist; {LATEST_FIX}")
    return folder


def _mismatch_fix(source: str) -> str:
    if source == "spec.yaml":
        return "restore the spec.yaml that was written with these weights"
    return "continue with the recipe and --set flags that started the run"


def _check_spec(weights: TensorFile, spec: ResolvedSpec, source: str, fix: str) -> None:
    """Refuse weights written for a spec other than `spec` (the attention kernel may differ: it computes the same)."""
    stored = weights.metadata.get(SPEC)
    try:
        written = to_plain(spec_from_yaml(json.loads(stored)))
    except (ValueError, TypeError, SpecError):
        raise CorruptFolderError(f"{weights.path}: the spec stored with the weights cannot be read; {fix}") from None
    current = to_plain(spec)
    del written["attention"], current["attention"]
    difference = first_difference(written, current)
    if difference is not None:
        key, then, now = difference
        raise CorruptFolderError(f"{weights.path}: these weights were trained with {key}: {then}, but {source} says {now}; "
                                 f"{_mismatch_fix(source)}")


def read_weights(path: Path, model: nn.Module, spec: ResolvedSpec, *, source: str, fix: str) -> TensorFile:
    """The weights at `path`, checked: names, dtypes and shapes against `model`, checksum, and the spec they belong to.

    `source` names where `spec` came from in sentences ('spec.yaml', 'the recipe').
    """
    weights = read_tensors(path, model_layout(model), fix=fix, source=source, mismatch_fix=_mismatch_fix(source))
    if weights.checksum is None:
        warn(f"{path}: written without a checksum by an earlier blockforge, so these weights cannot be checked against {source}; "
             "export or checkpoint them again to add one")
    elif SPEC in weights.metadata:
        _check_spec(weights, spec, source, fix)
    return weights


def apply_weights(model: nn.Module, weights: TensorFile | dict[str, torch.Tensor]) -> None:
    """Copy checked weights into `model` (tied weights go in once, through their first name)."""
    tensors = weights.tensors if isinstance(weights, TensorFile) else weights
    with torch.no_grad():
        model.load_state_dict(tensors, strict=False)


def load_weights(model: nn.Module, path: Path, *, source: str = "the model's spec", fix: str = "give the weights of this spec") -> None:
    """Load weights checked against `model` and its spec; a mismatch or damage is one CorruptFolderError sentence."""
    apply_weights(model, read_weights(path, model, model.spec, source=source, fix=fix))


@dataclass
class Checkpoint:
    """A checkpoint read back whole and checked; `restore` puts it into a model and optimizer."""

    folder: Path
    step: int
    weights: TensorFile
    optimizer: TensorFile
    rng: TensorFile
    record: dict

    def training_state(self) -> dict:
        return {k: v for k, v in self.record.items() if k not in ("optimizer", "python_rng", "format", "files")}


def _check_record(folder: Path, record: Any, fix: str) -> dict:
    path = folder / "state.json"
    if not isinstance(record, dict):
        raise CorruptFolderError(f"{path}: is not a JSON object; {fix}")
    if not isinstance(record.get("format", 0), int):
        raise CorruptFolderError(f"{path}: \"format\" is not a number; {fix}")
    if record.get("format", 0) > CHECKPOINT_FORMAT:
        raise BlockforgeError(f"{folder}: checkpoint format {record['format']} is newer than this blockforge reads; upgrade blockforge")
    for key, kind in (("step", int), ("data_position", int), ("optimizer", dict), ("python_rng", list)):
        if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
            raise CorruptFolderError(f"{path}: \"{key}\" is missing or of the wrong type; {fix}")
    optimizer = record["optimizer"]
    if not isinstance(optimizer.get("param_groups"), list) or not isinstance(optimizer.get("scalars"), dict):
        raise CorruptFolderError(f"{path}: the optimizer's parameter groups are missing or of the wrong type; {fix}")
    if record["step"] != step_of(folder):
        raise CorruptFolderError(f"{path}: says step {record['step']}, but the folder is {folder.name}; {fix}")
    return record


def _check_rng(checkpoint: Checkpoint, fix: str) -> None:
    """Try the saved RNG states on fresh generators, so a bad one is refused before any is restored."""
    tensors, python_state = checkpoint.rng.tensors, checkpoint.record["python_rng"]
    try:
        torch.Generator().set_state(tensors["torch_cpu"])
        np.random.RandomState().set_state(("MT19937", tensors["numpy_keys"].numpy().astype(np.uint32), 0, 0, 0.0))
        random.Random().setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError, OverflowError) as err:
        raise CorruptFolderError(f"{checkpoint.folder}: the saved random number generator states are invalid ({err}); {fix}") from None


def _check_optimizer(checkpoint: Checkpoint, model: nn.Module, fix: str) -> None:
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}
    for key, tensor in checkpoint.optimizer.tensors.items():
        name = key.removeprefix("state.").rsplit(".", 1)[0]
        if not key.startswith("state.") or name not in shapes:
            raise CorruptFolderError(f"{checkpoint.optimizer.path}: holds {key}, which is not the state of a parameter of this model; {fix}")
        if tensor.ndim and tuple(tensor.shape) != shapes[name]:
            raise CorruptFolderError(f"{checkpoint.optimizer.path}: holds {key} with shape {list(tensor.shape)}, "
                                     f"but the parameter is {list(shapes[name])}; {fix}")


def read_checkpoint(folder: Path, model: nn.Module, spec: ResolvedSpec, *, source: str = "the recipe", fix: str | None = None) -> Checkpoint:
    """Every file of the checkpoint in `folder`, checked against each other, `model` and `spec`."""
    folder = Path(folder)
    fix = fix or "continue from an earlier checkpoint, or train again"
    run_dir = folder.parent.parent
    for name in FILES + ("state.json",):
        if (folder / name).exists() and not _inside(folder / name, run_dir):
            raise CorruptFolderError(f"{folder / name}: links outside the run folder {run_dir}; replace it with the file itself")
    record = _check_record(folder, read_json(folder / "state.json", fix), fix)
    weights = read_weights(folder / "model.safetensors", model, spec, source=source, fix=fix)
    rng_layout = {"torch_cpu": ("U8", tuple(torch.get_rng_state().shape)), "numpy_keys": ("I64", (624,))}
    checkpoint = Checkpoint(
        folder, record["step"], weights,
        read_tensors(folder / "optimizer.safetensors", None, fix=fix),
        read_tensors(folder / "rng.safetensors", rng_layout, fix=fix, source="a checkpoint", verbs=("holds", "does not hold"),
                     optional=("torch_cuda_",)),
        record,
    )
    for name, stored in (record.get("files") or {}).items():
        file = {"model.safetensors": checkpoint.weights, "optimizer.safetensors": checkpoint.optimizer, "rng.safetensors": checkpoint.rng}.get(name)
        if file is not None and file.checksum != stored:
            raise CorruptFolderError(f"{file.path}: is not the file this checkpoint was written with (its checksum differs from state.json's); {fix}")
    _check_optimizer(checkpoint, model, fix)
    _check_rng(checkpoint, fix)
    return checkpoint


def resume_checkpoint(run_dir: Path, model: nn.Module, spec: ResolvedSpec, *, say: Callable[[str], None] = warn) -> Checkpoint:
    """The newest intact checkpoint of `run_dir` (by step: a cut-off latest.json is no reason to stop).

    What was skipped, and why, is said in one line through `say`; none intact is one sentence.
    """
    skipped = []
    try:
        latest_checkpoint(run_dir)
    except OutsideRunError:
        raise
    except CorruptFolderError as err:
        skipped.append(str(err).split("; ")[0])
    problems: list[CorruptFolderError] = []
    for folder in checkpoint_folders(run_dir):
        try:
            checkpoint = read_checkpoint(folder, model, spec)
        except CorruptFolderError as err:
            problems.append(err)
            skipped.append(f"{folder.name} is damaged ({str(err).split('; ')[0]})")
            continue
        if skipped:
            say(f"resuming from {folder.name}, the newest intact checkpoint; skipped: {'; '.join(skipped)}")
        return checkpoint
    if not problems:
        raise BlockforgeError(f"{run_dir}: has no checkpoint to resume from; start the run without --resume")
    others = f" (the {len(problems) - 1} older ones are damaged too)" if len(problems) > 1 else ""
    raise CorruptFolderError(f"no intact checkpoint to resume from{others}: {problems[0]}")


def restore_training_state(checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer, *, sharded: bool = False) -> dict:
    """Put the checkpoint's optimizer and RNG states in place (weights: apply_weights, before any sharding)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    saved = _optimizer_from_tensors(checkpoint.optimizer.tensors, checkpoint.record["optimizer"])
    try:
        set_optimizer_state_dict(model, optimizer, saved, options=_options(sharded))
    except (KeyError, ValueError, RuntimeError, TypeError) as err:
        raise CorruptFolderError(f"{checkpoint.optimizer.path}: does not fit this run's optimizer ({err}); "
                                 "continue with the recipe that started the run") from None
    _restore_rng(checkpoint.rng.tensors, checkpoint.record["python_rng"])
    return checkpoint.training_state()


def load_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Weights, optimizer and RNG states of an unsharded model; returns the saved training state."""
    checkpoint = read_checkpoint(folder, model, model.spec)
    apply_weights(model, checkpoint.weights)
    return restore_training_state(checkpoint, model, optimizer)
