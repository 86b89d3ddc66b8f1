"""Memory plan of a training run, computed on the meta device: nothing of the model is allocated.

Weights, gradients and Adam's two moments are float32 (bf16 autocast computes in bf16 but keeps
float32 weights). Activations are measured, not estimated: one micro-batch runs forward on meta
tensors and every tensor autograd saves for the backward pass is counted (weights excluded).
Attention is counted as the fused GPU kernels keep it (queries, keys, values, output and the
log-sum-exp; no T x T matrix), since on meta tensors SDPA falls back to its unfused math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import contextlib

from blockforge.nn import attention
from blockforge.nn.build import build_model, parameter_count
from blockforge.spec.recipe import Recipe
from blockforge.spec.resolve import resolve
from blockforge.train.loop import image_loss, lm_loss

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


class _FusedAttentionFootprint(torch.autograd.Function):
    """Shapes as flash/efficient attention: the output, with q, k, v, output and log-sum-exp saved."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@contextlib.contextmanager
def _fused_attention_footprint(backend: str):
    original = attention.ATTENTION_BACKENDS[backend]
    attention.ATTENTION_BACKENDS[backend] = lambda q, k, v, causal: _FusedAttentionFootprint.apply(q, k, v)
    try:
        yield
    finally:
        attention.ATTENTION_BACKENDS[backend] = original


def saved_activation_bytes(model: torch.nn.Module, batch, kind: str) -> int:
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
        if kind == "text":
            lm_loss(model, batch, None)
        else:
            image_loss(model, batch)
    return total


def memory_plan(recipe: Recipe, *, gpus: int = 1, sharded: bool = False) -> MemoryPlan:
    spec = resolve(recipe.model)
    bf16 = recipe.train.precision in ("auto", "bf16")  # auto means bf16 on the GPUs a plan is for
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = build_model(spec, device="meta").to(dtype)
    micro = recipe.train.micro_batch
    if spec.family == "llama":
        batch = torch.zeros(micro, spec.context + 1, dtype=torch.long, device="meta")
        kind = "text"
    else:
        images = torch.zeros(micro, spec.channels, spec.image_size, spec.image_size, dtype=dtype, device="meta")
        batch, kind = (images, torch.zeros(micro, dtype=torch.long, device="meta")), "image"
    count = parameter_count(model)
    with _fused_attention_footprint(spec.attention):
        activations = saved_activation_bytes(model, batch, kind)
    largest = max(sum(p.numel() for p in block.parameters()) for block in model.layers) * dtype.itemsize
    return MemoryPlan(
        parameters=count, weights_bytes=4 * count, gradients_bytes=4 * count, optimizer_bytes=8 * count,
        activations_bytes=activations, largest_block_bytes=largest, micro_batch=micro,
        dtype="bf16" if bf16 else "fp32", gpus=gpus, sharded=sharded,
    )
