"""Weights to and from Hugging Face's `transformers.LlamaForCausalLM` (a uniform Pre-LN llama).

Llama-2/3, TinyLlama, Mistral (one sliding window) and Qwen2 (q/k/v biases, per-layer layer_types)
configurations convert; anything blockforge does not model (other rope scalings, other model types,
...) is refused with a sentence naming it, never silently dropped. Every conversion checks its result
against its source on a random input (families/conversion.py).
"""

from __future__ import annotations

import torch
from torch import nn

from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, evaluating, probe_tokens
from blockforge.nn.build import build_model, copy_weight
from blockforge.nn.attention import rope_frequencies
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, ModelSpec, ResolvedSpec, RopeScaling
from blockforge.spec.resolve import resolve


def _half_split_to_interleaved(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder query/key rows (a weight or a bias) from Hugging Face's RoPE pairing (j, j + hs/2) to adjacent pairs (2j, 2j+1)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _interleaved_to_half_split(rows: torch.Tensor, heads: int) -> torch.Tensor:
    return rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


CONVERTED_TYPES = ("llama", "mistral", "qwen2")  # LlamaForCausalLM's computation; Mistral adds a window, Qwen2 q/k/v biases
ROPE_TYPES = ("default", "llama3")


def _float32_copy(model: nn.Module) -> nn.Module:
    import copy

    return model if all(p.dtype == torch.float32 for p in model.parameters()) else copy.deepcopy(model).float()


def _rope_of(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return {"rope_type": rope.get("rope_type", rope.get("type", "default")), "rope_theta": rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)), **rope}


def _layer_windows(config) -> list[int | None]:
    """Each layer's sliding window (None: global), from Mistral's one window or Qwen2/Gemma-style layer_types."""
    depth, window = config.num_hidden_layers, getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if kind == "sliding_attention" else None for kind in types]
    if config.model_type == "mistral" and window is not None and window < config.max_position_embeddings:
        return [window] * depth
    return [None] * depth


def _spec_from_config(config, what: str) -> ModelSpec:
    """The ModelSpec of a Llama-style Hugging Face config, or a ConversionError naming what blockforge cannot hold."""
    if getattr(config, "model_type", None) not in CONVERTED_TYPES:
        raise ConversionError(f"{what} has model_type '{getattr(config, 'model_type', None)}'; from_hf_llama converts {', '.join(CONVERTED_TYPES)}")
    heads = config.num_attention_heads
    rope = _rope_of(config)
    windows = _layer_windows(config)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    refusals = {
        f"rope type '{rope['rope_type']}' (blockforge models {', '.join(ROPE_TYPES)})": rope["rope_type"] not in ROPE_TYPES,
        f"activation '{config.hidden_act}'": config.hidden_act != "silu",
        f"layer types {sorted(kinds - {'full_attention', 'sliding_attention'})}": not kinds <= {"full_attention", "sliding_attention"},
        "sliding layers without a window size": "sliding_attention" in kinds and getattr(config, "sliding_window", None) is None,
    }
    for feature, present in refusals.items():
        if present:
            raise ConversionError(f"{what} uses {feature}, which blockforge's llama does not model")
    qwen = config.model_type == "qwen2"
    attention_bias = bool(getattr(config, "attention_bias", False))
    scaling = None
    if rope["rope_type"] == "llama3":
        scaling = RopeScaling(type="llama3", factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                              high_freq_factor=float(rope["high_freq_factor"]), original_context=int(rope["original_max_position_embeddings"]))
    overrides = [LayerOverride(at=[i for i, w in enumerate(windows) if w == window], window=window) for window in sorted(set(windows) - {None})]
    return ModelSpec(
        family="llama", width=config.hidden_size, depth=config.num_hidden_layers, heads=heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, ffn=config.intermediate_size, vocab=config.vocab_size,
        context=config.max_position_embeddings, norm_eps=config.rms_norm_eps, rope_theta=float(rope["rope_theta"]), rope_scaling=scaling,
        tie_embeddings=bool(config.tie_word_embeddings), qkv_bias=attention_bias or qwen, proj_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        layers=LayerRules(default=LayerSettings(placement="pre"), overrides=overrides),
    )


