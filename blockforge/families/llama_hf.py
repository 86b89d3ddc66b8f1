"""Weights from Hugging Face's open decoders into a blockforge llama, and to `transformers.LlamaForCausalLM`.

from_hf_llama converts Llama-2/3, TinyLlama, Mistral (one sliding window), Qwen2 (q/k/v biases, per-layer
layer_types), Qwen3 (q/k norms), OLMo 2 (norms after each branch, q/k norms over the whole projection),
Gemma (1 + w norms, scaled embeddings, GeGLU), Gemma 2 (sandwich norms, query scale, soft-capped attention
and logits, alternating windows), Gemma 3 text (q/k norms, 5 local : 1 global layers with their own RoPE
base), Phi-3 (fused q/k/v and gate/up), SmolLM3 (no RoPE in some layers) and Granite (embedding, residual,
attention and logit multipliers). Anything blockforge does not model (other rope scalings, partial rotary
embeddings, other model types, ...) is refused with a sentence naming it, never silently dropped. Every
conversion checks its result against its source on random tokens past its longest window
(families/conversion.py). to_hf_llama goes the other way for uniform Pre-LN RMSNorm llamas.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from blockforge.errors import warn
from blockforge.families.conversion import ConversionError, TensorSource, check_same_outputs, evaluating, probe_tokens, quiet_transformers
from blockforge.nn.build import build_model, copy_weight
from blockforge.nn.attention import rope_frequencies
from blockforge.spec.model import LayerOverride, LayerRules, LayerSettings, ModelSpec, ResolvedSpec, RopeScaling
from blockforge.spec.resolve import resolve


def _half_split_to_interleaved(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder query/key rows (a weight or a bias) from Hugging Face's RoPE pairing (j, j + hs/2) to adjacent pairs (2j, 2j+1)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _interleaved_to_half_split(rows: torch.Tensor, heads: int) -> torch.Tensor:
    return rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


ROPE_TYPES = ("default", "llama3", "linear")
NORM_SLOTS = {  # per placement: blockforge's norm slots (sub-layer, slot) and the Hugging Face decoder's names for them
    "pre": {("attn", "in_norm"): "input_layernorm", ("mlp", "in_norm"): "post_attention_layernorm"},
    "respost": {("attn", "branch_norm"): "post_attention_layernorm", ("mlp", "branch_norm"): "post_feedforward_layernorm"},
    "sandwich": {("attn", "in_norm"): "input_layernorm", ("attn", "branch_norm"): "post_attention_layernorm",
                 ("mlp", "in_norm"): "pre_feedforward_layernorm", ("mlp", "branch_norm"): "post_feedforward_layernorm"},
}


@dataclass(frozen=True)
class Design:
    """How a Hugging Face decoder's layers are built, in blockforge's terms (what a config does not say)."""

    placement: str = "pre"  # pre | respost (OLMo 2: norms after each branch) | sandwich (Gemma 2/3: before and after)
    qk_norm: str | None = None  # per "head" (Qwen3, Gemma 3) or over the whole "projection" (OLMo 2); None: none
    norm_offset: float = 0.0  # RMSNorm gains as 1 + w (Gemma)
    fused: bool = False  # one qkv_proj and one gate_up_proj (Phi-3)
    activation_key: str = "hidden_act"  # the config key naming the MLP's activation

    @property
    def norm_slots(self) -> dict[tuple[str, str], str]:
        """(sub-layer, slot) -> the name of the norm the decoder keeps there."""
        return NORM_SLOTS[self.placement]


DESIGNS = {
    "llama": Design(), "mistral": Design(), "qwen2": Design(), "granite": Design(), "smollm3": Design(),
    "qwen3": Design(qk_norm="head"),
    "olmo2": Design(placement="respost", qk_norm="projection"),
    "gemma": Design(norm_offset=1.0, activation_key="hidden_activation"),
    "gemma2": Design(placement="sandwich", norm_offset=1.0, activation_key="hidden_activation"),
    "gemma3_text": Design(placement="sandwich", qk_norm="head", norm_offset=1.0, activation_key="hidden_activation"),
    "phi3": Design(fused=True),
}
CONVERTED_TYPES = tuple(DESIGNS)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}  # transformers' names -> blockforge's


def _float32_cpu_copy(model: nn.Module) -> nn.Module:
    """`model` itself where every weight is float32 on the CPU, else such a copy: conversions, exports and their checks run
    there, whatever device and precision the model trained in."""
    import copy

    if all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters()):
        return model

    def on_cpu(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.float32 if tensor.is_floating_point() else tensor.dtype, copy=True)

    # Each tensor goes to the CPU on its own (a tied weight stays one), so a model on a GPU is never copied there.
    memo = {id(p): nn.Parameter(on_cpu(p), requires_grad=p.requires_grad) for p in model.parameters()}
    memo.update({id(b): on_cpu(b) for b in model.buffers()})
    return copy.deepcopy(model, memo)


def _rope_of(rope: dict | None, config) -> dict:
    rope = rope or {}
    return {**rope, "rope_type": rope.get("rope_type", rope.get("type", "default")),
            "rope_theta": rope.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)}


def _ropes(config) -> list[dict]:
    """Each layer's RoPE settings as the source computes them (Gemma 3: one per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):  # per layer type
        return [_rope_of(params.get(kind), config) for kind in types]
    return [_rope_of(params, config)] * config.num_hidden_layers


