"""A blockforge llama in transformers, for `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

Every sub-layer (attention, then SwiGLU MLP) of every block computes

    h = out_norm( a * x  +  m * g * branch_norm( F( s * in_norm(x) ) ) )

with the filled slots, a, s, the per-channel layer scale g (when present) and the constant branch
multiplier m read from `config.layers` (empty slots are nn.Identity), so one Block class holds Pre-LN,
Post-LN, DeepNorm, Sandwich, Mix-LN, HybridNorm and CompleteP stacks. Each layer has its own norm type
(RMSNorm, LayerNorm or DyT), heads, key/value heads (grouped-query attention), head size, sliding
window, per-head q/k/v norms (applied before RoPE), biases and ffn width. Parameter names are
blockforge's own (embed, layers.N.attn.in_norm, layers.N.attn.branch.qkv, layers.N.attn.layer_scale,
..., final_norm, head), so the weights load without renaming. RoPE rotates adjacent pairs (2j, 2j+1)
of each head, as blockforge does, optionally with Llama-3's frequency scaling. This file imports only
torch and transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_blockforge import BlockforgeLlamaConfig

Rope = dict[tuple[int, float, float], tuple[torch.Tensor, torch.Tensor]]  # (head size, theta, linear factor) -> (cos, sin), each (B, 1, T, hs / 2)
Masks = dict[int | None, torch.Tensor | None]  # sliding window (None: global) -> the keys each new position sees


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), computed in at least float32 (offset 1: Gemma's 1 + w)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        gain = self.weight.to(wide.dtype)
        if self.offset != 0.0:
            gain = gain + self.offset
        return F.rms_norm(wide, (x.shape[-1],), weight=gain, eps=self.eps).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__(dim, eps=eps)


class DyT(nn.Module):
    """Dynamic Tanh: weight * tanh(alpha * x) + bias, alpha a learned scalar (it has no eps)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), 0.5))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


NORMS = {"rmsnorm": RMSNorm, "layernorm": LayerNorm, "dyt": DyT}


def rope_frequencies(size: int, theta: float, scaling: dict | None, device: torch.device) -> torch.Tensor:
    """w_j = theta^(-2j/size), j < size/2; with Llama-3 scaling, wavelengths longer than original_context /
    low_freq_factor are divided by `factor`, shorter than original_context / high_freq_factor kept, and
    those between blended linearly in original_context / wavelength."""
    freq = 1.0 / (theta ** (torch.arange(0, size, 2, device=device, dtype=torch.int64).float() / size))
    if scaling is None:
        return freq
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    keep = ((scaling["original_context"] * freq / (2 * torch.pi) - low) / (high - low)).clamp(0.0, 1.0)  # 0: stretch, 1: keep
    return freq / scaling["factor"] * (1.0 - keep) + freq * keep


def rope_tables(keys: set[tuple[int, float, float]], positions: torch.Tensor, scaling: dict | None) -> Rope:
    """For each (head size, theta, linear factor): cos and sin of p * w_j / factor for every position p of `positions`
    (B, T), in float32."""
    tables = {}
    for size, theta, factor in keys:
        angles = positions.float()[..., None] * (rope_frequencies(size, theta, scaling, positions.device) / factor)  # (B, T, size/2)
        tables[(size, theta, factor)] = (angles.cos()[:, None], angles.sin()[:, None])
    return tables


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x[2j], x[2j+1]) of x (B, nh, T, hs) by its angle."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    a, b = wide.unflatten(-1, (-1, 2)).unbind(-1)  # each (B, nh, T, hs/2)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


def default_positions(padding: torch.Tensor | None, past: int, length: int, device: torch.device) -> torch.Tensor:
    """Positions of the new tokens (B or 1, length): counted over real tokens only when `padding` marks some."""
    if padding is None:
        return torch.arange(past, past + length, device=device)[None]
    return (padding.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]


