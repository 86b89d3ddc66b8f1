"""Weights to and from Hugging Face's `transformers.LlamaForCausalLM` (a uniform Pre-LN llama).

Llama-2/3, TinyLlama, Mistral (one sliding window) and Qwen2 (q/k/v biases, per-layer layer_types)
configurations convert; anything blockforge does not model (other rope scalings, other model types,
...) is refused with a sentence naming it, never silently dropped. Every conversion checks its result
against its source on a random input (families/conversion.py).
"""

from __future__ import annotations

import torch
from torch import nn

from blockforge.errors import warn
from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, evaluating, probe_tokens
from blockforge.nn.build import build_model, copy_weight
from blockforge.nn.attention import rope_frequencies
from blockforge.spec.fields import plain_problems
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


def _layer_windows(hf_model: nn.Module) -> list[int | None]:
    """Each layer's sliding window (None: global) as the source's code applies it, not as a config field claims:
    Llama attends globally; Mistral windows every layer with `sliding_window` (its code ignores `layer_types`);
    Qwen2's attention modules carry their own window. A window as long as the context excludes nothing."""
    config = hf_model.config
    layers = hf_model.model.layers
    if config.model_type == "mistral":
        windows = [getattr(config, "sliding_window", None)] * len(layers)
    elif config.model_type == "qwen2":
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in layers]
    else:
        windows = [None] * len(layers)
    return [window if window is not None and window < config.max_position_embeddings else None for window in windows]


def _spec_from_config(config, what: str, windows: list[int | None]) -> ModelSpec:
    """The ModelSpec of a Llama-style Hugging Face config with the layers' `windows`, or a ConversionError naming
    what blockforge cannot hold."""
    heads = config.num_attention_heads
    rope = _rope_of(config)
    # Only Qwen2's code reads layer_types; Mistral's ignores them.
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"]) if config.model_type == "qwen2" else {"full_attention"}
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


def _check_rotary_buffers(source: TensorSource, frequencies: torch.Tensor, what: str) -> None:
    """The source's rotary frequencies must be the ones blockforge computes (no other scaling hidden in them),
    as its buffers' dtype holds them (a model cast to float16 holds them rounded)."""
    for name, tensor in source.tensors.items():
        if name.endswith("inv_freq") and not torch.allclose(tensor.float().cpu(), frequencies.to(tensor.dtype).float(), rtol=1e-5):
            raise ConversionError(f"{what}'s rotary frequencies ({name}) are not those of its rope settings; blockforge does not model that")


def _float32_reference(hf_model: nn.Module, frequencies: torch.Tensor) -> nn.Module:
    """The source as the float32 model the conversion holds (the source itself when it is float32): weights cast
    exactly, rotary frequencies set to their float32 values, which a half-precision buffer holds rounded."""
    if all(t.dtype == torch.float32 for t in (*hf_model.parameters(), *hf_model.buffers()) if t.is_floating_point()):
        return hf_model
    import copy

    reference = copy.deepcopy(hf_model).float()
    with torch.no_grad():
        for name, buffer in reference.named_buffers():
            if name.endswith("inv_freq"):
                buffer.copy_(frequencies)
    return reference


def _say_precision(hf_model: nn.Module, what: str) -> None:
    narrow = sorted({str(p.dtype).removeprefix("torch.") for p in hf_model.parameters()} - {"float32"})
    if narrow:
        warn(f"{what} holds {' and '.join(narrow)} weights; converted to float32 (every value kept exactly) and checked against "
             "a float32 copy of it")


