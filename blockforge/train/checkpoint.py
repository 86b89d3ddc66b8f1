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
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write, atomic_write_json

CHECKPOINT_FORMAT = 1


def _optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            key = f"state.{index}.{name}"
            if torch.is_tensor(value):
                tensors[key] = value.detach().contiguous().cpu()
            else:
                scalars[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_tensors(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
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


def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, keep: int = 1) -> Path:
    """Write a checkpoint for `state['step']` and point latest.json at it; older ones beyond `keep` go."""
    root = Path(run_dir) / "checkpoints"
    folder = root / f"step-{state['step']:08d}"
    if folder.exists():
        shutil.rmtree(folder)
    partial = root / f".partial-{folder.name}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    save_model(model, str(partial / "model.safetensors"))
    tensors, meta = _optimizer_to_tensors(optimizer)
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


def load_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Restore model (and optimizer and RNG states) from `folder`; returns the saved training state."""
    folder = Path(folder)
    record = json.loads((folder / "state.json").read_text())
    if record.get("format", 0) > CHECKPOINT_FORMAT:
        raise BlockforgeError(f"{folder}: checkpoint format {record['format']} is newer than this blockforge reads; upgrade blockforge")
    load_weights(model, folder / "model.safetensors")
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_from_tensors(load_file(str(folder / "optimizer.safetensors")), record["optimizer"]))
        _restore_rng(load_file(str(folder / "rng.safetensors")), record["python_rng"])
    return {k: v for k, v in record.items() if k not in ("optimizer", "python_rng", "format")}


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
    atomic_write(path, lambda tmp: save_model(model, tmp))