def _layer_windows(hf_model: nn.Module) -> list[int | None]:
    """Each layer's sliding window (None: global) as the source's code applies it, not as a config field claims:
    Llama attends globally; Mistral and Phi-3 window every layer with `sliding_window` (Mistral's code ignores
    `layer_types`); the others' attention modules carry their own window. A window as long as the context
    excludes nothing."""
    config = hf_model.config
    layers = hf_model.model.layers
    if config.model_type in ("mistral", "phi3"):
        windows = [getattr(config, "sliding_window", None)] * len(layers)
    elif config.model_type == "llama":
        windows = [None] * len(layers)
    else:
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in layers]
    return [window if window is not None and window < config.max_position_embeddings else None for window in windows]


def _layer_ropes(hf_model: nn.Module) -> list[bool]:
    """Whether each layer rotates its queries and keys (SmolLM3 leaves RoPE out of some: NoPE)."""
    return [bool(getattr(layer.self_attn, "use_rope", True)) for layer in hf_model.model.layers]


def _spec_from_config(config, what: str, windows: list[int | None], ropes: list[bool] | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face decoder config with the layers' `windows` (and RoPE on or off), or a
    ConversionError naming what blockforge cannot hold."""
    design = DESIGNS[config.model_type]
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layer_ropes = _ropes(config)
    act = getattr(config, design.activation_key, None) or getattr(config, "hidden_act", None)
    partial = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    kinds = {r["rope_type"] for r in layer_ropes}
    refusals = {
        f"rope type {sorted(kinds - set(ROPE_TYPES))} (blockforge models {', '.join(ROPE_TYPES)})": not kinds <= set(ROPE_TYPES),
        "llama3 RoPE scaling in some layers only": "llama3" in kinds and len(kinds) > 1,
        f"activation '{act}'": act not in ACTIVATIONS,
        f"partial rotary embeddings (factor {partial})": partial not in (None, 1.0),
        "layer types other than full and sliding attention": not set(getattr(config, "layer_types", None) or ["full_attention"]) <= {
            "full_attention", "sliding_attention"},
        "bidirectional attention": bool(getattr(config, "use_bidirectional_attention", False)),
    }
    for feature, present in refusals.items():
        if present:
            raise ConversionError(f"{what} uses {feature}, which blockforge's llama does not model")
    scaling = None
    first = layer_ropes[0]
    if first["rope_type"] == "llama3":
        scaling = RopeScaling(type="llama3", factor=float(first["factor"]), low_freq_factor=float(first["low_freq_factor"]),
                              high_freq_factor=float(first["high_freq_factor"]), original_context=int(first["original_max_position_embeddings"]))
    thetas = [float(r["rope_theta"]) for r in layer_ropes]
    model_theta = max(set(thetas), key=thetas.count)
    linear = [float(r["factor"]) if r["rope_type"] == "linear" else None for r in layer_ropes]  # positions divided by it
    shared_linear = linear[0] if len(set(linear)) == 1 else None  # every layer's (a llama with linear scaling): the default
    ropes = ropes or [True] * config.num_hidden_layers
    gemma = config.model_type.startswith("gemma")
    granite = config.model_type == "granite"
    query_scale = None
    if getattr(config, "query_pre_attn_scalar", None) is not None and config.model_type in ("gemma2", "gemma3_text"):
        query_scale = float(config.query_pre_attn_scalar) ** -0.5
    if granite:
        query_scale = float(config.attention_multiplier)
    softcap = getattr(config, "attn_logit_softcapping", None) if config.model_type in ("gemma2", "gemma3_text") else None
    overrides = []
    for i in range(config.num_hidden_layers):
        settings = {}
        if windows[i] is not None:
            settings["window"] = windows[i]
        if thetas[i] != model_theta:
            settings["rope_theta"] = thetas[i]
        if linear[i] is not None and linear[i] != shared_linear:
            settings["rope_linear_factor"] = linear[i]
        if not ropes[i]:
            settings["rope"] = False
        if settings:
            overrides.append(LayerOverride(at=[i], **settings))
    attention_bias = bool(getattr(config, "attention_bias", False))
    default = LayerSettings(placement=design.placement, qk_norm=design.qk_norm is not None, qk_norm_over=design.qk_norm or "head",
                            mlp_act=ACTIVATIONS[act], query_scale=query_scale, attn_logit_softcap=softcap, rope_linear_factor=shared_linear)
    return ModelSpec(
        family="llama", width=config.hidden_size, depth=config.num_hidden_layers, heads=heads, head_dim=head_dim,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, ffn=config.intermediate_size, vocab=config.vocab_size,
        context=config.max_position_embeddings, norm_eps=config.rms_norm_eps,
        rope_theta=model_theta, rope_scaling=scaling,
        tie_embeddings=bool(config.tie_word_embeddings), qkv_bias=attention_bias or config.model_type == "qwen2", proj_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)), norm_weight_offset=design.norm_offset,
        embed_scale=float(config.hidden_size) ** 0.5 if gemma else float(getattr(config, "embedding_multiplier", 1.0)),
        residual_multiplier=float(getattr(config, "residual_multiplier", 1.0)) if granite else 1.0,
        logit_multiplier=1.0 / float(config.logits_scaling) if granite else 1.0,
        logit_softcap=getattr(config, "final_logit_softcapping", None) if config.model_type in ("gemma2", "gemma3_text") else None,
        layers=LayerRules(default=default, overrides=overrides),
    )


def _frequency_tables(spec: ResolvedSpec) -> list[torch.Tensor]:
    """The rotary frequencies of each (head_dim, theta, linear factor) the model's layers use."""
    keys = sorted({(layer.head_dim, spec.value(layer, "rope_theta"), layer.rope_linear_factor or 1.0) for layer in spec.layers if layer.rope})
    return [rope_frequencies(dim, theta, spec.rope_scaling) / factor for dim, theta, factor in keys]


def _matching(tensor: torch.Tensor, tables: list[torch.Tensor]) -> torch.Tensor | None:
    """The table a rotary buffer holds, as its dtype holds it (a model cast to float16 holds them rounded)."""
    return next((t for t in tables if t.shape == tensor.shape and torch.allclose(tensor.float().cpu(), t.to(tensor.dtype).float(), rtol=1e-5)), None)


def _check_rotary_buffers(source: TensorSource, tables: list[torch.Tensor], what: str) -> None:
    """The source's rotary frequencies must be ones blockforge computes (no other scaling hidden in them)."""
    for name, tensor in source.tensors.items():
        if name.endswith("inv_freq") and _matching(tensor, tables) is None:
            raise ConversionError(f"{what}'s rotary frequencies ({name}) are not those of its rope settings; blockforge does not model that")


def _float32_reference(hf_model: nn.Module, tables: list[torch.Tensor]) -> nn.Module:
    """The source as the float32 model the conversion holds (the source itself when it is float32): weights cast
    exactly, rotary frequencies set to their float32 values, which a half-precision buffer holds rounded."""
    if all(t.dtype == torch.float32 for t in (*hf_model.parameters(), *hf_model.buffers()) if t.is_floating_point()):
        return hf_model
    import copy

    reference = copy.deepcopy(hf_model)
    originals = dict(hf_model.named_buffers())
    reference.float()
    with torch.no_grad():
        for name, buffer in reference.named_buffers():
            if name.endswith("inv_freq"):
                buffer.copy_(_matching(originals[name], tables))
    return reference


def _say_precision(hf_model: nn.Module, what: str) -> None:
    narrow = sorted({str(p.dtype).removeprefix("torch.") for p in hf_model.parameters()} - {"float32"})
    if narrow:
        warn(f"{what} holds {' and '.join(narrow)} weights; converted to float32 (every value kept exactly) and checked against "
             "a float32 copy of it")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")  # what a tokenizer is saved as


def spec_of_config(folder: str | os.PathLike):
    """The resolved spec a transformers folder's config.json configures, from the config alone (its model built on the meta
    device: no weight is read or allocated). Anything it cannot configure is one ConversionError naming config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(folder) / "config.json"
    try:
        config = AutoConfig.from_pretrained(Path(folder), local_files_only=True)
    except Exception as err:
        raise ConversionError(f"{path} cannot be read by transformers ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if config.model_type not in DESIGNS:
        raise ConversionError(f"{path} configures a model of type '{config.model_type}'; blockforge converts {', '.join(CONVERTED_TYPES)}")
    try:
        with torch.device("meta"), quiet_transformers():
            skeleton = AutoModelForCausalLM.from_config(config)
        return resolve(_spec_from_config(config, f"{path}", _layer_windows(skeleton), _layer_ropes(skeleton)))
    except ConversionError:
        raise
    except Exception as err:  # noqa: BLE001 (a config transformers reads but no model is built from: zero layers, sizes that do not divide)
        raise ConversionError(f"{path}: configures no model blockforge can build ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def load_hf_folder(folder: str | os.PathLike) -> nn.Module:
    """The causal language model in a local transformers folder, loaded with every weight from its files (a folder
    whose head or any other weight is missing is refused: transformers would draw it at random)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConversionError(f"{folder}: no config.json here; give the folder of a transformers model (or the model itself)")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as err:
        raise ConversionError(f"{folder}/config.json cannot be read by transformers ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if config.model_type not in DESIGNS:
        raise ConversionError(f"{folder} holds a model of type '{config.model_type}'; blockforge converts {', '.join(CONVERTED_TYPES)}")
    try:
        with quiet_transformers():  # the missing weights are refused below, by name
            model, info = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    except Exception as err:
        raise ConversionError(f"{folder}: its weights cannot be loaded ({type(err).__name__}: {str(err).splitlines()[0]}); "
                              "check model.safetensors") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        head = " (a base model without its language-model head)" if any(name.startswith("lm_head") for name in missing) else ""
        raise ConversionError(f"{folder} has no weights for {', '.join(missing[:3])}{more}{head}; transformers would draw them at "
                              "random, so it is not converted")
    model.hf_folder = folder.resolve()
    return model.eval()


def _source_record(hf_model: nn.Module) -> dict:
    """What a converted model keeps of its source: its class, where it came from, its precision and generation settings."""
    config = hf_model.config
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in hf_model.parameters()})
    generation = getattr(hf_model, "generation_config", None)
    folder = getattr(hf_model, "hf_folder", None)
    return {"model_type": config.model_type, "class": type(hf_model).__name__, "name_or_path": getattr(config, "_name_or_path", "") or "",
            "dtype": dtypes[0] if len(dtypes) == 1 else "float32", "folder": str(folder) if folder is not None else None,
            "generation_config": generation.to_diff_dict() if generation is not None else {}}


