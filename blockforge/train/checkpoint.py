"""Checkpoints: safetensors for weights, optimizer state and RNG states, JSON for the rest; nothing pickled.

A checkpoint is a folder `checkpoints/step-NNNNNNNN/` written completely before `checkpoints/latest.json`
is atomically switched to it, so a run killed at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write, atomic_write_json

CHECKPOINT_FORMAT = 1


def _options(sharded: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Sharded (FSDP) models gather full tensors to the CPU of every rank; others are full already.
    return StateDictOptions(full_state_dict=sharded, cpu_offload=sharded)


def model_tensors(model: nn.Module, sharded: bool = False) -> dict[str, torch.Tensor]:
    """The model's weights as full CPU tensors, tied duplicates dropped (safetensors refuses shared memory)."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=_options(True))
    else:
        state = model.state_dict()
    tensors, seen = {}, set()
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tensor.device, tensor.shape)
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().cpu().contiguous()
    return tensors


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


def save_checkpoint(
    run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, *, keep: int = 1,
    sharded: bool = False, write: bool = True,
) -> Path | None:
    """Write a checkpoint for `state['step']` and point latest.json at it; older ones beyond `keep` go.

    With a sharded model every rank must call this (the weights are gathered to rank 0); only `write` ranks write.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    weights = model_tensors(model, sharded)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=_options(sharded))  # keyed by parameter name
    if not write:
        return None
    tensors, meta = _optimizer_to_tensors(optimizer_state)
    root = Path(run_dir) / "checkpoints"
    folder = root / f"step-{state['step']:08d}"
    if folder.exists():
        shutil.rmtree(folder)
    partial = root / f".partial-{folder.name}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    save_file(weights, str(partial / "model.safetensors"))
    save_file(tensors, str(partial / "optimizer.safetensors"))
    save_file(_rng_tensors(), str(partial / "rng.safetensors"))
    python_state = random.getstate()
    record = dict(state, format=CHECKPOINT_FORMAT, optimizer=meta, python_rng=[python_state[0], list(python_state[1]), python_state[2]])
    (partial / "state.json").write_text(json.dumps(record))
    partial.rename(folder)
    atomic_write_json(root / "latest.json", {"step": state["step"], "path": folder.name})
    finished = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in finished[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest.json"
    if not pointer.exists():
        return None
    folder = pointer.parent / json.loads(pointer.read_text())["path"]
    return folder if folder.is_dir() else None


def read_state(folder: Path) -> dict:
    record = json.loads((Path(folder) / "state.json").read_text())
    if record.get("format", 0) > CHECKPOINT_FORMAT:
        raise BlockforgeError(f"{folder}: checkpoint format {record['format']} is newer than this blockforge reads; upgrade blockforge")
    return record


def load_training_state(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, sharded: bool = False) -> dict:
    """Restore optimizer and RNG states from `folder` (weights: load_weights, before any sharding); returns the saved state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    folder = Path(folder)
    record = read_state(folder)
    saved = _optimizer_from_tensors(load_file(str(folder / "optimizer.safetensors")), record["optimizer"])
    set_optimizer_state_dict(model, optimizer, saved, options=_options(sharded))
    _restore_rng(load_file(str(folder / "rng.safetensors")), record["python_rng"])
    return {k: v for k, v in record.items() if k not in ("optimizer", "python_rng", "format")}


def load_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Weights, optimizer and RNG states of an unsharded model; returns the saved training state."""
    load_weights(model, Path(folder) / "model.safetensors")
    return load_training_state(folder, model, optimizer)


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights strictly; a mismatch with the spec is one clear sentence."""
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        detail = next((line.strip() for line in first if "size mismatch" in line), first[-1].strip() if first else "")
        raise BlockforgeError(f"{path}: the weights do not fit the model its spec.yaml describes ({detail})") from None
    except FileNotFoundError:
        raise BlockforgeError(f"{path}: weights file not found") from None
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(sorted(missing)[:3])}{' ...' if len(missing) > 3 else ''}")
        if unexpected:
            parts.append(f"unexpected {', '.join(sorted(unexpected)[:3])}{' ...' if len(unexpected) > 3 else ''}")
        raise BlockforgeError(f"{path}: the weights do not match the model its spec.yaml describes ({'; '.join(parts)})")


def save_weights(model: nn.Module, path: Path) -> None:
    weights = model_tensors(model)
    atomic_write(path, lambda tmp: save_file(weights, tmp))
