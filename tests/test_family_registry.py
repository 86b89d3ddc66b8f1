"""A new model family is one registration: it builds, trains, evaluates and is analysed without touching blockforge."""

import pytest
import torch
from torch import nn

from blockforge.families.llama import dataset, example_batch, model_inputs
from blockforge.nn.block import Backbone, build_block
from blockforge.nn.losses import lm_loss
from blockforge.nn.mlp import GeluMLP
from blockforge.spec import load_recipe, resolve
from blockforge.spec.family import FAMILIES, Family, register_family
from tiny_data import write_recipe


class PositionLM(Backbone):
    """A toy causal LM: learned positions instead of RoPE, GELU MLPs, no final norm."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.width)
        self.pos = nn.Parameter(torch.zeros(spec.context, spec.width))
        self.layers = nn.ModuleList(build_block(spec, layer, mlp=GeluMLP, causal=True) for layer in spec.layers)
        self.head = nn.Linear(spec.width, spec.vocab, bias=False)

    def embed_inputs(self, tokens):
        return self.embed(tokens) + self.pos[: tokens.shape[1]], {}

    def head_outputs(self, x):
        return self.head(x)

    def init_outer_weights(self, draw):
        draw.normal(self.embed.weight, 0.02)
        draw.normal(self.pos, 0.01)
        draw.normal(self.head.weight, 0.02)


def outer_costs(model):
    """Its positions and token embedding are lookups (no FLOPs); the head maps every position to the vocabulary."""
    from blockforge.nn.flops import OuterCosts

    return OuterCosts(sequence=model.spec.context, embedding=model.embed.weight.numel() + model.pos.numel(),
                      forward_flops=2 * model.spec.context * model.head.in_features * model.head.out_features)


@pytest.fixture
def toy_family():
    family = register_family(Family(
        name="position-lm", default_norm="layernorm", data_kind="text", required=("vocab", "context"),
        unused=("image_size", "patch_size", "classes"), metrics=("val_loss", "val_ppl"), sample_unit="tok", no_decay=("pos",),
        build=PositionLM, loss=lm_loss, dataset=dataset, example_batch=example_batch, model_inputs=model_inputs,
        outer_costs=outer_costs,
    ))
    yield family
    del FAMILIES[family.name]


def test_a_registered_family_builds_trains_and_is_analysed(tmp_path, toy_family, monkeypatch):
    from blockforge.analysis import angular_distance
    from blockforge.train.loop import train
    from blockforge.train.memory import memory_plan
    from blockforge.train.optim import parameter_groups

    path = write_recipe(tmp_path, steps=6, eval_every=3, alpha=0.5, depth=2)
    recipe = load_recipe(path, [("model.family", "position-lm"), ("train.optimizer", "adamw"), ("train.weight_decay", 0.1)])
    spec = resolve(recipe.model)
    assert spec.norm == "layernorm" and [layer.placement for layer in spec.layers] == ["post", "pre"]
    result = train(recipe, tmp_path / "run", progress=False)
    assert result.status == "completed" and set(result.metrics) >= {"val_loss", "val_ppl"}

    import blockforge

    model = blockforge.load(tmp_path / "run")
    assert isinstance(model, PositionLM)
    groups = parameter_groups(model, spec, 0.1)
    pos_group = next(g for g in groups if any(p is model.pos for p in g["params"]))
    assert pos_group["weight_decay"] == 0.0  # the family's no_decay
    tokens = torch.randint(0, 300, (2, 33))
    assert angular_distance(model, [tokens]).tokens == 2 * 32
    assert memory_plan(recipe).activations_bytes > 0
    from blockforge.nn.flops import model_costs

    costs = model_costs(model)  # what a compute plan counts: the blocks from their modules, the rest from outer_costs
    assert costs.non_embedding == sum(p.numel() for p in model.parameters()) - model.embed.weight.numel() - model.pos.numel()


def test_an_unknown_family_lists_the_registered_ones(tmp_path):
    from blockforge.errors import SpecError

    with pytest.raises(SpecError, match="model.family: unknown value 'gpt'.*llama, vit"):
        load_recipe(write_recipe(tmp_path), [("model.family", "gpt")])