def from_hf_llama(hf_model: nn.Module | str | os.PathLike) -> nn.Module:
    """A blockforge llama with the weights of a Hugging Face decoder: Llama, Mistral, Qwen2, Qwen3, OLMo 2, Gemma,
    Gemma 2, Gemma 3 (text), Phi-3, SmolLM3 or Granite (DESIGNS says how each is built), given as a model or as the
    path of its local folder.

    Every tensor of the source is mapped or the conversion is refused by name; the result is then run
    beside the source on random tokens past its longest window and refused unless the logits agree within 1e-4.
    The result keeps a record of its source (`hf_source`: class, precision, generation settings, folder), which
    blockforge.save writes beside it and `--format hf` uses to export it as that class again.
    """
    hf_model, what = _convertible(hf_model)
    design = DESIGNS[hf_model.config.model_type]
    spec = resolve(_spec_from_config(hf_model.config, what, _layer_windows(hf_model), _layer_ropes(hf_model)))
    model = build_model(spec)
    source = TensorSource(hf_model, what, ignore=lambda name: name.endswith("inv_freq") or name.endswith("embed_scale"))
    tables = _frequency_tables(spec)
    _check_rotary_buffers(source, tables, what)
    _say_precision(hf_model, what)
    _copy_weights(source, model, design, what)
    model.token_ids = {key: getattr(hf_model.config, key, None) for key in TOKEN_ID_KEYS}  # to_hf_llama gives them back
    model.hf_source = _source_record(hf_model)
    model.eval()
    tokens = probe_tokens(spec)
    device = next(hf_model.parameters()).device
    with torch.no_grad(), evaluating(_float32_reference(hf_model, [t.to(device) for t in tables])) as reference:
        check_same_outputs(model(tokens), reference(tokens.to(device)).logits.cpu(), what)
    return model