def _check_rotary_buffers(source: TensorSource, spec: ResolvedSpec, what: str) -> None:
    """The source's rotary frequencies must be the ones blockforge computes (no other scaling hidden in them)."""
    head_dim = spec.layers[0].head_dim
    expected = rope_frequencies(head_dim, spec.rope_theta, spec.rope_scaling)
    for name, tensor in source.tensors.items():
        if name.endswith("inv_freq") and not torch.allclose(tensor.float().cpu(), expected, rtol=1e-5):
            raise ConversionError(f"{what}'s rotary frequencies ({name}) are not those of its rope settings; blockforge does not model that")


def from_hf_llama(hf_model: nn.Module) -> nn.Module:
    """A blockforge llama with the weights of a Hugging Face Llama, Mistral or Qwen2 causal LM (every layer Pre-LN).

    Every tensor of the source is mapped or the conversion is refused by name; the result is then run
    beside the source on a random input and refused unless the logits agree within 1e-4.
    """
    what = f"this {type(hf_model).__name__}"
    spec = resolve(_spec_from_config(hf_model.config, what))
    model = build_model(spec)
    source = TensorSource(hf_model, what, ignore=lambda name: name.endswith("inv_freq"))
    _check_rotary_buffers(source, spec, what)
    source.copy_into(model.embed.weight, "model.embed_tokens.weight")
    for i, (block, layer) in enumerate(zip(model.layers, spec.layers)):
        prefix = f"model.layers.{i}."
        source.copy_into(block.attn.in_norm.weight, prefix + "input_layernorm.weight")
        for kind in ("weight", "bias"):
            if getattr(block.attn.branch.qkv, kind) is None:
                continue
            q = _half_split_to_interleaved(source.take(prefix + f"self_attn.q_proj.{kind}"), layer.heads)
            k = _half_split_to_interleaved(source.take(prefix + f"self_attn.k_proj.{kind}"), layer.kv_heads)
            fused = torch.cat([q, k, source.take(prefix + f"self_attn.v_proj.{kind}")])
            _copy_checked(getattr(block.attn.branch.qkv, kind), fused, prefix + f"self_attn.q/k/v_proj.{kind}", what)
        source.copy_into(block.attn.branch.proj.weight, prefix + "self_attn.o_proj.weight")
        if spec.proj_bias:
            source.copy_into(block.attn.branch.proj.bias, prefix + "self_attn.o_proj.bias")
        source.copy_into(block.mlp.in_norm.weight, prefix + "post_attention_layernorm.weight")
        for kind in ("weight", "bias") if spec.mlp_bias else ("weight",):
            gate_up = torch.cat([source.take(prefix + f"mlp.gate_proj.{kind}"), source.take(prefix + f"mlp.up_proj.{kind}")])
            _copy_checked(getattr(block.mlp.branch.gate_up, kind), gate_up, prefix + f"mlp.gate/up_proj.{kind}", what)
            source.copy_into(getattr(block.mlp.branch.down, kind), prefix + f"mlp.down_proj.{kind}")
    source.copy_into(model.final_norm.weight, "model.norm.weight")
    if spec.tie_embeddings:
        source.take("lm_head.weight")  # the embedding, under its second name
    else:
        source.copy_into(model.head.weight, "lm_head.weight")
    source.finish()
    model.eval()
    tokens = probe_tokens(spec.vocab, spec.context)
    with torch.no_grad(), evaluating(_float32_copy(hf_model)) as reference:
        check_same_outputs(model(tokens), reference(tokens.to(next(hf_model.parameters()).device)).logits.cpu(), what)
    return model


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str, what: str) -> None:
    if tensor.shape != target.shape:
        raise ConversionError(f"{what}'s {name} has shape {tuple(tensor.shape)} where blockforge's model has {tuple(target.shape)}")
    copy_weight(target, tensor)


