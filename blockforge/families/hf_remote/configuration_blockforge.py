"""The configuration of a blockforge llama in transformers: its resolved spec, one entry per layer.

Nothing is inferred when the model is built: every layer lists its norm type, its attention (heads,
key/value heads, head size, sliding window, per-head q/k/v norms, biases), its ffn width and MLP bias,
and for each of its two sub-layers (attention, MLP) which norm slots are filled, the residual and
input scales, whether it has a layer scale and its constant branch multiplier; under muP the scores'
scale of each layer and the readout multiplier of the logits. The model fields have
no defaults, so config.json spells every one of them out; `rope_frequency_scaling` is null for plain RoPE.

From `layers` the configuration also derives what transformers' own machinery reads (never set by hand):
`layer_types` and `sliding_window`, which decide the cache layers (a sliding layer's cache holds only its
window) and masks, and `num_attention_heads`, `num_key_value_heads` and `head_dim`, with layers that differ
from the first one given in `per_layer_config`, so a static cache is shaped per layer.
"""

from __future__ import annotations

try:
    from transformers import PreTrainedConfig  # transformers 5: a dataclass, finished in __post_init__
    DATACLASS_CONFIG = True
except ImportError:  # transformers 4.x: the older name, built by __init__
    from transformers import PretrainedConfig as PreTrainedConfig
    DATACLASS_CONFIG = False

NORMS = ("rmsnorm", "layernorm", "dyt")
SLOTS = ("in_norm", "branch_norm", "out_norm")
SUBLAYER_KEYS = {*SLOTS, "residual_scale", "input_scale", "layer_scale", "branch_multiplier"}
LAYER_KEYS = {"placement", "norm", "heads", "kv_heads", "head_dim", "ffn", "window", "qk_norm", "v_norm", "qkv_bias", "proj_bias", "mlp_bias",
              "attn", "mlp"}
# Keys exports before them lack: the scores' scale when not 1/sqrt(head_dim) (muP, a query scale), a RoPE base of the
# layer's own (null: the model's), RoPE on or off, q/k norms per head or over the whole projection, the MLP's activation.
OPTIONAL_LAYER_KEYS = {"attention_scale", "rope_theta", "rope", "qk_norm_over", "mlp_act", "attn_logit_softcap", "rope_linear_factor"}
ROPE_SCALING_KEYS = {"type", "factor", "low_freq_factor", "high_freq_factor", "original_context"}
REQUIRED = ("vocab_size", "hidden_size", "max_position_embeddings", "norm", "norm_eps", "final_norm", "rope_theta", "tie_word_embeddings")
# transformers' names for what each layer holds (derived from `layers`)
DERIVED = {"sliding_window": "window", "num_attention_heads": "heads", "num_key_value_heads": "kv_heads", "head_dim": "head_dim"}


