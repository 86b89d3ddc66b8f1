"""A blockforge llama as the transformers class that computes it: Llama, Mistral, Qwen2, Qwen3, OLMo 2, Gemma,
Gemma 2, Gemma 3 (text), Phi-3, SmolLM3 or Granite, with that class's own module names.

Whether a class expresses a model is decided by a round trip, not by a list of rules: the class's config is
written from the resolved spec, the class is built from it (on the meta device), and from_hf_llama's reading of
that config and those modules (families/llama_hf.py, checked against every class on random weights) must give
back what the spec computes (`computes`: every forward-relevant setting, none of the training-only ones). The
first class that does is used, the model's own source class first. Weights are then copied under the class's
names (the inverse of from_hf_llama's map) and the logits compared before anything is handed over.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from blockforge.families.conversion import ConversionError, check_same_outputs, evaluating, probe_tokens
from blockforge.families.llama_hf import (
    ACTIVATIONS, DESIGNS, TOKEN_ID_KEYS, _float32_cpu_copy, _interleaved_to_half_split, _layer_ropes, _layer_windows, _spec_from_config,
)
from blockforge.nn.build import copy_weight
from blockforge.spec.fields import plain_problems
from blockforge.spec.model import ResolvedSpec
from blockforge.spec.resolve import resolve

CLASSES = {  # model_type: (config class, model class), transformers' names
    "llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"), "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"), "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"), "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
}
PREFERENCE = tuple(CLASSES)  # tried in this order after the model's own source class
HF_ACTIVATIONS = {ours: theirs for theirs, ours in ACTIVATIONS.items()}  # blockforge's names -> transformers'


def _rounded(value: float | None) -> float | None:
    """Floats that went through a config (1 / s^2, then s = x^-1/2) compared to 10 significant digits."""
    return None if value is None else float(f"{value:.10g}")


def computes(spec: ResolvedSpec) -> dict[str, Any]:
    """What the forward pass of `spec`'s model depends on: two specs with the same `computes` give the same logits
    from the same weights. Initialization, learning rates and the parametrization's training rules are left out;
    its forward multipliers are in, as numbers."""
    layers = []
    for layer in spec.layers:
        base = layer.query_scale if layer.query_scale is not None else layer.head_dim ** -0.5
        layers.append({
            "placements": layer.placements, "heads": layer.heads, "kv_heads": layer.kv_heads, "head_dim": layer.head_dim, "ffn": layer.ffn,
            "window": layer.window, "norm": layer.norm, "qk_norm": layer.qk_norm and layer.qk_norm_over, "v_norm": layer.v_norm,
            "layer_scale": layer.layer_scale is not None, "mlp_act": spec.value(layer, "mlp_act"),
            "rope": (spec.value(layer, "rope_theta"), layer.rope_linear_factor or 1.0) if layer.rope else None,
            "scores": _rounded(base * spec.attention_multiplier(layer)), "softcap": layer.attn_logit_softcap,
        })
    return {
        "family": spec.family, "width": spec.width, "vocab": spec.vocab, "context": spec.context, "norm": spec.norm, "norm_eps": spec.norm_eps,
        "final_norm": spec.final_norm, "tie_embeddings": spec.tie_embeddings, "rope_scaling": spec.rope_scaling, "qkv_bias": spec.qkv_bias,
        "proj_bias": spec.proj_bias, "mlp_bias": spec.mlp_bias, "norm_weight_offset": spec.norm_weight_offset,
        "embed_scale": _rounded(spec.embed_scale), "logit_softcap": spec.logit_softcap,
        "logits": _rounded(spec.readout_multiplier * spec.logit_multiplier), "branch": _rounded(spec.branch_multiplier),
        "layers": layers,
    }


def _rope_parameters(spec: ResolvedSpec, layers) -> dict:
    """transformers' rope_parameters of `layers` (which share one base and one linear factor)."""
    layer = layers[0]
    theta = spec.value(layer, "rope_theta")
    if spec.rope_scaling is not None:
        s = spec.rope_scaling
        return {"rope_type": "llama3", "rope_theta": theta, "factor": s["factor"], "low_freq_factor": s["low_freq_factor"],
                "high_freq_factor": s["high_freq_factor"], "original_max_position_embeddings": s["original_context"]}
    if layer.rope_linear_factor is not None:
        return {"rope_type": "linear", "rope_theta": theta, "factor": layer.rope_linear_factor}
    return {"rope_type": "default", "rope_theta": theta}


