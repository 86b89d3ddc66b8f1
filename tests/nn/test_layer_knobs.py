"""Each per-layer knob computes what it says: one block by hand (not through the Block code), and gradcheck in float64.

Knobs: grouped-query attention (kv_heads), head_dim of its own, sliding window, norm type (LayerNorm,
DyT), q/k and v norms (per head or over the whole projection), layer scale, different placements for the
two sub-layers, biases, Llama-3 RoPE scaling, a RoPE base per layer, no RoPE (NoPE), a query scale, the
MLP's activation, RMSNorm gains as (1 + w), a residual multiplier, linear RoPE scaling per layer.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import blockforge
from blockforge.nn.attention import rope_frequencies, rope_tables
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings, RopeScaling, SubLayerPlacements

WIDTH, FFN, DEPTH = 16, 24, 3
T = 6


def build(settings: dict, dtype=torch.float64, **model):
    spec = ModelSpec(family="llama", width=WIDTH, depth=DEPTH, heads=4, ffn=FFN, vocab=11, context=16,
                     layers=LayerRules(default=LayerSettings(**settings)), **model)
    net = blockforge.build_model(spec, seed=0).to(dtype)
    with torch.no_grad():  # everything away from its init, so a missing or swapped piece shows
        for name, p in net.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if "norm" in name or "scale" in name or "alpha" in name else 0.05))
    return net


def norm_by_hand(module, x):
    name = type(module).__name__
    if name == "RMSNorm":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * (module.offset + module.weight)
    if name == "LayerNorm":
        return F.layer_norm(x, x.shape[-1:], eps=module.eps) * module.weight + module.bias
    assert name == "DyT"
    return torch.tanh(module.alpha * x) * module.weight + module.bias


def rotate(x, table):
    """x (B, T, h, hs): each adjacent pair (2j, 2j+1) rotated by its angle; table (T, hs/2, 2) of cos, sin."""
    cos, sin = table[..., 0][:, None], table[..., 1][:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def attention_by_hand(attn, x, rope):
    B, T, _ = x.shape
    h, kv, hd = attn.heads, attn.kv_heads, attn.head_dim
    out = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = out[..., : h * hd], out[..., h * hd : (h + kv) * hd], out[..., (h + kv) * hd :]
    if attn.q_norm is not None and attn.qk_norm_over == "projection":  # OLMo 2: over all heads at once
        q, k = norm_by_hand(attn.q_norm, q), norm_by_hand(attn.k_norm, k)
    q, k, v = q.view(B, T, h, hd), k.view(B, T, kv, hd), v.view(B, T, kv, hd)
    if attn.q_norm is not None and attn.qk_norm_over == "head":
        q, k = norm_by_hand(attn.q_norm, q), norm_by_hand(attn.k_norm, k)
    if attn.v_norm is not None:
        v = norm_by_hand(attn.v_norm, v)
    if attn.rope_key is not None:  # else NoPE
        q, k = rotate(q, rope[attn.rope_key]), rotate(k, rope[attn.rope_key])
    scale = attn.scale if attn.scale is not None else 1 / math.sqrt(hd)
    heads = []
    for head in range(h):
        group = head // (h // kv)  # query head -> the key/value head it shares
        scores = q[:, :, head] @ k[:, :, group].transpose(-1, -2) * scale  # (B, T, T)
        if attn.attn_logit_softcap is not None:
            scores = attn.attn_logit_softcap * torch.tanh(scores / attn.attn_logit_softcap)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = (j <= i) & ((j > i - attn.window) if attn.window is not None else True)
        heads.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, :, group])
    y = torch.cat(heads, dim=-1)  # (B, T, h * hd)
    return y @ attn.proj.weight.T + (attn.proj.bias if attn.proj.bias is not None else 0)


ACTIVATIONS = {"silu": lambda t: t * torch.sigmoid(t),
               "gelu_tanh": lambda t: 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3))),
               "gelu": lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))}


def mlp_by_hand(mlp, x):
    gate, up = (x @ mlp.gate_up.weight.T).split(FFN, -1)
    return (ACTIVATIONS[mlp.mlp_act](gate) * up) @ mlp.down.weight.T


def sublayer_by_hand(residual, placement, f, x):
    """The placements these tests use, written out: pre, post, none."""
    scale = (residual.layer_scale if residual.layer_scale is not None else 1.0) * residual.branch_multiplier
    if placement == "pre":
        return x + scale * f(norm_by_hand(residual.in_norm, x))
    if placement == "post":
        return norm_by_hand(residual.out_norm, x + scale * f(x))
    assert placement == "none"
    return x + scale * f(x)


KNOBS = {
    "grouped-query (4 heads, 2 kv heads)": ({"kv_heads": 2}, {}),
    "multi-query (1 kv head)": ({"kv_heads": 1}, {}),
    "head_dim 6 with 4 heads (24 != width 16)": ({"head_dim": 6}, {}),
    "sliding window of 3": ({"window": 3}, {}),
    "window 1 (only itself)": ({"window": 1}, {}),
    "layernorm": ({"norm": "layernorm"}, {}),
    "dyt": ({"norm": "dyt"}, {}),
    "qk_norm": ({"qk_norm": True}, {}),
    "qk and v norm": ({"qk_norm": True, "v_norm": True, "norm": "layernorm"}, {}),
    "layer scale": ({"layer_scale": 0.1}, {}),
    "none attention, post MLP": ({"placement": SubLayerPlacements(attn="none", mlp="post")}, {}),
    "post attention, pre MLP, GQA, window": ({"placement": SubLayerPlacements(attn="post", mlp="pre"), "kv_heads": 2, "window": 2}, {}),
    "all biases": ({}, {"qkv_bias": True, "proj_bias": True}),
    "llama3 rope scaling": ({}, {"rope_scaling": RopeScaling(type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=2.0, original_context=8)}),
    "rope base of its own": ({"rope_theta": 37.0}, {}),
    "linear rope scaling x4 with a base of its own": ({"rope_linear_factor": 4.0, "rope_theta": 37.0}, {}),
    "no rope (NoPE)": ({"rope": False}, {}),
    "query scale": ({"query_scale": 0.8}, {}),
    "query scale with muP's inverse scale": ({"query_scale": 0.8}, {"parametrization": "mup", "base_width": 4, "attention_scale": "inverse"}),
    "q/k norm over the whole projection, GQA": ({"qk_norm": True, "qk_norm_over": "projection", "kv_heads": 2}, {}),
    "gelu_tanh gate (GeGLU)": ({"mlp_act": "gelu_tanh"}, {}),
    "exact gelu gate": ({"mlp_act": "gelu"}, {}),
    "RMSNorm gains as 1 + w, q/k norms too": ({"qk_norm": True}, {"norm_weight_offset": 1.0}),
    "residual multiplier": ({}, {"residual_multiplier": 0.22}),
    "attention-logit soft-cap, GQA, window": ({"attn_logit_softcap": 0.7, "kv_heads": 2, "window": 3}, {}),
}


def rope_of(model, length=T):
    keys = {block.attn.branch.rope_key for block in model.layers} - {None}
    return rope_tables(keys, length, torch.device("cpu"), model.spec.rope_scaling)


@pytest.mark.parametrize("name", list(KNOBS))
def test_block_matches_the_formula(name):
    settings, model_fields = KNOBS[name]
    model = build(settings, **model_fields)
    block, layer = model.layers[1], model.spec.layers[1]
    x = torch.randn(2, T, WIDTH, dtype=torch.float64)
    rope = rope_of(model)
    with torch.no_grad():
        got = block(x, rope=rope)
        attn_placement, mlp_placement = layer.placements
        h = sublayer_by_hand(block.attn, attn_placement, lambda t: attention_by_hand(block.attn.branch, t, rope), x)
        expected = sublayer_by_hand(block.mlp, mlp_placement, lambda t: mlp_by_hand(block.mlp.branch, t), h)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name", list(KNOBS))
def test_block_gradcheck_float64(name):
    settings, model_fields = KNOBS[name]
    model = build(settings, **model_fields)
    block = model.layers[1]
    rope = rope_of(model, 4)
    x = torch.randn(1, 4, WIDTH, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: block(t, rope=rope), (x,), eps=1e-6, atol=1e-5)


def test_parameter_counts_follow_the_knobs():
    def count(settings, **model):
        return sum(p.numel() for p in blockforge.build_model(ModelSpec(
            family="llama", width=WIDTH, depth=1, heads=4, ffn=FFN, vocab=11, context=16,
            layers=LayerRules(default=LayerSettings(**settings)), **model), device="meta").layers[0].parameters())
    base = count({})
    hd = WIDTH // 4
    assert count({"kv_heads": 2}) == base - 2 * 2 * hd * WIDTH  # k and v lose two heads each
    assert count({"head_dim": 6}) == base + (3 * 4 * (6 - hd)) * WIDTH + 4 * (6 - hd) * WIDTH
    assert count({"qk_norm": True}) == base + 2 * hd
    assert count({"layer_scale": 1.0}) == base + 2 * WIDTH
    assert count({"norm": "dyt"}) == base + 2 * (WIDTH + 1)  # two norms: weight + bias + alpha, instead of a weight
    assert count({"window": 2}) == base  # a window costs no parameter


def test_llama3_rope_scaling_stretches_long_wavelengths_only():
    plain = rope_frequencies(64, 500000.0)
    scaled = rope_frequencies(64, 500000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192})
    wavelength = 2 * math.pi / plain
    long, short = wavelength > 8192, wavelength < 8192 / 4
    assert torch.allclose(scaled[short], plain[short]) and torch.allclose(scaled[long], plain[long] / 8)
    middle = ~long & ~short
    assert middle.any() and ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()


def test_linear_rope_scaling_rotates_position_t_as_plain_rope_rotates_t_over_the_factor():
    """Linear scaling (Gemma 3's global layers): angles t * theta^(-2j/d) / factor, by hand."""
    d, theta, factor, length = 8, 37.0, 4.0, 9
    table = rope_tables({(d, theta, factor)}, length, torch.device("cpu"))[(d, theta, factor)]
    t = torch.arange(length, dtype=torch.float64)[:, None]
    angles = t / factor * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(table[..., 0].double(), angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(table[..., 1].double(), angles.sin(), atol=1e-6, rtol=0)
    plain = rope_tables({(d, theta, 1.0)}, 4 * length, torch.device("cpu"))[(d, theta, 1.0)]
    torch.testing.assert_close(table[0::4], plain[: len(table[0::4])])  # position 4k, scaled, is position k unscaled


def test_a_window_changes_attention_only_beyond_its_reach():
    """With window w, outputs at positions < w equal global attention's; later ones differ."""
    torch.manual_seed(0)
    plain, windowed = build({}), build({"window": 3})
    windowed.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 11, (1, 8))
    with torch.no_grad():
        a, b = plain(tokens), windowed(tokens)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert (a[:, 3:] - b[:, 3:]).abs().max() > 1e-6


def test_the_new_knobs_reach_the_modules_with_the_values_they_name():
    attn = build({"query_scale": 0.8, "rope_theta": 37.0}).layers[0].attn.branch
    assert attn.scale == 0.8 and attn.rope_key == (WIDTH // 4, 37.0, 1.0)
    assert build({"rope_linear_factor": 8.0}).layers[0].attn.branch.rope_key == (WIDTH // 4, 10000.0, 8.0)
    assert build({"rope": False}).layers[0].attn.branch.rope_key is None
    mup = build({"query_scale": 0.8}, parametrization="mup", base_width=4, attention_scale="inverse").layers[0].attn.branch
    assert mup.scale == pytest.approx(0.8 * 4 ** -0.5)  # width 16 over base 4: muP's factor m^-1/2 on top of the query scale
    assert build({}).layers[0].attn.branch.scale is None  # SDPA's own 1/sqrt(head_dim)
    gemma = build({}, norm_weight_offset=1.0)
    assert all(float(n.weight.detach().abs().max()) < 1 for n in (gemma.final_norm, gemma.layers[0].attn.in_norm))  # stored as w, gain 1 + w
    fresh = blockforge.build_model(gemma.spec, seed=0)
    assert torch.equal(fresh.final_norm.weight, torch.zeros(WIDTH))  # at initialisation the gain 1 + w is 1


def test_embedding_scale_logit_multiplier_and_soft_cap_by_hand():
    model = build({}, embed_scale=4.0, logit_multiplier=0.5, logit_softcap=3.0)
    plain = build({})
    plain.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 11, (2, T))
    with torch.no_grad():
        x, kwargs = plain.embed_inputs(tokens)
        x = x * 4.0
        for block in plain.layers:
            x = block(x, **kwargs)
        expected = 3.0 * torch.tanh(plain.head(plain.final_norm(x)) * 0.5 / 3.0)
        torch.testing.assert_close(model(tokens), expected, atol=1e-12, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda t: model.head_outputs(t), (torch.randn(1, 3, WIDTH, dtype=torch.float64, requires_grad=True),),
                                    eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("field,value,needle", [
    ("rope_theta", 0.0, "rope_theta: must be greater than zero"), ("query_scale", -1.0, "query_scale: must be greater than zero"),
    ("mlp_act", "relu", "unknown value 'relu'"), ("qk_norm_over", "everything", "unknown value 'everything'"),
    ("rope", "yes", "must be true or false"), ("rope_linear_factor", 0.0, "rope_linear_factor: must be greater than zero"),
])
def test_a_bad_new_knob_is_refused_by_key_path(field, value, needle):
    from blockforge.errors import SpecError
    from blockforge.spec.recipe import recipe_from_data

    data = {"model": {"family": "llama", "width": WIDTH, "depth": 2, "heads": 4, "ffn": FFN, "vocab": 11, "context": 16,
                      "layers": {"overrides": [{"at": 1, field: value}]}}, "train": {}, "data": {"source": "builtin"}}
    with pytest.raises(SpecError, match=f"model.layers.overrides\\[0\\].{field}: .*{needle.split(': ', 1)[-1]}"):
        recipe_from_data(data)


@pytest.mark.parametrize("key,value,needle", [("embed_scale", 0.0, "must be greater than zero"), ("logit_softcap", -1.0, "must be greater than zero"),
                                              ("residual_multiplier", 0.0, "must be greater than zero"), ("logit_multiplier", -2.0, "must be greater than zero"),
                                              ("norm_weight_offset", 1.0, "offsets RMSNorm gains only")])
def test_bad_model_level_multipliers_are_refused(key, value, needle):
    from blockforge.errors import SpecError
    from blockforge.spec.recipe import recipe_from_data

    model = {"family": "llama", "width": WIDTH, "depth": 2, "heads": 4, "ffn": FFN, "vocab": 11, "context": 16, key: value}
    if key == "norm_weight_offset":
        model["norm"] = "layernorm"
    with pytest.raises(SpecError, match=f"model.{key}: {needle}"):
        recipe_from_data({"model": model, "train": {}, "data": {"source": "builtin"}})