def visible_keys(padding: torch.Tensor | None, past: int, length: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Which keys each new position sees (B or 1, 1, length, past + length); None for plain causal attention.

    `padding` (B, past + length) marks real tokens with 1. A key is seen when it is not after the query
    and, with a sliding `window`, among the last `window` real tokens up to the query (itself included),
    so a padded row sees what its unpadded self sees. A padded position still sees itself, so no row of
    the softmax is empty; its output is never used.
    """
    if padding is not None and bool(padding.all()):
        padding = None
    if padding is None and past == 0 and window is None:
        return None
    if padding is not None and padding.shape[-1] != past + length:
        raise ValueError(f"attention_mask covers {padding.shape[-1]} positions, but the cache and the input hold {past + length}")
    keys = torch.arange(past + length, device=device)
    queries = past + torch.arange(length, device=device)[:, None]
    allowed = (keys <= queries)[None]  # (1, length, past + length)
    if padding is None:
        if window is not None:
            allowed = allowed & (keys > queries - window)
        return allowed[:, None]
    real = padding.bool()
    if window is not None:
        count = padding.long().cumsum(-1)  # (B, past + length): real tokens up to and including each key
        allowed = allowed & (count[:, -length:, None] - count[:, None, :] < window)
    return ((allowed & real[:, None, :]) | (keys == queries))[:, None]


class Attention(nn.Module):
    """Rows of qkv: heads * head_dim query rows, then kv_heads * head_dim key rows, then as many value rows."""

    def __init__(self, width: int, layer: dict, eps: float, layer_index: int, rope_theta: float, offset: float = 0.0):
        super().__init__()
        self.heads, self.kv_heads, self.head_size = layer["heads"], layer["kv_heads"], layer["head_dim"]
        self.window = layer["window"]  # a causal sliding window of this many positions; None: global
        self.scale = layer.get("attention_scale")  # the scores' scale; None: 1/sqrt(head_dim)
        theta = layer.get("rope_theta") or rope_theta
        # (head size, theta, linear factor: positions divided by it); None: no RoPE here (NoPE)
        self.rope_key = (self.head_size, theta, layer.get("rope_linear_factor") or 1.0) if layer.get("rope", True) else None
        self.qk_norm_over = layer.get("qk_norm_over", "head")  # per head, or over the whole projection (OLMo 2)
        self.attn_logit_softcap = layer.get("attn_logit_softcap")  # scores c * tanh(scores / c) (Gemma 2)
        self.layer_index = layer_index  # its place in the cache
        self.qkv = nn.Linear(width, (self.heads + 2 * self.kv_heads) * self.head_size, bias=layer["qkv_bias"])
        self.proj = nn.Linear(self.heads * self.head_size, width, bias=layer["proj_bias"])

        def head_norm(present: bool, size: int) -> nn.Module | None:
            return NORMS[layer["norm"]](size, eps, offset) if present else None

        whole = self.qk_norm_over == "projection"
        self.q_norm = head_norm(layer["qk_norm"], self.heads * self.head_size if whole else self.head_size)
        self.k_norm = head_norm(layer["qk_norm"], self.kv_heads * self.head_size if whole else self.head_size)
        self.v_norm = head_norm(layer["v_norm"], self.head_size)

    def forward(self, x: torch.Tensor, rope: Rope, masks: Masks, cache) -> torch.Tensor:
        B, T, _ = x.shape
        hs = self.head_size
        q, k, v = self.qkv(x).split([self.heads * hs, self.kv_heads * hs, self.kv_heads * hs], dim=-1)
        if self.q_norm is not None and self.qk_norm_over == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(B, T, self.heads, hs), k.view(B, T, self.kv_heads, hs), v.view(B, T, self.kv_heads, hs)
        if self.q_norm is not None and self.qk_norm_over == "head":  # per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads or kv_heads, T, hs)
        if self.rope_key is not None:
            cos, sin = rope[self.rope_key]
            q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_index)  # (B, kv_heads, past + T, hs): every key kept, the mask picks
        mask = masks[self.window]
        scale = {"scale": self.scale} if self.scale is not None else {}
        if self.attn_logit_softcap is not None:  # no fused kernel caps scores: written out
            groups = self.heads // self.kv_heads
            keys, values = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = q @ keys.transpose(-2, -1) * (self.scale if self.scale is not None else hs ** -0.5)
            scores = torch.tanh(scores / self.attn_logit_softcap) * self.attn_logit_softcap
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            elif T > 1:
                scores = scores.masked_fill(~torch.ones(T, keys.shape[2], dtype=torch.bool, device=q.device).tril(keys.shape[2] - T), float("-inf"))
            y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                               enable_gqa=self.kv_heads != self.heads, **scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, self.heads * hs))


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)), act SiLU unless the layer says otherwise (gelu_tanh: GeGLU)."""

    def __init__(self, width: int, hidden: int, bias: bool, act: str = "silu"):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=bias)  # rows: gate, then up
        self.down = nn.Linear(hidden, width, bias=bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


class Residual(nn.Module):
    def __init__(self, branch: nn.Module, sublayer: dict, norm: str, config: BlockforgeLlamaConfig):
        super().__init__()

        def slot(name: str) -> nn.Module:
            return NORMS[norm](config.hidden_size, config.norm_eps, config.norm_weight_offset) if sublayer[name] else nn.Identity()

        self.in_norm = slot("in_norm")
        self.branch = branch
        self.branch_norm = slot("branch_norm")
        self.out_norm = slot("out_norm")
        self.residual_scale = float(sublayer["residual_scale"])  # a
        self.input_scale = float(sublayer["input_scale"])  # s
        self.layer_scale = nn.Parameter(torch.ones(config.hidden_size)) if sublayer["layer_scale"] else None  # g
        self.branch_multiplier = float(sublayer["branch_multiplier"])  # m

    def forward(self, x: torch.Tensor, **branch_kwargs) -> torch.Tensor:
        h = self.in_norm(x)
        if self.input_scale != 1.0:
            h = h * self.input_scale
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        out = self.branch_norm(self.branch(h, **branch_kwargs))
        if self.layer_scale is not None:
            out = out * self.layer_scale
        if self.branch_multiplier != 1.0:
            out = out * self.branch_multiplier
        return self.out_norm(x + out)

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:.4g}, input_scale={self.input_scale:.4g}, branch_multiplier={self.branch_multiplier:.4g}"