class BlockforgeLlamaConfig(PreTrainedConfig):
    """layers[i].attn (and .mlp) computes  out_norm(residual_scale * x + m * g * branch_norm(F(input_scale * in_norm(x)))),
    g a per-channel layer scale (when `layer_scale`), m the constant `branch_multiplier`."""

    model_type = "blockforge_llama"

    vocab_size: int | None = None
    hidden_size: int | None = None
    max_position_embeddings: int | None = None  # the context the model was trained on
    norm: str | None = None  # the final norm's type: rmsnorm | layernorm | dyt (each layer names its own)
    norm_eps: float | None = None
    final_norm: bool | None = None
    rope_theta: float | None = None  # interleaved RoPE: pairs (2j, 2j+1) of each head
    rope_frequency_scaling: dict | None = None  # Llama-3's: {type: llama3, factor, low_freq_factor, high_freq_factor, original_context}
    tie_word_embeddings: bool | None = None
    readout_multiplier: float = 1.0  # the logits times this (muP's 1/m, a logit multiplier)
    logit_softcap: float | None = None  # logits c * tanh(logits / c) after the multiplier (Gemma 2)
    embed_scale: float = 1.0  # the token embeddings times this (Gemma, Granite)
    norm_weight_offset: float = 0.0  # RMSNorm gains used as offset + weight (Gemma: 1)
    layers: list | None = None
    num_hidden_layers: int | None = None
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    blockforge_arch_hash: str | None = None
    blockforge_spec: dict | None = None  # the resolved spec, as spec.yaml holds it: blockforge.load reads the folder by it
    # derived from `layers` in __post_init__, for transformers' caches and masks
    layer_types: list | None = None
    sliding_window: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    # derived too, for serving engines that apply them outside the model (vLLM): the logits' scale, then their cap
    # (c / scale, so that scale * cap * tanh(z / cap) is c * tanh(scale * z / c)), and the scores' cap when every layer has it
    logit_scale: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None

    if not DATACLASS_CONFIG:

        def __init__(self, **kwargs):
            for name in FIELDS:
                if name in kwargs:
                    setattr(self, name, kwargs.pop(name))
            kwargs.setdefault("tie_word_embeddings", self.tie_word_embeddings if self.tie_word_embeddings is not None else False)
            for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
                kwargs.setdefault(name, getattr(self, name))
            kwargs.pop("per_layer_config", None)  # 5.x's, which 4.x does not read
            self._finish()
            windows = {layer["window"] for layer in self.layers} - {None}
            if len(windows) > 1:
                raise ValueError(f"this model's layers have {len(windows)} different sliding windows ({sorted(windows)}), which transformers "
                                 "4.x masks as one; load it with transformers 5")
            super().__init__(**kwargs)

    def __post_init__(self, **kwargs):
        kwargs.pop("per_layer_config", None)  # derived from `layers`, never taken from a file
        super().__post_init__(**kwargs, **self._finish())

    def _finish(self) -> dict:
        """Check `layers` and derive transformers' per-layer attributes from them; returns the per_layer_config 5.x takes."""
        self.layers = [dict(layer) for layer in self.layers or []]
        if self.num_hidden_layers is not None and self.num_hidden_layers != len(self.layers):
            raise ValueError(f"num_hidden_layers is {self.num_hidden_layers} but {len(self.layers)} layers are listed")
        self.num_hidden_layers = len(self.layers)
        if not self.layers:  # an empty configuration (the defaults transformers compares against) describes no model
            return {}
        self._check()
        return {"per_layer_config": self._derive()}

    def _derive(self) -> dict | None:
        """Set transformers' per-layer attributes from `layers`; the layers that differ from the first, by index."""
        self.logit_scale = self.readout_multiplier
        self.final_logit_softcapping = self.logit_softcap / self.readout_multiplier if self.logit_softcap is not None else None
        caps = {layer.get("attn_logit_softcap") for layer in self.layers}
        self.attn_logit_softcapping = caps.pop() if len(caps) == 1 else None
        windows = [layer["window"] for layer in self.layers]
        self.layer_types = ["sliding_attention" if window is not None else "full_attention" for window in windows]
        first_window = next((window for window in windows if window is not None), None)
        reference = {**{name: self.layers[0][key] for name, key in DERIVED.items()}, "sliding_window": first_window}
        for name, value in reference.items():
            setattr(self, name, value)
        differing = {}
        for index, layer in enumerate(self.layers):
            values = {name: layer[key] for name, key in DERIVED.items()}
            if values["sliding_window"] is None:
                values["sliding_window"] = first_window  # a global layer: its window is never read
            changed = {name: value for name, value in values.items() if value != reference[name]}
            if changed:
                differing[index] = changed
        return differing or None

    def _check(self) -> None:
        missing = [key for key in REQUIRED if getattr(self, key) is None]
        if missing:
            raise ValueError(f"the configuration lacks {', '.join(missing)}")
        if self.norm not in NORMS:
            raise ValueError(f"norm '{self.norm}' is not one of {', '.join(NORMS)}")
        scaling = self.rope_frequency_scaling
        if scaling is not None and (set(scaling) != ROPE_SCALING_KEYS or scaling["type"] != "llama3"):
            raise ValueError(f"rope_frequency_scaling must be llama3's {sorted(ROPE_SCALING_KEYS)}, not {scaling}")
        for index, layer in enumerate(self.layers):
            if not LAYER_KEYS <= set(layer) <= LAYER_KEYS | OPTIONAL_LAYER_KEYS:
                raise ValueError(f"layers[{index}] has keys {sorted(layer)}; expected {sorted(LAYER_KEYS)} (and optionally "
                                 f"{sorted(OPTIONAL_LAYER_KEYS)})")
            if layer["norm"] not in NORMS:
                raise ValueError(f"layers[{index}]: norm '{layer['norm']}' is not one of {', '.join(NORMS)}")
            if layer["heads"] % layer["kv_heads"]:
                raise ValueError(f"layers[{index}]: {layer['kv_heads']} key/value heads do not divide {layer['heads']} heads")
            if layer["head_dim"] % 2:
                raise ValueError(f"layers[{index}]: head_dim {layer['head_dim']} is odd, which rotary embeddings cannot use")
            if layer["window"] is not None and layer["window"] < 1:
                raise ValueError(f"layers[{index}]: window {layer['window']} must be a positive number of positions, or null")
            for name in ("attn", "mlp"):
                if set(layer[name]) != SUBLAYER_KEYS:
                    raise ValueError(f"layers[{index}].{name} has keys {sorted(layer[name])}; expected {sorted(SUBLAYER_KEYS)}")


# the fields above, for transformers 4.x's __init__
FIELDS = [name for name in BlockforgeLlamaConfig.__annotations__ if not name.startswith("_")]

__all__ = ["BlockforgeLlamaConfig"]
