"""Data-parallel set-up under torchrun (DDP or FSDP2; gloo on CPU, NCCL on CUDA); a no-op in a single process."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    # On GPUs, a gloo group beside NCCL for the per-step stop flag: agreeing on it then never waits for the GPU's stream.
    control: Any = field(default=None, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device_type: str) -> World:
    """Join the process group torchrun describes in the environment, if any."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    control = dist.new_group(backend="gloo") if device_type == "cuda" else None
    world = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", 0)), control=control)
    if device_type == "cuda":
        torch.cuda.set_device(world.local_rank)
    return world


def mean_across(value: torch.Tensor, world: World) -> torch.Tensor:
    if world.size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= world.size
    return value


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def agree_on_stop(signum: int | None, world: World, device: torch.device) -> int | None:
    """The stop signal any rank received (the largest number), so all ranks stop after the same step."""
    if world.size == 1:
        return signum
    flag = torch.tensor([signum or 0], device="cpu" if world.control is not None else device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=world.control)
    return int(flag.item()) or None


class Parallel:
    """The model as the loop calls it across processes: itself in one process, a DDP wrapper, or sharded in place by
    FSDP2 (each block, then the root; `sharded`)."""

    def __init__(self, model: nn.Module, world: World, device: torch.device, *, sharded: bool, bf16: bool):
        self.model, self.world, self.sharded = model, world, sharded
        self.module = self._wrap(model, device, bf16)

    def _wrap(self, model: nn.Module, device: torch.device, bf16: bool) -> nn.Module:
        if self.world.size == 1:
            return model
        if self.sharded:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
            for block in model.layers:
                fully_shard(block, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def gradient_sync(self, sync: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
        if self.sharded:
            self.model.set_requires_gradient_sync(sync)
            return nullcontext()
        if self.world.size == 1 or sync:
            return nullcontext()
        return self.module.no_sync()
