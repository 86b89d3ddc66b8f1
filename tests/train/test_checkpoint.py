"""Checkpoints restore weights, optimizer state and RNG exactly; weights that do not fit a spec are refused."""

import pytest
import torch

import blockforge
from blockforge.errors import BlockforgeError
from blockforge.spec import resolve
from blockforge.train.checkpoint import latest_checkpoint, load_checkpoint, load_weights, save_checkpoint
from blockforge.spec.train import TrainConfig
from blockforge.train.optim import make_optimizer
from tiny_data import tiny_llama


def _setup(tied=False, width=32):
    spec = resolve(tiny_llama(width=width, depth=2, vocab=20, context=8, tie_embeddings=tied))
    model = blockforge.build_model(spec)
    optimizer = make_optimizer(model, spec, TrainConfig(), torch.device("cpu"))
    return spec, model, optimizer


def _train_a_step(model, optimizer):
    tokens = torch.randint(0, 20, (2, 8))
    model(tokens).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip(tmp_path, tied):
    spec, model, optimizer = _setup(tied)
    _train_a_step(model, optimizer)
    save_checkpoint(tmp_path, model, optimizer, {"step": 1, "data_position": 4})
    expected_next = torch.rand(3)
    _, model2, optimizer2 = _setup(tied)
    state = load_checkpoint(latest_checkpoint(tmp_path), model2, optimizer2)
    assert state["step"] == 1 and state["data_position"] == 4
    assert torch.equal(torch.rand(3), expected_next)  # RNG restored to the moment of saving
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k
    if tied:
        assert model2.head.weight is model2.embed.weight
    saved, restored = optimizer.state_dict(), optimizer2.state_dict()
    assert saved["param_groups"] == restored["param_groups"]
    for index, slots in saved["state"].items():
        for name, value in slots.items():
            assert torch.equal(value, restored["state"][index][name]), (index, name)
    # The same next step from the same state gives the same weights.
    torch.manual_seed(5)
    _train_a_step(model, optimizer)
    torch.manual_seed(5)
    _train_a_step(model2, optimizer2)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


def test_latest_points_at_newest_and_the_last_two_are_kept(tmp_path):
    _, model, optimizer = _setup()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model, optimizer, {"step": step, "data_position": step})
    assert latest_checkpoint(tmp_path).name == "step-00000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest.json", "step-00000002", "step-00000003"]


def test_weights_of_another_shape_are_refused(tmp_path):
    _, model, optimizer = _setup(width=32)
    folder = save_checkpoint(tmp_path, model, optimizer, {"step": 1})
    _, other, _ = _setup(width=48)
    with pytest.raises(BlockforgeError, match=r"embed.weight with shape \[20, 32\], but the model's spec builds \[20, 48\]"):
        load_weights(other, folder / "model.safetensors")
