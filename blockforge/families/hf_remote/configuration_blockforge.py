"""The configuration of a blockforge llama in transformers: its resolved spec, one entry per layer.

Nothing is inferred when the model is built: every layer lists its heads, ffn width and, for each of
its two sub-layers (attention, MLP), which norm slots are filled and the residual and input scales.
The model fields have no defaults, so config.json spells every one of them out.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

NORMS = ("rmsnorm", "layernorm")
SLOTS = ("in_norm", "branch_norm", "out_norm")
SUBLAYER_KEYS = {*SLOTS, "residual_scale", "input_scale"}
LAYER_KEYS = {"placement", "heads", "ffn", "attn", "mlp"}
REQUIRED = ("vocab_size", "hidden_size", "max_position_embeddings", "norm", "norm_eps", "final_norm", "rope_theta", "tie_word_embeddings")


class BlockforgeLlamaConfig(PreTrainedConfig):
    """layers[i].attn (and .mlp) computes  out_norm(residual_scale * x + branch_norm(F(input_scale * in_norm(x))))."""

    model_type = "blockforge_llama"

    vocab_size: int | None = None
    hidden_size: int | None = None
    max_position_embeddings: int | None = None  # the context the model was trained on
    norm: str | None = None  # rmsnorm | layernorm
    norm_eps: float | None = None
    final_norm: bool | None = None
    rope_theta: float | None = None  # interleaved RoPE: pairs (2j, 2j+1) of each head
    tie_word_embeddings: bool | None = None
    layers: list | None = None
    num_hidden_layers: int | None = None
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    blockforge_arch_hash: str | None = None

    def __post_init__(self, **kwargs):
        self.layers = [dict(layer) for layer in self.layers or []]
        if self.num_hidden_layers is not None and self.num_hidden_layers != len(self.layers):
            raise ValueError(f"num_hidden_layers is {self.num_hidden_layers} but {len(self.layers)} layers are listed")
        self.num_hidden_layers = len(self.layers)
        if self.layers:  # an empty configuration (the defaults transformers compares against) describes no model
            self._check()
        super().__post_init__(**kwargs)

    def _check(self) -> None:
        missing = [key for key in REQUIRED if getattr(self, key) is None]
        if missing:
            raise ValueError(f"the configuration lacks {', '.join(missing)}")
        if self.norm not in NORMS:
            raise ValueError(f"norm '{self.norm}' is not one of {', '.join(NORMS)}")
        for index, layer in enumerate(self.layers):
            if set(layer) != LAYER_KEYS:
                raise ValueError(f"layers[{index}] has keys {sorted(layer)}; expected {sorted(LAYER_KEYS)}")
            if self.hidden_size % layer["heads"] or (self.hidden_size // layer["heads"]) % 2:
                raise ValueError(f"layers[{index}]: {layer['heads']} heads do not give an even head size for width {self.hidden_size}")
            for name in ("attn", "mlp"):
                if set(layer[name]) != SUBLAYER_KEYS:
                    raise ValueError(f"layers[{index}].{name} has keys {sorted(layer[name])}; expected {sorted(SUBLAYER_KEYS)}")


__all__ = ["BlockforgeLlamaConfig"]
