"""Memory plan of a training run, computed on the meta device: nothing of the model is allocated.

Weights, gradients and Adam's two moments are float32 (bf16 autocast computes in bf16 but keeps
float32 weights). Activations are measured, not estimated: one micro-batch runs forward on meta
tensors and every tensor autograd saves for the backward pass is counted (weights excluded).
Attention is counted as the fused GPU kernels keep it (queries, keys, values, output and the
log-sum-exp; no T x T matrix: the `footprint` attention backend), since on meta tensors SDPA falls
back to its unfused math.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from blockforge.errors import BlockforgeError, SpecError
from blockforge.nn.build import build_model, parameter_count
from blockforge.spec.family import get_family
from blockforge.spec.recipe import Recipe
from blockforge.train.runtime import compute_dtype

GiB = 2**30


@dataclass
class MemoryPlan:
    parameters: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # per micro-batch, per process
    largest_block_bytes: int  # one block's weights in the compute dtype (what FSDP gathers at once)
    micro_batch: int
    dtype: str
    gpus: int
    sharded: bool

    @property
    def states_per_gpu(self) -> float:
        states = self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
        return states / self.gpus if self.sharded else states

    @property
    def total_per_gpu(self) -> float:
        gathered = 2 * self.largest_block_bytes if self.sharded else 0  # the block in use and the next, prefetched
        return self.states_per_gpu + self.activations_bytes + gathered

    def rows(self) -> list[list[str]]:
        def gib(n: float) -> str:
            return f"{n / GiB:,.2f} GiB"

        share = f" / {self.gpus} GPUs" if self.sharded else ""
        return [
            ["parameters", f"{self.parameters:,}", ""],
            ["weights (float32)", gib(self.weights_bytes), share],
            ["gradients (float32)", gib(self.gradients_bytes), share],
            ["Adam moments (2 x float32)", gib(self.optimizer_bytes), share],
            [f"activations per micro-batch of {self.micro_batch} ({self.dtype})", gib(self.activations_bytes), "per GPU"],
            ["total per GPU" + (" (FSDP, incl. gathered blocks)" if self.sharded else " (data-parallel)"), gib(self.total_per_gpu), ""],
        ]


def saved_activation_bytes(model: torch.nn.Module, batch) -> int:
    """Bytes autograd keeps for the backward pass of one forward (weights and their views excluded)."""
    weights = {id(p) for p in model.parameters()}
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = tensor._base if tensor._base is not None else tensor
        if id(base) not in weights and id(tensor) not in weights:
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        get_family(model.spec.family).loss(model, batch, None)
    return total


BUILD_ERRORS = (RuntimeError, ValueError, OverflowError, MemoryError)  # what torch raises for sizes it cannot hold


def memory_plan(recipe: Recipe, *, gpus: int = 1, sharded: bool = False, device_type: str = "cuda") -> MemoryPlan:
    """The plan of training `recipe` (on GPUs by default; device_type 'cpu' counts activations in the CPU's dtype).

    A model too large even to lay out on the meta device is one SpecError sentence."""
    try:
        return _memory_plan(recipe, gpus, sharded, device_type)
    except BUILD_ERRORS as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(f"the model cannot even be laid out on the meta device ({reason}); make it smaller", path="model") from None


def machine_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes a training process may still take on `device`, what they are), or None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on GPU {device.index or 0}"
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024, "available on this machine"
    except (OSError, KeyError, ValueError):
        return None


def check_fits(recipe: Recipe, device: torch.device, *, processes: int = 1, sharded: bool = False, planned: int | None = None) -> None:
    """Refuse, in one sentence and before anything is built, a run whose memory plan exceeds what the device has.

    `processes` training processes share this machine's memory on the CPU (each GPU holds one). `planned`: bytes per
    process a caller planned already (a search's driver plans each cell's largest model before the first trial), so the
    plan is not laid out again here."""
    room = machine_memory(device)
    if room is None:
        return
    available, where = room
    if planned is not None:
        per_process, basis = planned, "the memory plan of its search cell's largest model"
    else:
        plan = memory_plan(recipe, gpus=processes, sharded=sharded, device_type=device.type)
        per_process, basis = plan.total_per_gpu, (f"its memory plan ({plan.parameters:,} parameters: weights, gradients, Adam "
                                                  f"moments and one micro-batch of {plan.micro_batch}'s activations)")
    need = per_process * (processes if device.type == "cpu" else 1)
    if need > available:
        raise BlockforgeError(
            f"training this model needs about {need / GiB:,.1f} GiB by {basis}, more than the {available / GiB:,.1f} GiB "
            f"{where}; make the model or train.micro_batch_size smaller (`blockforge inspect RECIPE --memory` shows the plan)"
        )


def _memory_plan(recipe: Recipe, gpus: int, sharded: bool, device_type: str) -> MemoryPlan:
    dtype = compute_dtype(recipe.train.precision, device_type)
    # Attention counted as the fused kernels keep it (the `footprint` backend: shapes only).
    spec = dataclasses.replace(recipe.spec, attention="footprint")
    model = build_model(spec, device="meta").to(dtype)
    micro = recipe.train.micro_batch
    batch = get_family(spec.family).example_batch(spec, micro, "meta", dtype)
    count = parameter_count(model)
    activations = saved_activation_bytes(model, batch)
    largest = max(sum(p.numel() for p in block.parameters()) for block in model.layers) * dtype.itemsize
    return MemoryPlan(
        parameters=count, weights_bytes=4 * count, gradients_bytes=4 * count, optimizer_bytes=8 * count,
        activations_bytes=activations, largest_block_bytes=largest, micro_batch=micro,
        dtype="bf16" if dtype == torch.bfloat16 else "fp32", gpus=gpus, sharded=sharded,
    )