def hf_llama_problems(spec: ResolvedSpec) -> list[str]:
    """What keeps `spec` from being a plain `LlamaForCausalLM` (empty when nothing does)."""
    layer0 = spec.layers[0]
    same = ("heads", "kv_heads", "head_dim", "ffn", "window", "norm", "qk_norm", "v_norm", "layer_scale")
    checks = {
        f"it is a {spec.family} model": spec.family != "llama",
        "not every sub-layer is Pre-LN (LlamaForCausalLM has only Pre-LN layers)": not spec.uniform_pre(),
        "its layers differ in " + ", ".join(k for k in same if len({getattr(layer, k) for layer in spec.layers}) > 1): any(
            len({getattr(layer, k) for layer in spec.layers}) > 1 for k in same),
        "it has no final norm": not spec.final_norm,
        f"it uses {spec.norm}": spec.norm != "rmsnorm" or layer0.norm != "rmsnorm",
        "it has sliding windows": layer0.window is not None,
        "it normalizes queries, keys or values": layer0.qk_norm or layer0.v_norm,
        "it has layer scales": layer0.layer_scale is not None,
        f"its branches are scaled by {spec.branch_multiplier:.4g} (CompleteP)": spec.branch_multiplier != 1.0,
        "its q/k/v and output biases differ (HF's attention_bias sets all four)": spec.qkv_bias != spec.proj_bias,
    }
    return [problem for problem, present in checks.items() if present]


def to_hf_llama(model: nn.Module) -> nn.Module:
    """A `LlamaForCausalLM` with the weights of a uniform Pre-LN blockforge llama (GQA, head_dim, biases, llama3 RoPE kept)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    spec: ResolvedSpec = model.spec
    problems = hf_llama_problems(spec)
    if problems:
        raise ConversionError("to_hf_llama needs what LlamaForCausalLM computes (uniform Pre-LN RMSNorm layers, a final norm), but " + "; ".join(problems))
    layer0 = spec.layers[0]
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling is not None:
        scaling = spec.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": spec.rope_theta, "factor": scaling["factor"], "low_freq_factor": scaling["low_freq_factor"],
                "high_freq_factor": scaling["high_freq_factor"], "original_max_position_embeddings": scaling["original_context"]}
    config = LlamaConfig(
        hidden_size=spec.width, num_hidden_layers=spec.depth, num_attention_heads=layer0.heads, num_key_value_heads=layer0.kv_heads,
        head_dim=layer0.head_dim, intermediate_size=layer0.ffn, vocab_size=spec.vocab, max_position_embeddings=spec.context,
        rms_norm_eps=spec.norm_eps, rope_parameters=rope, tie_word_embeddings=spec.tie_embeddings,
        attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias,
    )
    hf_model = LlamaForCausalLM(config)
    dst = hf_model.model
    q_rows, k_rows = layer0.heads * layer0.head_dim, layer0.kv_heads * layer0.head_dim
    copy_weight(dst.embed_tokens.weight, model.embed.weight)
    for block, layer in zip(model.layers, dst.layers, strict=True):
        attn = layer.self_attn
        for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
            q, k, v = getattr(block.attn.branch.qkv, kind).split([q_rows, k_rows, k_rows])
            copy_weight(getattr(attn.q_proj, kind), _interleaved_to_half_split(q, layer0.heads))
            copy_weight(getattr(attn.k_proj, kind), _interleaved_to_half_split(k, layer0.kv_heads))
            copy_weight(getattr(attn.v_proj, kind), v)
        copy_weight(attn.o_proj.weight, block.attn.branch.proj.weight)
        if spec.proj_bias:
            copy_weight(attn.o_proj.bias, block.attn.branch.proj.bias)
        copy_weight(layer.input_layernorm.weight, block.attn.in_norm.weight)
        copy_weight(layer.post_attention_layernorm.weight, block.mlp.in_norm.weight)
        for kind in ("weight", "bias") if spec.mlp_bias else ("weight",):
            gate, up = getattr(block.mlp.branch.gate_up, kind).split(layer0.ffn)
            copy_weight(getattr(layer.mlp.gate_proj, kind), gate)
            copy_weight(getattr(layer.mlp.up_proj, kind), up)
            copy_weight(getattr(layer.mlp.down_proj, kind), getattr(block.mlp.branch.down, kind))
    copy_weight(dst.norm.weight, model.final_norm.weight)
    if not spec.tie_embeddings:
        copy_weight(hf_model.lm_head.weight, model.head.weight)
    hf_model.eval()
    tokens = probe_tokens(spec.vocab, spec.context)
    with torch.no_grad(), evaluating(_float32_copy(model)) as reference:
        check_same_outputs(hf_model(tokens).logits, reference(tokens), "to_hf_llama")
    return hf_model
