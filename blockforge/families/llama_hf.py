"""Weights to and from Hugging Face's `transformers.LlamaForCausalLM` (a uniform Pre-LN llama).

Features blockforge does not model (grouped-query attention, biases, rope scaling, windows, other
model types) are refused with a sentence, never silently dropped; every conversion checks its
result against its source on a random input (families/conversion.py).
"""

from __future__ import annotations

import torch
from torch import nn

from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, evaluating
from blockforge.nn.build import build_model, copy_weight
from blockforge.spec.model import LayerRules, LayerSettings, ModelSpec, ResolvedSpec
from blockforge.spec.resolve import resolve


def _half_split_to_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder query/key rows from Hugging Face's RoPE pairing (j, j + hs/2) to adjacent pairs (2j, 2j+1)."""
    rows, width = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, width).transpose(1, 2).reshape(rows, width)


def _interleaved_to_half_split(weight: torch.Tensor, heads: int) -> torch.Tensor:
    rows, width = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, width).transpose(1, 2).reshape(rows, width)


CONVERTED_TYPES = ("llama", "mistral")  # configurations with LlamaForCausalLM's computation (Mistral: without a window)


def _random_tokens(vocab: int, context: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, min(16, context)), generator=torch.Generator().manual_seed(0))


def _float32_copy(model: nn.Module) -> nn.Module:
    import copy

    return model if all(p.dtype == torch.float32 for p in model.parameters()) else copy.deepcopy(model).float()


