"""Each placement computes its formula: one block's output by hand (not through the Block code), and gradcheck."""

import math

import pytest
import torch
import torch.nn.functional as F

import blockforge
from blockforge.errors import SpecError
from blockforge.spec.placements import PLACEMENTS, get_placement
from blockforge.spec import ModelSpec
from blockforge.spec.model import LayerRules, LayerSettings

WIDTH, HEADS, FFN, DEPTH, INDEX = 16, 2, 24, 4, 2


def _llama(placement: str, dtype=torch.float32):
    spec = ModelSpec(
        family="llama", width=WIDTH, depth=DEPTH, heads=HEADS, ffn=FFN, vocab=11, context=8,
        layers=LayerRules(default=LayerSettings(placement=placement)),
    )
    model = blockforge.build_model(spec).to(dtype)
    with torch.no_grad():  # norm weights away from 1 so a missing or swapped norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _rms(x, weight, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x, length):
    """Rotate each adjacent pair (x[2j], x[2j+1]) at position t by the angle t * 10000^(-2j/dim)."""
    dim = x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = (torch.arange(length, dtype=torch.float64)[:, None] * inv[None]).to(x.dtype)  # (T, dim/2)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * ang.cos() - odd * ang.sin()
    out[..., 1::2] = even * ang.sin() + odd * ang.cos()
    return out


def _attention_by_hand(attn, x):
    B, T, C = x.shape
    hd = C // HEADS
    w = attn.qkv.weight
    q, k, v = (x @ w[i * C:(i + 1) * C].T for i in range(3))
    split = lambda t: t.view(B, T, HEADS, hd).transpose(1, 2)  # noqa: E731
    q, k, v = _rope(split(q), T), _rope(split(k), T), split(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    return y @ attn.proj.weight.T


def _mlp_by_hand(mlp, x):
    gate, up = (x @ mlp.gate_up.weight.T).split(FFN, -1)
    return (F.silu(gate) * up) @ mlp.down.weight.T


def _norm_weight(residual, slot):
    return getattr(residual, slot).weight


# Each formula written out independently of the slot mechanism.
def _pre(r, f, x, l, L):
    return x + f(_rms(x, _norm_weight(r, "in_norm")))


def _post(r, f, x, l, L):
    return _rms(x + f(x), _norm_weight(r, "out_norm"))


def _deepnorm(r, f, x, l, L):
    return _rms((2 * L) ** 0.25 * x + f(x), _norm_weight(r, "out_norm"))


def _sandwich(r, f, x, l, L):
    return x + _rms(f(_rms(x, _norm_weight(r, "in_norm"))), _norm_weight(r, "branch_norm"))


def _respost(r, f, x, l, L):
    return x + _rms(f(x), _norm_weight(r, "branch_norm"))


def _lns(r, f, x, l, L):
    return x + f(_rms(x, _norm_weight(r, "in_norm")) / math.sqrt(l + 1))


def _none(r, f, x, l, L):
    return x + f(x)


BY_HAND = {"pre": _pre, "post": _post, "deepnorm": _deepnorm, "sandwich": _sandwich, "respost": _respost, "lns": _lns, "none": _none}


def test_every_registered_placement_has_a_hand_written_formula():
    assert set(BY_HAND) == set(PLACEMENTS)


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_block_matches_formula(name):
    model = _llama(name)
    block = model.layers[INDEX]
    x = torch.randn(2, 5, WIDTH)
    rope = _rope_tables(5)
    with torch.no_grad():
        got = block(x, rope=rope)
        h = BY_HAND[name](block.attn, lambda t: _attention_by_hand(block.attn.branch, t), x, INDEX, DEPTH)
        expected = BY_HAND[name](block.mlp, lambda t: _mlp_by_hand(block.mlp.branch, t), h, INDEX, DEPTH)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _rope_tables(length):
    from blockforge.nn.attention import rope_tables

    return rope_tables({(WIDTH // HEADS, 10000.0, 1.0)}, length, torch.device("cpu"))


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_block_gradcheck_float64(name):
    model = _llama(name, torch.float64)
    block = model.layers[INDEX]
    from blockforge.nn.attention import rope_tables

    rope = rope_tables({(WIDTH // HEADS, 10000.0, 1.0)}, 3, torch.device("cpu"))
    x = torch.randn(1, 3, WIDTH, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: block(t, rope=rope), (x,), eps=1e-6, atol=1e-5)


def test_deepnorm_init_gain_scales_value_output_and_mlp_but_not_query_key():
    torch.manual_seed(0)
    L = 64
    spec = ModelSpec(family="llama", width=256, depth=L, heads=4, ffn=512, vocab=11, context=8,
                     layers=LayerRules(default=LayerSettings(placement="deepnorm")))
    model = blockforge.build_model(spec)
    gain = (8 * L) ** -0.25
    assert gain < 1  # (8L)^(-1/4), not its inverse
    qkv = model.layers[0].attn.branch.qkv.weight
    q, k, v = qkv.split(256)
    assert q.std().item() == pytest.approx(0.02, rel=0.03)
    assert k.std().item() == pytest.approx(0.02, rel=0.03)
    assert v.std().item() == pytest.approx(0.02 * gain, rel=0.03)
    assert model.layers[0].attn.branch.proj.weight.std().item() == pytest.approx(0.02 * gain, rel=0.03)
    assert model.layers[0].mlp.branch.down.weight.std().item() == pytest.approx(0.02 * gain, rel=0.03)
    assert model.layers[0].attn.residual_scale == pytest.approx((2 * L) ** 0.25)


def test_lns_scale_follows_layer_index():
    model = _llama("lns")
    assert [b.attn.input_scale for b in model.layers] == pytest.approx([1 / math.sqrt(i + 1) for i in range(DEPTH)])


def test_unknown_placement_raises_with_known_names():
    with pytest.raises(SpecError, match="choose one of: pre, post"):
        get_placement("postt")


@pytest.mark.parametrize("rotate", ["rotate_pairs_complex", "rotate_pairs_real"])
def test_both_rope_paths_follow_the_formula(rotate):
    """Eager rotates with a complex multiply, compiled code in real arithmetic: both are the same rotation."""
    from blockforge.nn import attention

    torch.manual_seed(0)
    B, T, nh, hs = 2, 7, 3, 8
    x = torch.randn(B, T, nh, hs)
    table = attention.rope_tables({(hs, 10000.0, 1.0)}, T, torch.device("cpu"))[(hs, 10000.0, 1.0)].view(T, 1, hs // 2, 2)
    got = getattr(attention, rotate)(x.reshape(B, T, nh, hs // 2, 2), table).flatten(-2)
    expected = _rope(x.transpose(1, 2), T).transpose(1, 2)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
