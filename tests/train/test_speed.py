"""Memory plans on the meta device, activation checkpointing and per-block compile keep the numbers."""

import pytest
import torch

import blockforge
from blockforge.cli import main
from blockforge.spec import load_recipe, resolve
from blockforge.nn.losses import lm_loss
from blockforge.train.memory import memory_plan, saved_activation_bytes
from blockforge.train.speed import block_signature, compile_blocks


def test_7b_memory_plan_allocates_nothing(capsys):
    plan = memory_plan(load_recipe("recipes/llama-7b-mix-0.0625.yaml"), gpus=8, sharded=True)
    assert plan.parameters == 6_738_415_616
    assert plan.weights_bytes == 4 * plan.parameters and plan.optimizer_bytes == 8 * plan.parameters
    assert 1 * 2**30 < plan.activations_bytes < 64 * 2**30
    assert plan.total_per_gpu < plan.weights_bytes  # sharded states plus one micro-batch
    assert main(["inspect", "recipes/llama-7b-mix-0.0625.yaml", "--memory", "--gpus", "8", "--fsdp"]) == 0
    assert "activations per micro-batch of 4 (bf16)" in capsys.readouterr().out


def test_activations_scale_with_micro_batch_and_match_a_real_forward():
    recipe = load_recipe("recipes/llama-tiny-mix.yaml", [("train.precision", "fp32"), ("train.micro_batch_size", 2)])
    plan2 = memory_plan(recipe)
    plan4 = memory_plan(load_recipe("recipes/llama-tiny-mix.yaml", [("train.precision", "fp32"), ("train.micro_batch_size", 4)]))
    assert plan4.activations_bytes == pytest.approx(2 * plan2.activations_bytes, rel=0.05)
    model = blockforge.build_model(resolve(recipe.model))
    real = saved_activation_bytes(model, torch.randint(0, 4096, (2, 129)))  # SDPA's fused CPU kernel
    assert real == plan2.activations_bytes


def test_activation_checkpointing_keeps_gradients():
    recipe = load_recipe("recipes/llama-tiny-mix.yaml", [("model.depth", 3), ("model.width", 32), ("model.heads", 2), ("model.ffn", 64)])
    spec = resolve(recipe.model)
    torch.manual_seed(0)
    plain = blockforge.build_model(spec)
    torch.manual_seed(0)
    checked = blockforge.build_model(spec)
    checked.set_grad_checkpointing([0, 2])
    tokens = torch.randint(0, 4096, (2, 17))
    for model in (plain, checked):
        lm_loss(model, tokens, None)[0].backward()
    for (name, a), b in zip(plain.named_parameters(), checked.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_block_signatures_group_structures():
    recipe = load_recipe("recipes/llama-tiny-mix.yaml", [("model.layers.mix_ln.alpha", 0.5)])
    model = blockforge.build_model(resolve(recipe.model), device="meta")
    assert len({block_signature(b) for b in model.layers}) == 2  # post and pre
    lns = load_recipe("recipes/llama-tiny-mix.yaml", [("model.layers.mix_ln.late", "lns")])
    model = blockforge.build_model(resolve(lns.model), device="meta")
    assert len({block_signature(b) for b in model.layers}) == 1 + 6  # lns scales differ per layer


@pytest.mark.slow
def test_compiled_blocks_match_eager():
    recipe = load_recipe("recipes/llama-tiny-mix.yaml", [("model.depth", 4), ("model.layers.mix_ln.alpha", 0.5)])
    spec = resolve(recipe.model)
    model = blockforge.build_model(spec)
    tokens = torch.randint(0, 4096, (2, 33))
    with torch.no_grad():
        eager = model(tokens)
    assert compile_blocks(model) == 2
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), eager, rtol=1e-4, atol=1e-4)