class Block(GradientCheckpointingLayer):
    """One layer; with `model.gradient_checkpointing_enable()` its activations are recomputed in the backward pass."""

    def __init__(self, config: BlockforgeLlamaConfig, index: int):
        super().__init__()
        layer = config.layers[index]
        attention = Attention(config.hidden_size, layer, config.norm_eps, index, config.rope_theta, config.norm_weight_offset)
        self.attn = Residual(attention, layer["attn"], layer["norm"], config)
        mlp = SwiGLU(config.hidden_size, layer["ffn"], layer["mlp_bias"], layer.get("mlp_act") or "silu")
        self.mlp = Residual(mlp, layer["mlp"], layer["norm"], config)

    def forward(self, x: torch.Tensor, rope: Rope, masks: Masks, cache) -> torch.Tensor:
        x = self.attn(x, rope=rope, masks=masks, cache=cache)
        return self.mlp(x)


class BlockforgeForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = BlockforgeLlamaConfig
    base_model_prefix = "blockforge"  # no base-model submodule: the blocks sit at the top, under blockforge's names
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True
    _tied_weights_keys = {"head.weight": "embed.weight"}  # applies when config.tie_word_embeddings

    def __init__(self, config: BlockforgeLlamaConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, index) for index in range(len(config.layers)))
        self.final_norm = NORMS[config.norm](config.hidden_size, config.norm_eps, config.norm_weight_offset) if config.final_norm else nn.Identity()
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope_keys = {block.attn.branch.rope_key for block in self.layers} - {None}
        self.windows = {layer["window"] for layer in config.layers}
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        past_key_values=None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits (B, T, vocab) of the next token at every position (the last `logits_to_keep` if set).

        `cache` (a transformers Cache, e.g. DynamicCache; `past_key_values` is its former name) holds the
        keys and values of earlier positions. `hidden_states`, when asked for, are the input of every block
        and the output of the last one (before the final norm).
        """
        cache = self._one_cache(cache, past_key_values)
        self._refuse_unsupported(input_ids, inputs_embeds, output_attentions, kwargs)
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        if self.config.embed_scale != 1.0:  # Gemma's sqrt(width), Granite's embedding multiplier (inputs_embeds too: as the lookup)
            x = x * self.config.embed_scale
        length = x.shape[1]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.training and self.is_gradient_checkpointing:
            use_cache = False  # the recomputed blocks would extend a cache twice; training needs none
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = default_positions(attention_mask, past, length, x.device)
        rope = rope_tables(self.rope_keys, position_ids, self.config.rope_frequency_scaling)
        masks = {window: visible_keys(attention_mask, past, length, window, x.device) for window in self.windows}
        states = [x] if output_hidden_states else None
        for block in self.layers:
            x = block(x, rope, masks, cache=cache)  # by keyword: checkpointing drops the cache while training
            if states is not None:
                states.append(x)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.head(self.final_norm(x[:, keep]))
        if self.config.readout_multiplier != 1.0:  # muP's 1/m, times a logit multiplier (Granite)
            logits = logits * self.config.readout_multiplier
        if self.config.logit_softcap is not None:  # Gemma 2
            logits = torch.tanh(logits / self.config.logit_softcap) * self.config.logit_softcap
        loss = None
        if labels is not None:
            extra = {"num_items_in_batch": kwargs["num_items_in_batch"]} if "num_items_in_batch" in kwargs else {}
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        output = CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=cache, hidden_states=tuple(states) if states is not None else None
        )
        return output if return_dict is not False else output.to_tuple()

    @staticmethod
    def _one_cache(cache, past_key_values):
        if past_key_values is not None and cache is not None:
            raise ValueError("give the cache as `cache` or as `past_key_values` (its former name), not both")
        return cache if cache is not None else past_key_values

    @staticmethod
    def _refuse_unsupported(input_ids, inputs_embeds, output_attentions, kwargs: dict) -> None:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if output_attentions:
            raise ValueError("this model does not return attention weights (output_attentions=True)")
        unknown = sorted(key for key, value in kwargs.items() if value is not None and key != "num_items_in_batch")
        if unknown:
            raise TypeError(f"forward() got arguments it does not use: {', '.join(unknown)}")


__all__ = ["BlockforgeForCausalLM"]