def _config_settings(kind: str, spec: ResolvedSpec) -> dict[str, Any]:
    """The settings of a `kind` config that would hold `spec` (whether it does is checked after, by the round trip)."""
    first = spec.layers[0]
    windows = [layer.window for layer in spec.layers]
    window = max((w for w in windows if w is not None), default=None)  # a config holds one window
    types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
    act = HF_ACTIVATIONS.get(spec.value(first, "mlp_act"), "silu")
    settings: dict[str, Any] = dict(
        hidden_size=spec.width, num_hidden_layers=spec.depth, num_attention_heads=first.heads, num_key_value_heads=first.kv_heads,
        head_dim=first.head_dim, intermediate_size=first.ffn, vocab_size=spec.vocab, max_position_embeddings=spec.context,
        rms_norm_eps=spec.norm_eps, tie_word_embeddings=spec.tie_embeddings, rope_parameters=_rope_parameters(spec, spec.layers),
    )
    design = DESIGNS[kind]
    settings[design.activation_key] = act
    if kind not in ("mistral", "qwen2", "phi3"):  # those have no attention_bias flag (Qwen2: q/k/v biases always)
        settings["attention_bias"] = spec.qkv_bias
    if kind in ("llama", "smollm3", "granite"):
        settings["mlp_bias"] = spec.mlp_bias
    if kind in ("mistral", "phi3"):
        settings["sliding_window"] = window
    if kind in ("qwen2", "qwen3", "smollm3", "gemma2", "gemma3_text"):
        settings.update(layer_types=types, sliding_window=window)
        if kind in ("qwen2", "qwen3", "smollm3"):
            settings["use_sliding_window"] = window is not None
    if kind in ("gemma2", "gemma3_text"):
        scale = first.query_scale if first.query_scale is not None else first.head_dim ** -0.5
        scalar = scale ** -2
        settings.update(query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-9 else scalar,
                        attn_logit_softcapping=first.attn_logit_softcap, final_logit_softcapping=spec.logit_softcap)
    if kind == "gemma3_text":
        by_type = {t: [layer for layer, lt in zip(spec.layers, types) if lt == t] for t in ("sliding_attention", "full_attention")}
        settings["rope_parameters"] = {t: _rope_parameters(spec, layers or spec.layers) for t, layers in by_type.items()}
    if kind == "smollm3":
        settings["no_rope_layers"] = [int(layer.rope) for layer in spec.layers]
    if kind == "granite":
        settings.update(embedding_multiplier=spec.embed_scale, residual_multiplier=spec.residual_multiplier,
                        attention_multiplier=first.query_scale if first.query_scale is not None else first.head_dim ** -0.5,
                        logits_scaling=1.0 / spec.logit_multiplier)
    return settings


def native_config(kind: str, spec: ResolvedSpec, ids: dict | None = None):
    """The `kind` config that expresses `spec` exactly, or None when that class computes something else."""
    import transformers

    try:  # a config class refuses values it cannot hold (Gemma 2's query_pre_attn_scalar is a whole number)
        config = getattr(transformers, CLASSES[kind][0])(**_config_settings(kind, spec), **(ids or dict.fromkeys(TOKEN_ID_KEYS)))
        with torch.device("meta"):
            skeleton = getattr(transformers, CLASSES[kind][1])(config)
        back = resolve(_spec_from_config(config, f"a {kind} config", _layer_windows(skeleton), _layer_ropes(skeleton)))
    except Exception:  # noqa: BLE001 (config classes validate with errors of their own: any of them means "cannot hold")
        return None
    return config if computes(back) == computes(spec) else None


def native_kind(spec: ResolvedSpec, prefer: str | None = None) -> str | None:
    """The model_type of the first transformers class that expresses `spec` exactly (`prefer` tried first), or None."""
    if spec.family != "llama" or spec.final_norm is False:
        return None
    for kind in ((prefer,) if prefer in CLASSES else ()) + PREFERENCE:
        if native_config(kind, spec) is not None:
            return kind
    return None


