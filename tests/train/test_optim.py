"""Parameter groups follow the resolved spec's lr_mult; the schedule warms up and decays as configured."""

import pytest
import torch

import blockforge
from blockforge.spec import ModelSpec, resolve
from blockforge.spec.model import LayerOverride, LayerRules
from blockforge.spec.train import TrainConfig
from blockforge.train.optim import learning_rate, make_optimizer, parameter_groups, set_learning_rate
from tiny_data import tiny_llama


def test_lr_mult_groups_walk_layers_beside_spec():
    spec = resolve(tiny_llama(vocab=20, context=8,
                             layers=LayerRules(overrides=[LayerOverride(at="2:", lr_mult=3.0), LayerOverride(at=0, lr_mult=0.0)])))
    model = blockforge.build_model(spec)
    groups = parameter_groups(model, spec, weight_decay=0.0)
    by_mult = {g["lr_mult"]: {id(p) for p in g["params"]} for g in groups}
    assert set(by_mult) == {0.0, 1.0, 3.0}
    assert {id(p) for p in model.layers[3].parameters()} <= by_mult[3.0]
    assert {id(p) for p in model.layers[0].parameters()} <= by_mult[0.0]
    assert id(model.embed.weight) in by_mult[1.0] and id(model.head.weight) in by_mult[1.0]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    optimizer = make_optimizer(model, spec, TrainConfig(lr=0.01), torch.device("cpu"))
    set_learning_rate(optimizer, 0.01)
    assert sorted(g["lr"] for g in optimizer.param_groups) == [0.0, 0.01, 0.03]


def test_weight_decay_only_on_matrices():
    spec = resolve(ModelSpec(family="vit", width=32, depth=2, heads=2, ffn=64, image_size=8, patch_size=4, classes=3))
    model = blockforge.build_model(spec)
    groups = parameter_groups(model, spec, weight_decay=0.1)
    decayed = {id(p) for g in groups if g["weight_decay"] for p in g["params"]}
    assert id(model.layers[0].attn.branch.qkv.weight) in decayed
    assert id(model.layers[0].attn.branch.qkv.bias) not in decayed
    assert id(model.pos_embed) not in decayed and id(model.cls_token) not in decayed


def test_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup=0.1, min_lr_ratio=0.1)
    lrs = [learning_rate(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    assert learning_rate(55, cfg) == pytest.approx(0.55, abs=1e-9)  # halfway through the decay


def test_constant_and_linear_schedules():
    assert learning_rate(50, TrainConfig(steps=100, lr=2.0, warmup=0.0, schedule="constant")) == 2.0
    assert learning_rate(50, TrainConfig(steps=100, lr=1.0, warmup=0.0, schedule="linear", min_lr_ratio=0.0)) == pytest.approx(0.5)
