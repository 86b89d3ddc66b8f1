"""Where and in what precision a run computes, decided once: the device, and bf16 autocast or float32."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from blockforge.errors import BlockforgeError


def pick_device(name: str) -> torch.device:
    """'auto' (CUDA when visible, else CPU), 'cpu' or 'cuda' (refused, in one sentence, when there is none)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BlockforgeError("train.device: cuda was asked for but no CUDA device is visible; use train.device: auto or cpu")
    return torch.device(name)


def compute_dtype(precision: str, device_type: str) -> torch.dtype:
    """The precision policy: bf16 when asked for, or by default ('auto') on CUDA; float32 otherwise.

    Weights and optimizer state stay float32 either way (bf16 is autocast, or FSDP's compute dtype).
    """
    if precision == "bf16" or (precision == "auto" and device_type == "cuda"):
        return torch.bfloat16
    return torch.float32


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    precision: str = "auto"  # train.precision: auto | fp32 | bf16
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", compute_dtype(self.precision, self.device.type))

    @classmethod
    def of(cls, model: torch.nn.Module, precision: str = "auto") -> "Runtime":
        """The runtime of a model already placed on its device."""
        return cls(next(model.parameters()).device, precision)

    @property
    def bf16(self) -> bool:
        return self.dtype == torch.bfloat16

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()


def to_device(batch, device: torch.device):
    if isinstance(batch, (tuple, list)):
        return type(batch)(t.to(device, non_blocking=True) for t in batch)
    return batch.to(device, non_blocking=True)