def from_hf_llama(hf_model: nn.Module) -> nn.Module:
    """A blockforge llama with the weights of a Hugging Face `LlamaForCausalLM` (every layer Pre-LN).

    Every tensor of the source is mapped or the conversion is refused by name; the result is then run
    beside the source on a random input and refused unless the logits agree within 1e-4.
    """
    config = hf_model.config
    what = f"this {type(hf_model).__name__}"
    if getattr(config, "model_type", None) not in CONVERTED_TYPES:
        raise ConversionError(f"{what} has model_type '{getattr(config, 'model_type', None)}'; from_hf_llama converts {', '.join(CONVERTED_TYPES)}")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(config, "rope_theta", 10000.0)}
    window = getattr(config, "sliding_window", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    refusals = {
        "grouped-query attention (num_key_value_heads != num_attention_heads)": kv_heads != heads,
        "a head_dim other than hidden_size / num_attention_heads": head_dim * heads != config.hidden_size,
        "attention or MLP biases": bool(getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)),
        f"rope type '{rope.get('rope_type')}'": rope.get("rope_type", "default") != "default",
        f"activation '{config.hidden_act}'": config.hidden_act != "silu",
        f"a sliding attention window of {window} positions": window is not None and window < config.max_position_embeddings,
        f"layer types {sorted(layer_types)}": layer_types != {"full_attention"},
    }
    for feature, present in refusals.items():
        if present:
            raise ConversionError(f"{what} uses {feature}, which blockforge's llama does not model")
    spec = resolve(
        ModelSpec(
            family="llama",
            width=config.hidden_size,
            depth=config.num_hidden_layers,
            heads=heads,
            ffn=config.intermediate_size,
            vocab=config.vocab_size,
            context=config.max_position_embeddings,
            norm_eps=config.rms_norm_eps,
            rope_theta=float(rope["rope_theta"]),
            tie_embeddings=bool(config.tie_word_embeddings),
            layers=LayerRules(default=LayerSettings(placement="pre")),
        )
    )
    model = build_model(spec)
    source = TensorSource(hf_model, what, ignore=lambda name: name.endswith("inv_freq"))
    for name in source.tensors:  # the rotary tables must be the plain RoPE of rope_theta (no scaling)
        if name.endswith("inv_freq"):
            expected = 1.0 / (spec.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            if not torch.allclose(source.tensors[name].float().cpu(), expected, rtol=1e-5):
                raise ConversionError(f"{what}'s rotary frequencies ({name}) are not plain RoPE with theta {spec.rope_theta:g}; blockforge does not model that")
    source.copy_into(model.embed.weight, "model.embed_tokens.weight")
    for i, block in enumerate(model.layers):
        prefix = f"model.layers.{i}."
        source.copy_into(block.attn.in_norm.weight, prefix + "input_layernorm.weight")
        q = _half_split_to_interleaved(source.take(prefix + "self_attn.q_proj.weight"), heads)
        k = _half_split_to_interleaved(source.take(prefix + "self_attn.k_proj.weight"), heads)
        copy_weight(block.attn.branch.qkv.weight, torch.cat([q, k, source.take(prefix + "self_attn.v_proj.weight")]))
        source.copy_into(block.attn.branch.proj.weight, prefix + "self_attn.o_proj.weight")
        source.copy_into(block.mlp.in_norm.weight, prefix + "post_attention_layernorm.weight")
        gate_up = torch.cat([source.take(prefix + "mlp.gate_proj.weight"), source.take(prefix + "mlp.up_proj.weight")])
        copy_weight(block.mlp.branch.gate_up.weight, gate_up)
        source.copy_into(block.mlp.branch.down.weight, prefix + "mlp.down_proj.weight")
    source.copy_into(model.final_norm.weight, "model.norm.weight")
    if spec.tie_embeddings:
        source.take("lm_head.weight")  # the embedding, under its second name
    else:
        source.copy_into(model.head.weight, "lm_head.weight")
    source.finish()
    model.eval()
    tokens = _random_tokens(spec.vocab, spec.context)
    with torch.no_grad(), evaluating(_float32_copy(hf_model)) as reference:
        check_same_outputs(model(tokens), reference(tokens.to(next(hf_model.parameters()).device)).logits.cpu(), what)
    return model


def hf_llama_problems(spec: ResolvedSpec) -> list[str]:
    """What keeps `spec` from being a plain `LlamaForCausalLM` (empty when nothing does)."""
    problems = {
        f"it is a {spec.family} model": spec.family != "llama",
        "not every layer is Pre-LN (LlamaForCausalLM has only Pre-LN layers)": any(layer.placement != "pre" for layer in spec.layers),
        "heads or ffn differ between layers": len({(layer.heads, layer.ffn) for layer in spec.layers}) > 1,
        "it has no final norm": not spec.final_norm,
        f"it uses {spec.norm}": spec.norm != "rmsnorm",
    }
    return [problem for problem, present in problems.items() if present]


def _check_hf_compatible(spec: ResolvedSpec) -> None:
    problems = hf_llama_problems(spec)
    if problems:
        raise ConversionError("to_hf_llama needs a uniform Pre-LN RMSNorm llama with a final norm, but " + "; ".join(problems))


def to_hf_llama(model: nn.Module) -> nn.Module:
    """A `LlamaForCausalLM` with the weights of a uniform Pre-LN blockforge llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec: ResolvedSpec = model.spec
    _check_hf_compatible(spec)
    layer0 = spec.layers[0]
    config = LlamaConfig(
        hidden_size=spec.width,
        num_hidden_layers=spec.depth,
        num_attention_heads=layer0.heads,
        num_key_value_heads=layer0.heads,
        intermediate_size=layer0.ffn,
        vocab_size=spec.vocab,
        max_position_embeddings=spec.context,
        rms_norm_eps=spec.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=spec.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
    )
    hf_model = LlamaForCausalLM(config)
    dst = hf_model.model
    width, ffn = spec.width, layer0.ffn
    copy_weight(dst.embed_tokens.weight, model.embed.weight)
    for block, layer in zip(model.layers, dst.layers, strict=True):
        q, k, v = block.attn.branch.qkv.weight.split(width)
        gate, up = block.mlp.branch.gate_up.weight.split(ffn)
        copy_weight(layer.input_layernorm.weight, block.attn.in_norm.weight)
        copy_weight(layer.self_attn.q_proj.weight, _interleaved_to_half_split(q, layer0.heads))
        copy_weight(layer.self_attn.k_proj.weight, _interleaved_to_half_split(k, layer0.heads))
        copy_weight(layer.self_attn.v_proj.weight, v)
        copy_weight(layer.self_attn.o_proj.weight, block.attn.branch.proj.weight)
        copy_weight(layer.post_attention_layernorm.weight, block.mlp.in_norm.weight)
        copy_weight(layer.mlp.gate_proj.weight, gate)
        copy_weight(layer.mlp.up_proj.weight, up)
        copy_weight(layer.mlp.down_proj.weight, block.mlp.branch.down.weight)
    copy_weight(dst.norm.weight, model.final_norm.weight)
    if not spec.tie_embeddings:
        copy_weight(hf_model.lm_head.weight, model.head.weight)
    hf_model.eval()
    tokens = _random_tokens(spec.vocab, spec.context)
    with torch.no_grad(), evaluating(_float32_copy(model)) as reference:
        check_same_outputs(hf_model(tokens).logits, reference(tokens), "to_hf_llama")
    return hf_model