def hf_tensors(model: nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """`model`'s weights under the `kind` class's names: from_hf_llama's map, read backwards."""
    design, spec = DESIGNS[kind], model.spec
    out = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight,
           "lm_head.weight": model.embed.weight if spec.tie_embeddings else model.head.weight}
    for i, (block, layer) in enumerate(zip(model.layers, spec.layers)):
        prefix = f"model.layers.{i}."
        for (sub, slot), name in design.norm_slots.items():
            out[prefix + f"{name}.weight"] = getattr(getattr(block, sub), slot).weight
        attn, mlp = block.attn.branch, block.mlp.branch
        q_rows, k_rows = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
        for part in ("weight", "bias"):
            if getattr(attn.qkv, part) is None:
                continue
            q, k, v = getattr(attn.qkv, part).split([q_rows, k_rows, k_rows])
            q, k = _interleaved_to_half_split(q, layer.heads), _interleaved_to_half_split(k, layer.kv_heads)
            if design.fused:
                out[prefix + f"self_attn.qkv_proj.{part}"] = torch.cat([q, k, v])
            else:
                out.update({prefix + f"self_attn.{x}_proj.{part}": t for x, t in zip("qkv", (q, k, v))})
        if design.qk_norm is not None:
            for name, heads in (("q_norm", layer.heads), ("k_norm", layer.kv_heads)):
                gains = getattr(attn, name).weight
                out[prefix + f"self_attn.{name}.weight"] = _interleaved_to_half_split(gains, heads if design.qk_norm == "projection" else 1)
        out[prefix + "self_attn.o_proj.weight"] = attn.proj.weight
        if attn.proj.bias is not None:
            out[prefix + "self_attn.o_proj.bias"] = attn.proj.bias
        for part in ("weight", "bias"):
            if getattr(mlp.down, part) is None:
                continue
            gate_up = getattr(mlp.gate_up, part)
            if design.fused:
                out[prefix + f"mlp.gate_up_proj.{part}"] = gate_up
            else:
                out[prefix + f"mlp.gate_proj.{part}"], out[prefix + f"mlp.up_proj.{part}"] = gate_up.split(layer.ffn)
            out[prefix + f"mlp.down_proj.{part}"] = getattr(mlp.down, part)
    return out


def to_hf(model: nn.Module, kind: str | None = None, *, ids: dict | None = None, generation: dict | None = None) -> nn.Module:
    """`model` as the transformers class that computes it (the `kind` given, else the first that does, the class it was
    converted from first), with its token ids (`ids`, default `token_ids(model)`) and generation settings (default: those
    of the model it was converted from); refused in one sentence when no class does."""
    import transformers
    from transformers import GenerationConfig

    spec: ResolvedSpec = model.spec
    record = getattr(model, "hf_source", None) or {}
    kind = kind or native_kind(spec, prefer=record.get("model_type"))
    ids = token_ids(model) if ids is None else ids
    generation = record.get("generation_config") if generation is None else generation
    config = native_config(kind, spec, ids) if kind is not None else None
    if config is None:
        what = f"the {CLASSES[kind][1]} class" if kind in CLASSES else "any transformers class blockforge knows"
        raise ConversionError(f"{what} does not compute this model ({spec.family}, {spec.depth} layers); "
                              "export it with --format hf, which ships blockforge's modeling file for what no class computes")
    hf_model = getattr(transformers, CLASSES[kind][1])(config)
    with torch.no_grad():
        tensors = hf_tensors(model, kind)
        targets = hf_model.state_dict()
        missing = sorted(set(targets) - set(tensors))
        if missing or set(tensors) - set(targets):
            raise ConversionError(f"the {CLASSES[kind][1]} has tensors {missing[:3]} blockforge's map does not fill; refused")
        for name, tensor in tensors.items():
            copy_weight(targets[name], tensor.detach())
    hf_model.generation_config = GenerationConfig(**{**ids, **(generation or {})})  # exactly these settings, nothing taken from the config
    hf_model.eval()
    tokens = probe_tokens(spec)
    with torch.no_grad(), evaluating(_float32_cpu_copy(model)) as reference:
        check_same_outputs(hf_model(tokens).logits, reference(tokens), f"the {CLASSES[kind][1]}", cause="so the class computes something else")
    return hf_model


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


def llama_cpp_problems(spec: ResolvedSpec) -> list[str]:
    """What keeps `spec` from llama.cpp's `llama` architecture (empty when nothing does): a plain LlamaForCausalLM's list,
    plus biases and RoPE scaling, which `--format gguf` does not write."""
    found = hf_llama_problems(spec)
    if spec.rope_scaling is not None or any(layer.rope_linear_factor for layer in spec.layers):
        found.append("its RoPE is scaled")
    if spec.qkv_bias or spec.proj_bias or spec.mlp_bias:
        found.append("it has biases")
    if any(not layer.rope for layer in spec.layers):
        found.append("some layers have no RoPE")
    return found


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
    its config and generation config holding the model's token ids (see `token_ids`). Other classes: hf_native.to_hf."""
    problems = hf_llama_problems(model.spec)
    if problems:
        raise ConversionError("to_hf_llama needs what LlamaForCausalLM computes (uniform Pre-LN RMSNorm layers, a final norm), but " + "; ".join(problems))
    return to_hf(model, "llama")