def _convertible(hf_model: nn.Module | str | os.PathLike) -> tuple[nn.Module, str]:
    """The transformers model to convert (loaded from its folder when given a path) and what messages call it; refused in
    one sentence unless it is a causal language model of a type in DESIGNS."""
    if isinstance(hf_model, (str, os.PathLike)):
        hf_model = load_hf_folder(hf_model)
    if not isinstance(hf_model, nn.Module) or not hasattr(hf_model, "config"):
        raise ConversionError(f"from_hf_llama takes a transformers model (e.g. AutoModelForCausalLM.from_pretrained(folder)) or the path of "
                              f"its folder, not a {type(hf_model).__name__}")
    what = f"this {type(hf_model).__name__}"
    kind = getattr(hf_model.config, "model_type", None)
    if kind not in DESIGNS:
        raise ConversionError(f"{what} has model_type '{kind}'; from_hf_llama converts {', '.join(CONVERTED_TYPES)}")
    if not hasattr(hf_model, "model") or hf_model.get_output_embeddings() is None:
        raise ConversionError(f"{what} is a base model without a language-model head, so it has no logits to convert; give its "
                              "...ForCausalLM (AutoModelForCausalLM.from_pretrained(folder))")
    return hf_model, what


def _copy_weights(source: TensorSource, model: nn.Module, design: Design, what: str) -> None:
    """Every tensor of `source` into `model` (hf_native.hf_tensors is this map read backwards); refused by name where one
    is missing, left over or of another shape."""
    spec = model.spec
    source.copy_into(model.embed.weight, "model.embed_tokens.weight")
    for i, (block, layer) in enumerate(zip(model.layers, spec.layers)):
        _copy_layer(source, block, layer, spec, design, f"model.layers.{i}.", what)
    source.copy_into(model.final_norm.weight, "model.norm.weight")
    if spec.tie_embeddings:
        if source.has("lm_head.weight"):
            source.take("lm_head.weight")  # the embedding, under its second name
    else:
        source.copy_into(model.head.weight, "lm_head.weight")
    source.finish()


