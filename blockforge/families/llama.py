"""The llama family: a causal language model on text (token embedding, RoPE, SwiGLU, RMSNorm, LM head).

The registration is declarations only: the backbone, the loss, the converters and the export formats are named by
where they live (`lazy`) and imported, with torch, when a model is built, trained or exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockforge.errors import SpecError
from blockforge.lazy import lazy
from blockforge.spec.family import Family, register_family

if TYPE_CHECKING:
    import torch

    from blockforge.nn.flops import OuterCosts


def check_layer(spec, layer: dict, path: str) -> None:
    if layer["head_dim"] % 2:
        raise SpecError(f"the head dimension {layer['head_dim']} is odd, which rotary embeddings cannot use; choose heads or head_dim for an even one", path=path)


def dataset(cfg, spec, seed, cache_dir, run_dir):
    from blockforge.data.text import build_text_dataset

    return build_text_dataset(cfg, seq_len=spec.context, vocab=spec.vocab, seed=seed, cache_dir=cache_dir, run_dir=run_dir)


def example_batch(spec, batch_size: int, device, dtype=None) -> torch.Tensor:
    """Token rows of context + 1 ids (inputs and next-token targets)."""
    import torch

    return torch.zeros(batch_size, spec.context + 1, dtype=torch.long, device=device)


def model_inputs(batch: torch.Tensor, pad_id: int | None):
    """The inputs lm_loss feeds the model (every row but its last id), and which of them are not padding."""
    inputs = batch[:, :-1]
    return inputs, ((inputs != pad_id).flatten() if pad_id is not None else None)


def outer_costs(model) -> OuterCosts:
    """`context` tokens per sample; the token embedding is a lookup (no FLOPs); the head maps every position to the vocabulary."""
    from blockforge.nn.flops import OuterCosts

    sequence = model.spec.context
    return OuterCosts(sequence=sequence, embedding=model.embed.weight.numel(),
                      forward_flops=2 * sequence * model.head.in_features * model.head.out_features)


LLAMA = register_family(Family(
    name="llama", default_norm="rmsnorm", data_kind="text", required=("vocab", "context"),
    unused=("image_size", "patch_size", "classes"), metrics=("val_loss", "val_ppl"), sample_unit="tok",
    check_layer=check_layer, build=lazy("blockforge.nn.llama:Llama"), loss=lazy("blockforge.nn.losses:lm_loss"), dataset=dataset,
    example_batch=example_batch, model_inputs=model_inputs, outer_costs=outer_costs,
    converters={"from_hf": lazy("blockforge.families.llama_hf:from_hf_llama"), "to_hf": lazy("blockforge.families.hf_native:to_hf")},
    exports={"hf": lazy("blockforge.families.hf_export:HF_FORMAT"), "gguf": lazy("blockforge.families.gguf_export:GGUF_FORMAT")},
))
