"""A blockforge llama in transformers, for `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

Every sub-layer (attention, then SwiGLU MLP) of every block computes

    h = out_norm( a * x  +  branch_norm( F( s * in_norm(x) ) ) )

with the filled slots, a and s read from `config.layers` (empty slots are nn.Identity), so one Block
class holds Pre-LN, Post-LN, DeepNorm, Sandwich, Mix-LN stacks and per-layer heads and ffn widths.
Parameter names are blockforge's own (embed, layers.N.attn.in_norm, layers.N.attn.branch.qkv, ...,
final_norm, head), so the weights load without renaming. RoPE rotates adjacent pairs (2j, 2j+1) of
each head, as blockforge does. This file imports only torch and transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_blockforge import BlockforgeLlamaConfig

Rope = dict[int, tuple[torch.Tensor, torch.Tensor]]  # head size -> (cos, sin), each (B, 1, T, head size / 2)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        return F.rms_norm(wide, (x.shape[-1],), weight=self.weight.to(wide.dtype), eps=self.eps).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps=eps)


NORMS = {"rmsnorm": RMSNorm, "layernorm": LayerNorm}


def rope_tables(head_sizes: set[int], positions: torch.Tensor, theta: float) -> Rope:
    """cos and sin of p * theta^(-2j/size) for every position p of `positions` (B, T), in float32."""
    tables = {}
    for size in head_sizes:
        inv_freq = 1.0 / (theta ** (torch.arange(0, size, 2, device=positions.device, dtype=torch.int64).float() / size))
        angles = positions.float()[..., None] * inv_freq  # (B, T, size/2)
        tables[size] = (angles.cos()[:, None], angles.sin()[:, None])
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


def visible_keys(padding: torch.Tensor | None, past: int, length: int, device: torch.device) -> torch.Tensor | None:
    """Which keys each new position sees (B or 1, 1, length, past + length); None for plain causal attention.

    `padding` (B, past + length) marks real tokens with 1. A padded position still sees itself, so no
    row of the softmax is empty; its output is never used.
    """
    if padding is not None and bool(padding.all()):
        padding = None
    if padding is None and past == 0:
        return None
    if padding is not None and padding.shape[-1] != past + length:
        raise ValueError(f"attention_mask covers {padding.shape[-1]} positions, but the cache and the input hold {past + length}")
    keys = torch.arange(past + length, device=device)
    queries = past + torch.arange(length, device=device)[:, None]
    allowed = (keys <= queries)[None, None]  # (1, 1, length, past + length)
    if padding is not None:
        allowed = (allowed & padding[:, None, None, :].bool()) | (keys == queries)
    return allowed


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, layer_index: int):
        super().__init__()
        self.heads = heads
        self.head_size = width // heads
        self.layer_index = layer_index  # its place in the cache
        self.qkv = nn.Linear(width, 3 * width, bias=False)  # rows: q, then k, then v
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor, rope: Rope, mask: torch.Tensor | None, cache) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
        cos, sin = rope[self.head_size]
        q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_index)  # (B, nh, past + T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)  # rows: gate, then up
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Residual(nn.Module):
    def __init__(self, branch: nn.Module, sublayer: dict, config: BlockforgeLlamaConfig):
        super().__init__()

        def slot(name: str) -> nn.Module:
            return NORMS[config.norm](config.hidden_size, config.norm_eps) if sublayer[name] else nn.Identity()

        self.in_norm = slot("in_norm")
        self.branch = branch
        self.branch_norm = slot("branch_norm")
        self.out_norm = slot("out_norm")
        self.residual_scale = float(sublayer["residual_scale"])  # a
        self.input_scale = float(sublayer["input_scale"])  # s

    def forward(self, x: torch.Tensor, **branch_kwargs) -> torch.Tensor:
        h = self.in_norm(x)
        if self.input_scale != 1.0:
            h = h * self.input_scale
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        return self.out_norm(x + self.branch_norm(self.branch(h, **branch_kwargs)))

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:.4g}, input_scale={self.input_scale:.4g}"


class Block(nn.Module):
    def __init__(self, config: BlockforgeLlamaConfig, index: int):
        super().__init__()
        layer = config.layers[index]
        self.attn = Residual(Attention(config.hidden_size, layer["heads"], index), layer["attn"], config)
        self.mlp = Residual(SwiGLU(config.hidden_size, layer["ffn"]), layer["mlp"], config)

    def forward(self, x: torch.Tensor, rope: Rope, mask: torch.Tensor | None, cache) -> torch.Tensor:
        x = self.attn(x, rope=rope, mask=mask, cache=cache)
        return self.mlp(x)


class BlockforgeForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = BlockforgeLlamaConfig
    base_model_prefix = "blockforge"  # no base-model submodule: the blocks sit at the top, under blockforge's names
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"head.weight": "embed.weight"}  # applies when config.tie_word_embeddings

    def __init__(self, config: BlockforgeLlamaConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, index) for index in range(len(config.layers)))
        self.final_norm = NORMS[config.norm](config.hidden_size, config.norm_eps) if config.final_norm else nn.Identity()
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.head_sizes = {config.hidden_size // layer["heads"] for layer in config.layers}
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
        length = x.shape[1]
        if (self.config.use_cache if use_cache is None else use_cache) and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = default_positions(attention_mask, past, length, x.device)
        rope = rope_tables(self.head_sizes, position_ids, self.config.rope_theta)
        mask = visible_keys(attention_mask, past, length, x.device)
        states = [x] if output_hidden_states else None
        for block in self.layers:
            x = block(x, rope, mask, cache)
            if states is not None:
                states.append(x)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.head(self.final_norm(x[:, keep]))
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