def _copy_layer(source: TensorSource, block: nn.Module, layer, spec: ResolvedSpec, design: Design, prefix: str, what: str) -> None:
    """One decoder layer (its tensors named `prefix`...) into `block`: norms, attention (queries and keys reordered to
    blockforge's RoPE pairing), MLP."""
    for (sub, slot), name in design.norm_slots.items():
        source.copy_into(getattr(getattr(block, sub), slot).weight, prefix + f"{name}.weight")
    attn = block.attn.branch
    q_rows, k_rows = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
    for part in ("weight", "bias"):
        if getattr(attn.qkv, part) is None:
            continue
        if design.fused:
            q, k, v = source.take(prefix + f"self_attn.qkv_proj.{part}").split([q_rows, k_rows, k_rows])
        else:
            q, k, v = (source.take(prefix + f"self_attn.{x}_proj.{part}") for x in "qkv")
        fused = torch.cat([_half_split_to_interleaved(q, layer.heads), _half_split_to_interleaved(k, layer.kv_heads), v])
        _copy_checked(getattr(attn.qkv, part), fused, prefix + f"self_attn.q/k/v_proj.{part}", what)
    if design.qk_norm is not None:  # the norm's gains follow the rows they scale
        for name, heads in (("q_norm", layer.heads), ("k_norm", layer.kv_heads)):
            gains = source.take(prefix + f"self_attn.{name}.weight")
            _copy_checked(getattr(attn, name).weight, _half_split_to_interleaved(gains, heads if design.qk_norm == "projection" else 1),
                          prefix + f"self_attn.{name}.weight", what)
    source.copy_into(attn.proj.weight, prefix + "self_attn.o_proj.weight")
    if spec.proj_bias:
        source.copy_into(attn.proj.bias, prefix + "self_attn.o_proj.bias")
    mlp = block.mlp.branch
    for part in ("weight", "bias") if spec.mlp_bias else ("weight",):
        if design.fused:
            gate_up = source.take(prefix + f"mlp.gate_up_proj.{part}")
        else:
            gate_up = torch.cat([source.take(prefix + f"mlp.gate_proj.{part}"), source.take(prefix + f"mlp.up_proj.{part}")])
        _copy_checked(getattr(mlp.gate_up, part), gate_up, prefix + f"mlp.gate/up_proj.{part}", what)
        source.copy_into(getattr(mlp.down, part), prefix + f"mlp.down_proj.{part}")


from_hf = from_hf_llama  # the name for every decoder it converts


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str, what: str) -> None:
    if tensor.shape != target.shape:
        raise ConversionError(f"{what}'s {name} has shape {tuple(tensor.shape)} where blockforge's model has {tuple(target.shape)}")
    copy_weight(target, tensor)


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
