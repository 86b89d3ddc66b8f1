"""A blockforge llama in transformers, for `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

Every sub-layer (attention, then SwiGLU MLP) of every block computes

    h = out_norm( a * x  +  m * g * branch_norm( F( s * in_norm(x) ) ) )

with the filled slots, a, s, the per-channel layer scale g (when present) and the constant branch
multiplier m read from `config.layers` (empty slots are nn.Identity), so one Block class holds Pre-LN,
Post-LN, DeepNorm, Sandwich, Mix-LN, HybridNorm and CompleteP stacks. Each layer has its own norm type
(RMSNorm, LayerNorm or DyT), heads, key/value heads (grouped-query attention), head size, sliding
window, per-head q/k/v norms (applied before RoPE), biases and ffn width. Parameter names are
blockforge's own (embed, layers.N.attn.in_norm, layers.N.attn.branch.qkv, layers.N.attn.layer_scale,
..., final_norm, head), so the weights load without renaming and an adapter trained on blockforge's
model applies here. RoPE rotates adjacent pairs (2j, 2j+1) of each head, as blockforge does, optionally
with Llama-3's frequency scaling. This file imports only torch and transformers.

Attention goes through transformers' attention interface (`attn_implementation` "eager", "sdpa", and
"flash_attention_2" or "flex_attention" where installed), with transformers' masks and caches: the
configuration names each layer's type and window, so a DynamicCache keeps only the window of a
sliding layer and a StaticCache (`cache_implementation="static"`) is shaped per layer. Soft-capped
scores and `output_attentions=True` are computed by the eager function (SDPA returns no weights and
does not cap).

peft has no default target modules for a model type of its own; target the fused projections by
name: `LoraConfig(target_modules=["qkv", "proj", "gate_up", "down"])`.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_blockforge import BlockforgeLlamaConfig

# What this transformers release calls a model output's cache, and create_causal_mask's parameters (they changed
# between 4.57 and 5.x).
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
MASK_PARAMETERS = set(inspect.signature(create_causal_mask).parameters)
Rope = dict[tuple[int, float, float], tuple[torch.Tensor, torch.Tensor]]  # (head size, theta, linear factor) -> (cos, sin), each (B, 1, T, hs / 2)
Masks = dict[int | None, object]  # sliding window (None: global) -> the mask transformers built for it (a tensor, a BlockMask or None)


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), computed in at least float32 (offset 1: Gemma's 1 + w)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset != 0.0:  # written out, so a serving engine that swaps in its own RMSNorm sees the offset
            return (normed * (self.offset + self.weight.to(wide.dtype))).to(x.dtype)
        return (normed * self.weight.to(wide.dtype)).to(x.dtype)


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
    """Positions of the new tokens (B or 1, length): counted over real tokens only when a 2-D `padding` marks some."""
    if padding is None or padding.dim() != 2:
        return torch.arange(past, past + length, device=device)[None]
    return (padding.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]


def eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, scaling: float,
                    dropout: float = 0.0, softcap: float | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention written out: (B, T, heads, hs) and the weights (B, heads, T, S). Takes the masks transformers builds for
    eager (additive) and for sdpa (boolean, or None where SDPA's own causal flag stands in: one query sees every key,
    several see the keys up to their own index), and soft-caps scores c * tanh(s / c) when `softcap` is set."""
    groups = module.num_key_value_groups
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = (query @ key.transpose(-2, -1)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None:
        if query.shape[2] > 1:
            allowed = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
            scores = scores.masked_fill(~allowed, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    else:
        scores = scores + attention_mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return (weights @ value).transpose(1, 2).contiguous(), weights


class Attention(nn.Module):
    """Rows of qkv: heads * head_dim query rows, then kv_heads * head_dim key rows, then as many value rows."""

    is_causal = True

    def __init__(self, config: BlockforgeLlamaConfig, layer: dict, layer_index: int):
        super().__init__()
        width, eps, offset = config.hidden_size, config.norm_eps, config.norm_weight_offset
        self.config = config  # the attention interface reads its implementation from here
        self.heads, self.kv_heads, self.head_dim = layer["heads"], layer["kv_heads"], layer["head_dim"]
        self.num_key_value_groups = self.heads // self.kv_heads
        self.sliding_window = layer["window"]  # a causal sliding window of this many positions; None: global
        scale = layer.get("attention_scale")  # the scores' scale; None: 1/sqrt(head_dim)
        self.scaling = scale if scale is not None else self.head_dim ** -0.5
        theta = layer.get("rope_theta") or config.rope_theta
        # (head size, theta, linear factor: positions divided by it); None: no RoPE here (NoPE)
        self.rope_key = (self.head_dim, theta, layer.get("rope_linear_factor") or 1.0) if layer.get("rope", True) else None
        self.qk_norm_over = layer.get("qk_norm_over", "head")  # per head, or over the whole projection (OLMo 2)
        self.softcap = layer.get("attn_logit_softcap")  # scores c * tanh(scores / c) (Gemma 2)
        self.layer_idx = layer_index  # its place in the cache
        self.qkv = nn.Linear(width, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=layer["qkv_bias"])
        self.proj = nn.Linear(self.heads * self.head_dim, width, bias=layer["proj_bias"])

        def head_norm(present: bool, size: int) -> nn.Module | None:
            return NORMS[layer["norm"]](size, eps, offset) if present else None

        whole = self.qk_norm_over == "projection"
        self.q_norm = head_norm(layer["qk_norm"], self.heads * self.head_dim if whole else self.head_dim)
        self.k_norm = head_norm(layer["qk_norm"], self.kv_heads * self.head_dim if whole else self.head_dim)
        self.v_norm = head_norm(layer["v_norm"], self.head_dim)

    def forward(self, x: torch.Tensor, rope: Rope, masks: Masks, cache, output_attentions: bool = False, **kwargs):
        B, T, _ = x.shape
        hs = self.head_dim
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
            k, v = cache.update(k, v, self.layer_idx)  # a sliding layer's cache returns its window and this input
        implementation = self.config._attn_implementation or "eager"
        if output_attentions or (self.softcap is not None and implementation == "sdpa"):
            if implementation not in ("eager", "sdpa"):
                raise ValueError(f"output_attentions needs attn_implementation 'eager' or 'sdpa', not '{implementation}'")
            implementation = "eager"  # weights to return, or scores to cap: written out
        # One plain assignment from the interface and one call: what vLLM's Transformers backend looks for in this source.
        attention_interface = eager_attention
        if implementation != "eager":
            attention_interface = ALL_ATTENTION_FUNCTIONS[implementation]
        extra = {"softcap": self.softcap} if self.softcap is not None else {}
        y, weights = attention_interface(self, q, k, v, masks.get(self.sliding_window), dropout=0.0, scaling=self.scaling,
                                         sliding_window=self.sliding_window, **extra, **kwargs)
        return self.proj(y.reshape(B, T, self.heads * hs)), weights


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

    def forward(self, x: torch.Tensor, **branch_kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sub-layer's output, and the branch's attention weights (None for the MLP, or when not asked for)."""
        h = self.in_norm(x)
        if self.input_scale != 1.0:
            h = h * self.input_scale
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        out = self.branch(h, **branch_kwargs)
        out, weights = out if isinstance(out, tuple) else (out, None)
        out = self.branch_norm(out)
        if self.layer_scale is not None:
            out = out * self.layer_scale
        if self.branch_multiplier != 1.0:
            out = out * self.branch_multiplier
        return self.out_norm(x + out), weights

    def extra_repr(self) -> str:
        return f"residual_scale={self.residual_scale:.4g}, input_scale={self.input_scale:.4g}, branch_multiplier={self.branch_multiplier:.4g}"


class Block(GradientCheckpointingLayer):
    """One layer; with `model.gradient_checkpointing_enable()` its activations are recomputed in the backward pass."""

    def __init__(self, config: BlockforgeLlamaConfig, index: int):
        super().__init__()
        layer = config.layers[index]
        self.attn = Residual(Attention(config, layer, index), layer["attn"], layer["norm"], config)
        mlp = SwiGLU(config.hidden_size, layer["ffn"], layer["mlp_bias"], layer.get("mlp_act") or "silu")
        self.mlp = Residual(mlp, layer["mlp"], layer["norm"], config)

    def forward(self, x: torch.Tensor, rope: Rope, masks: Masks, cache=None, output_attentions: bool = False,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, weights = self.attn(x, rope=rope, masks=masks, cache=cache, output_attentions=output_attentions, **kwargs)
        return self.mlp(x)[0], weights


class BlockforgePreTrainedModel(PreTrainedModel):
    config_class = BlockforgeLlamaConfig
    base_model_prefix = "blockforge"  # no base-model submodule: the blocks sit at the top, under blockforge's names
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True


class BlockforgeModel(BlockforgePreTrainedModel):
    """The layer stack without the head (`AutoModel`): hidden states after the final norm. vLLM's Transformers backend
    builds this class and puts its own head on top."""

    def __init__(self, config: BlockforgeLlamaConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, index) for index in range(len(config.layers)))
        self.final_norm = NORMS[config.norm](config.hidden_size, config.norm_eps, config.norm_weight_offset) if config.final_norm else nn.Identity()
        self.rope_keys = {block.attn.branch.rope_key for block in self.layers} - {None}
        # one layer of each window (None: global): the cache layer transformers sizes that window's mask by
        self.window_layers = {}
        for index, layer in enumerate(config.layers):
            self.window_layers.setdefault(layer["window"], index)
        if type(self) is BlockforgeModel:
            self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def _masks(self, x: torch.Tensor, attention_mask, cache, position_ids: torch.Tensor) -> Masks:
        """Each window's mask, built by transformers for the configured attention implementation (or given: a dict
        that `create_masks_for_generate` built, as generation with a static cache does)."""
        if isinstance(attention_mask, dict):
            return attention_mask
        masks = {}
        for window, index in self.window_layers.items():
            layer_config = self.config.per_layer_config[index] if getattr(self.config, "is_heterogeneous", False) else self.config
            build = create_causal_mask if window is None else create_sliding_window_causal_mask
            masks[window] = build(**_mask_arguments(layer_config, x, attention_mask, cache, position_ids, index))
        return masks

    def create_masks_for_generate(self, config, inputs_embeds: torch.Tensor, attention_mask, cache=None, position_ids=None, **kwargs) -> Masks:
        """The masks `generate` builds once per step for a static cache: one per window, as forward builds them."""
        return self._masks(inputs_embeds, attention_mask, cache if cache is not None else kwargs.get("past_key_values"), position_ids)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        past_key_values=None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """Hidden states (B, T, C) after the final norm.

        `cache` (a transformers Cache, e.g. DynamicCache or StaticCache; `past_key_values` is its former name)
        holds the keys and values of earlier positions. `hidden_states`, when asked for, are the embeddings, the
        output of every block but the last, and the last one after the final norm (transformers' convention);
        `attentions` each layer's attention weights.
        """
        cache = _one_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        if self.config.embed_scale != 1.0:  # Gemma's sqrt(width), Granite's embedding multiplier (inputs_embeds too: as the lookup)
            x = x * self.config.embed_scale
        length = x.shape[1]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.training and self.is_gradient_checkpointing:
            use_cache = False  # the recomputed blocks would extend a cache twice; training needs none
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)  # sliding layers hold only their window
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = default_positions(attention_mask if isinstance(attention_mask, torch.Tensor) else None, past, length, x.device)
        rope = rope_tables(self.rope_keys, position_ids, self.config.rope_frequency_scaling)
        masks = self._masks(x, attention_mask, cache, position_ids)
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states)
        states, attentions = [x] if output_hidden_states else None, [] if output_attentions else None
        for block in self.layers:
            # by keyword: checkpointing drops the cache while training
            x, weights = block(x, rope, masks, cache=cache, output_attentions=output_attentions, **kwargs)
            if states is not None:
                states.append(x)
            if attentions is not None:
                attentions.append(weights)
        normed = self.final_norm(x)
        if states is not None:
            states[-1] = normed
        output = BaseModelOutputWithPast(last_hidden_state=normed, **{CACHE_FIELD: cache if use_cache else None},
                                         hidden_states=tuple(states) if states is not None else None,
                                         attentions=tuple(attentions) if attentions is not None else None)
        return output if return_dict is not False else output.to_tuple()


class BlockforgeForCausalLM(BlockforgeModel, GenerationMixin):
    """The layer stack and its head (`AutoModelForCausalLM`), under the same parameter names as blockforge's model
    (the head: `lm_head`)."""

    _tied_weights_keys = {"lm_head.weight": "embed.weight"}  # applies when config.tie_word_embeddings

    def __init__(self, config: BlockforgeLlamaConfig):
        super().__init__(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

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
        """Logits (B, T, vocab) of the next token at every position (the last `logits_to_keep` if set)."""
        num_items = kwargs.pop("num_items_in_batch", None)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                              inputs_embeds=inputs_embeds, use_cache=use_cache, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions, return_dict=True, past_key_values=past_key_values, **kwargs)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep])
        if self.config.readout_multiplier != 1.0:  # muP's 1/m, times a logit multiplier (Granite)
            logits = logits * self.config.readout_multiplier
        if self.config.logit_softcap is not None:  # Gemma 2
            logits = torch.tanh(logits / self.config.logit_softcap) * self.config.logit_softcap
        loss = None
        if labels is not None:
            extra = {"num_items_in_batch": num_items} if num_items is not None else {}
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **extra)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: getattr(out, CACHE_FIELD)},
                                        hidden_states=out.hidden_states, attentions=out.attentions)
        return output if return_dict is not False else output.to_tuple()


def _mask_arguments(config, x: torch.Tensor, attention_mask, cache, position_ids: torch.Tensor, index: int) -> dict:
    """create_causal_mask's arguments under the names this transformers release gives them (4.57: input_embeds,
    cache_position and past_key_values; later 5.x: inputs_embeds, layer_idx and cache)."""
    found = {"config": config, "attention_mask": attention_mask, "position_ids": position_ids}
    found["inputs_embeds" if "inputs_embeds" in MASK_PARAMETERS else "input_embeds"] = x
    found["cache" if "cache" in MASK_PARAMETERS else "past_key_values"] = cache
    if "layer_idx" in MASK_PARAMETERS:
        found["layer_idx"] = index
    if "cache_position" in MASK_PARAMETERS:
        past = cache.get_seq_length() if cache is not None else 0
        found["cache_position"] = torch.arange(past, past + x.shape[1], device=x.device)
    return found


def _one_cache(cache, past_key_values):
    if past_key_values is not None and cache is not None:
        raise ValueError("give the cache as `cache` or as `past_key_values` (its former name), not both")
    return cache if cache is not None else past_key_values


__all__ = ["BlockforgeModel", "BlockforgeForCausalLM"]
