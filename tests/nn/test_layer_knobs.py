"""Each per-layer knob computes what it says: one block by hand (not through the Block code), and gradcheck in float64.

Knobs: grouped-query attention (kv_heads), head_dim of its own, sliding window, norm type (LayerNorm,
DyT), q/k and v norms, layer scale, different placements for the two sub-layers, biases, Llama-3 RoPE scaling.
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
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * module.weight
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
    q = out[..., : h * hd].view(B, T, h, hd)
    k = out[..., h * hd : (h + kv) * hd].view(B, T, kv, hd)
    v = out[..., (h + kv) * hd :].view(B, T, kv, hd)
    if attn.q_norm is not None:
        q, k = norm_by_hand(attn.q_norm, q), norm_by_hand(attn.k_norm, k)
    if attn.v_norm is not None:
        v = norm_by_hand(attn.v_norm, v)
    q, k = rotate(q, rope[hd]), rotate(k, rope[hd])
    heads = []
    for head in range(h):
        group = head // (h // kv)  # query head -> the key/value head it shares
        scores = q[:, :, head] @ k[:, :, group].transpose(-1, -2) / math.sqrt(hd)  # (B, T, T)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = (j <= i) & ((j > i - attn.window) if attn.window is not None else True)
        heads.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, :, group])
    y = torch.cat(heads, dim=-1)  # (B, T, h * hd)
    return y @ attn.proj.weight.T + (attn.proj.bias if attn.proj.bias is not None else 0)


def mlp_by_hand(mlp, x):
    gate, up = (x @ mlp.gate_up.weight.T).split(FFN, -1)
    return (F.silu(gate) * up) @ mlp.down.weight.T


def sublayer_by_hand(residual, placement, f, x):
    """The placements these tests use, written out: pre, post, none."""
    scale = residual.layer_scale if residual.layer_scale is not None else 1.0
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
}


def rope_of(model, length=T):
    spec = model.spec
    return rope_tables({layer.head_dim for layer in spec.layers}, length, spec.rope_theta, torch.device("cpu"), spec.rope_scaling)


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
