"""Parameters and training FLOPs of a model, read from its modules (build it on the meta device: nothing is allocated).

FLOPs are those of the matrix multiplies, as `torch.utils.flop_counter` counts them and as MFU is usually
reported (PaLM, appendix B): a multiply-add is 2 FLOPs, and attention scores are counted over the full
sequence (masks and windows do not reduce the count). Per sequence of S positions (llama: context tokens;
vit: patches + the class token),

    forward = 2 * S * N_blocks + 4 * S^2 * sum_l(heads_l * head_dim_l) + head + input projection

with N_blocks the weights of the blocks' linear layers (q/k/v, attention output, MLP), head = 2 * S *
width * vocab for a llama (2 * width * classes for a vit, which reads the class token only) and the input
projection 2 * patches * channels * patch^2 * width for a vit (a llama's embedding is a lookup: 0).
Training is 3 times forward (backward: the gradients of inputs and of weights); gradient checkpointing
would add a forward more, which this does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.spec.family import get_family


@dataclass(frozen=True)
class OuterCosts:
    """What a family's model costs outside its blocks (its `outer_costs` hook: families/llama.py, families/vit.py)."""

    sequence: int  # positions per sample
    embedding: int  # parameters of the input embedding (left out of the non-embedding count)
    forward_flops: int  # per sample: the input projection and the head


@dataclass(frozen=True)
class ModelCosts:
    parameters: int
    non_embedding: int  # without the input embedding (llama: token embedding and a head tied to it; vit: positions and class token)
    sequence: int  # positions per sample (llama: context; vit: patches + 1)
    forward_flops: int  # per sample (one sequence or one image)

    @property
    def train_flops(self) -> int:
        """Per sample: forward and backward."""
        return 3 * self.forward_flops

    @property
    def train_flops_per_token(self) -> float:
        return self.train_flops / self.sequence


def model_costs(model: nn.Module) -> ModelCosts:
    """Parameters and FLOPs of a blockforge backbone, from its modules and its family's `outer_costs`."""
    spec = model.spec
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    family = get_family(spec.family)
    if family.outer_costs is None:
        raise BlockforgeError(f"family {spec.family} is registered without outer_costs, so its FLOPs cannot be counted")
    outer = family.outer_costs(model)
    sequence = outer.sequence
    block_weights = sum(m.weight.numel() for block in model.layers for m in block.modules() if isinstance(m, nn.Linear))
    attention = sum(block.attn.branch.heads * block.attn.branch.head_dim for block in model.layers)
    forward = 2 * sequence * block_weights + 4 * sequence * sequence * attention + outer.forward_flops
    return ModelCosts(total, total - outer.embedding, sequence, forward)


def trial_flops(recipe) -> tuple[int, int, float]:
    """(parameters, non-embedding parameters, FLOPs of one training run) of `recipe`, from its model on the meta device:
    steps * batch_size * 3 * F  +  evaluations * eval_batches * micro_batch * F, with F one sample's forward FLOPs."""
    from blockforge.nn.build import build_model

    costs = model_costs(build_model(recipe.spec, device="meta"))
    cfg = recipe.train
    evaluations = max(1, cfg.steps // cfg.eval_every) if cfg.eval_every else 1
    flops = cfg.steps * cfg.batch_size * costs.train_flops + evaluations * cfg.eval_batches * cfg.micro_batch * costs.forward_flops
    return costs.parameters, costs.non_embedding, float(flops)
