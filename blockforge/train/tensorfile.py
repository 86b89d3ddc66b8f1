"""Safetensors files that vouch for themselves: written with a checksum (and, for weights, the resolved spec
they belong to) in their metadata, read back only after every check passed.

A reader gets each tensor's name, dtype and shape checked against what the model builds before any byte
is loaded, then the checksum over the metadata and the tensors in name order; weights also get the spec
they were written for compared with the spec at hand, key by key. Every problem is one CorruptFolderError
sentence naming the file. Files written before checksums existed are read with one warning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from blockforge.errors import CorruptFolderError
from blockforge.io import atomic_write

CHECKSUM = "blockforge.sha256"  # over the other metadata, then every tensor's name, dtype, shape and bytes
SPEC = "blockforge.spec"  # the resolved spec (JSON) that weights were written for

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}

Layout = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (safetensors dtype, shape)


def layout(tensors: Mapping[str, torch.Tensor]) -> Layout:
    return {name: (DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for name, t in tensors.items()}


def checksum(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for key in sorted(k for k in metadata if k != CHECKSUM):
        digest.update(f"{key}={metadata[key]}\0".encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}\0{DTYPES.get(tensor.dtype, tensor.dtype)}\0{list(tensors[name].shape)}\0".encode())
        digest.update(tensor.view(torch.uint8).numpy().data)  # raw bytes whatever the dtype (numpy has no bfloat16)
    return digest.hexdigest()


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> str:
    """Write `tensors` atomically with `metadata` and their checksum; returns the checksum."""
    metadata = {"format": "pt", **(metadata or {})}
    metadata[CHECKSUM] = checksum(tensors, metadata)
    atomic_write(path, lambda tmp: save_file(dict(tensors), tmp, metadata=metadata))
    return metadata[CHECKSUM]


@dataclass
class TensorFile:
    path: Path
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def checksum(self) -> str | None:
        """The verified checksum, or None for a file written before checksums."""
        return self.metadata.get(CHECKSUM)


def _shape(shape) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _compare_layout(path: Path, found: Layout, expected: Layout, source: str, verbs: tuple[str, str], fix: str) -> None:
    """The first tensor whose presence, dtype or shape differs from `expected`, as one sentence."""
    does, does_not = verbs
    for name in sorted(set(found) | set(expected)):
        if name not in found:
            raise CorruptFolderError(f"{path}: has no tensor {name}, which {source} {does}; {fix}")
        if name not in expected:
            raise CorruptFolderError(f"{path}: holds tensor {name}, which {source} {does_not}; {fix}")
        (dtype, shape), (want_dtype, want_shape) = found[name], expected[name]
        if tuple(shape) != tuple(want_shape):
            raise CorruptFolderError(f"{path}: holds {name} with shape {_shape(shape)}, but {source} {does} {_shape(want_shape)}; {fix}")
        if dtype != want_dtype:
            raise CorruptFolderError(f"{path}: holds {name} as {dtype}, but {source} {does} {want_dtype}; {fix}")


def read_tensors(path: Path, expected: Layout | None, *, fix: str, source: str = "the model", verbs: tuple[str, str] = ("builds", "does not build"),
                 mismatch_fix: str | None = None, optional: tuple[str, ...] = ()) -> TensorFile:
    """Every tensor of `path`, after its layout (against `expected`, if given) and its checksum were checked.

    `fix` ends sentences about damage, `mismatch_fix` (default: `fix`) those about a layout other than
    `expected`; `source` and `verbs` word them ('has no tensor X, which spec.yaml builds'); names
    starting with an `optional` prefix may be present without being expected.
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptFolderError(f"{path}: is missing; {fix}")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = dict(f.metadata() or {})
            found = {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape())) for name in f.keys()}
            if expected is not None:
                checked = {k: v for k, v in found.items() if k in expected or not k.startswith(optional)}
                _compare_layout(path, checked, expected, source, verbs, mismatch_fix or fix)
            tensors = {name: f.get_tensor(name) for name in found}
    except SafetensorError as err:
        reason = str(err).removeprefix("Error while deserializing header: ")
        raise CorruptFolderError(f"{path}: is not a readable safetensors file ({reason}); {fix}") from None
    except OSError as err:
        raise CorruptFolderError(f"{path}: cannot be read ({err.strerror or err}); {fix}") from None
    stored = metadata.get(CHECKSUM)
    if stored is not None and checksum(tensors, metadata) != stored:
        raise CorruptFolderError(f"{path}: its bytes differ from the checksum written with them, so the file was changed or damaged; {fix}")
    return TensorFile(path, tensors, metadata)


def spec_metadata(plain_spec: dict) -> dict[str, str]:
    """What weights carry about their spec (`plain_spec`: to_plain of the resolved spec)."""
    return {SPEC: json.dumps(plain_spec, sort_keys=True)}


def first_difference(a, b, path: str = "") -> tuple[str, object, object] | None:
    """The first key path where plain data `a` and `b` differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else (path, a, b)
