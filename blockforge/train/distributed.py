"""Data-parallel set-up under torchrun (DDP; gloo on CPU, NCCL on CUDA); a no-op in a single process."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device_type: str) -> World:
    """Join the process group torchrun describes in the environment, if any."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    world = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
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
    flag = torch.tensor([signum or 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None