def from_hf_llama(hf_model: nn.Module) -> nn.Module:
    """A blockforge llama with the weights of a Hugging Face Llama, Mistral or Qwen2 causal LM (every layer Pre-LN).

    Every tensor of the source is mapped or the conversion is refused by name; the result is then run
    beside the source on a random input and refused unless the logits agree within 1e-4.
    """
    what = f"this {type(hf_model).__name__}"
    if getattr(hf_model.config, "model_type", None) not in CONVERTED_TYPES:
        raise ConversionError(f"{what} has model_type '{getattr(hf_model.config, 'model_type', None)}'; "
                              f"from_hf_llama converts {', '.join(CONVERTED_TYPES)}")
    spec = resolve(_spec_from_config(hf_model.config, what, _layer_windows(hf_model)))
    model = build_model(spec)
    source = TensorSource(hf_model, what, ignore=lambda name: name.endswith("inv_freq"))
    frequencies = rope_frequencies(spec.layers[0].head_dim, spec.rope_theta, spec.rope_scaling)
    _check_rotary_buffers(source, frequencies, what)
    _say_precision(hf_model, what)
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
    model.token_ids = {key: getattr(hf_model.config, key, None) for key in TOKEN_ID_KEYS}  # to_hf_llama gives them back
    model.eval()
    tokens = probe_tokens(spec)
    with torch.no_grad(), evaluating(_float32_reference(hf_model, frequencies.to(next(hf_model.parameters()).device))) as reference:
        check_same_outputs(model(tokens), reference(tokens.to(next(hf_model.parameters()).device)).logits.cpu(), what)
    return model


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str, what: str) -> None:
    if tensor.shape != target.shape:
        raise ConversionError(f"{what}'s {name} has shape {tuple(tensor.shape)} where blockforge's model has {tuple(target.shape)}")
    copy_weight(target, tensor)


def hf_llama_problems(spec: ResolvedSpec) -> list[str]:
    """What keeps `spec` from being a plain `LlamaForCausalLM` (empty when nothing does)."""
    layer0 = spec.layers[0]
    # LlamaForCausalLM has no q/k norms or layer scales, one RoPE base (the model's) and SiLU gates
    differ, extra = plain_problems(spec, keep_default=("qk_norm", "layer_scale", "rope_theta", "mlp_act"))
    checks = {
        f"it is a {spec.family} model": spec.family != "llama",
        "not every sub-layer is Pre-LN (LlamaForCausalLM has only Pre-LN layers)": not spec.uniform_pre(),
        "its layers differ in " + ", ".join(differ): bool(differ),
        "it has " + ", ".join(extra): bool(extra),
        "it has no final norm": not spec.final_norm,
        f"it uses {spec.norm}": spec.norm != "rmsnorm" or layer0.norm != "rmsnorm",
        f"its branches are scaled by {spec.branch_multiplier:.4g} (CompleteP)": spec.branch_multiplier != 1.0,
        f"its logits are scaled by {spec.readout_multiplier:.4g} (muP)": spec.readout_multiplier != 1.0,
        f"its logits are multiplied by {spec.logit_multiplier:.4g}": spec.logit_multiplier != 1.0,
        f"its logits are soft-capped at {spec.logit_softcap}": spec.logit_softcap is not None,
        f"its embeddings are scaled by {spec.embed_scale:.4g}": spec.embed_scale != 1.0,
        f"its RMSNorm gains are {spec.norm_weight_offset:g} + w": spec.norm_weight_offset != 0.0,
        f"its attention scores are scaled by {spec.attention_multiplier(layer0):.4g} beyond 1/sqrt(head_dim) (muP)":
            spec.attention_multiplier(layer0) != 1.0,
        "its q/k/v and output biases differ (HF's attention_bias sets all four)": spec.qkv_bias != spec.proj_bias,
    }
    return [problem for problem, present in checks.items() if present]


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def token_ids(model: nn.Module) -> dict[str, int | None]:
    """The bos, eos and pad ids a transformers config of `model` needs: those of the model it was converted from, else
    those of the tokenizer in the folder it was loaded from (blockforge.load), else none (never transformers' defaults,
    which in blockforge's own tokenizer name ordinary tokens)."""
    ids = getattr(model, "token_ids", None)
    if ids is not None:
        return dict(ids)
    folder = getattr(model, "tokenizer_dir", None)
    if folder is not None:
        from blockforge.data.tokenizer import load_tokenizer

        return load_tokenizer(folder).special_ids()
    return dict.fromkeys(TOKEN_ID_KEYS)


def to_hf_llama(model: nn.Module) -> nn.Module:
    """A `LlamaForCausalLM` with the weights of a uniform Pre-LN blockforge llama (GQA, head_dim, biases, llama3 RoPE kept),
    its config and generation config holding the model's token ids (see `token_ids`)."""
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
        attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias, **token_ids(model),
    )
    hf_model = LlamaForCausalLM(config)
    hf_model.generation_config.update(**token_ids(model))
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
    tokens = probe_tokens(spec)
    with torch.no_grad(), evaluating(_float32_copy(model)) as reference:
        check_same_outputs(hf_model(tokens).logits, reference(tokens), "to_hf_llama")
    return hf_model
