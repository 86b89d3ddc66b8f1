"""The three per-layer measures agree with direct computations on tiny models."""

import json
import math

import numpy as np
import pytest
import torch

from blockforge.analysis import (
    AngularDistance, angular_distance, grad_norms, layer_drop, layer_skipped, logged_grad_norms, plot, replot,
)
from blockforge.errors import BlockforgeError
from blockforge.nn.losses import image_loss, lm_loss

from tiny_setup import image_batches, tiny_llama, tiny_vit, token_batches


def direct_layer_norms(model, loss) -> list[float]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [math.sqrt(sum(float(p.grad.norm()) ** 2 for p in block.parameters())) for block in model.layers]


def test_grad_norms_equal_direct_param_grad_norms_llama():
    model = tiny_llama(depth=3)
    batches = token_batches(count=2)
    measured = grad_norms(model, batches)
    assert measured.shape == (2, 3)
    assert all(p.grad is None for p in model.parameters())  # gradients are cleared afterwards
    for row, batch in zip(measured, batches):
        assert row == pytest.approx(direct_layer_norms(model, lm_loss(model, batch, None)[0]), rel=1e-5)


def test_grad_norms_equal_direct_param_grad_norms_vit():
    model = tiny_vit(depth=2)
    batches = image_batches(count=2)
    measured = grad_norms(model, batches)
    for row, batch in zip(measured, batches):
        assert row == pytest.approx(direct_layer_norms(model, image_loss(model, batch)[0]), rel=1e-5)


def test_grad_norms_ignore_padding_like_the_training_loss():
    model = tiny_llama(depth=2)
    batch = token_batches(count=1)[0]
    batch[:, 10:] = 0  # pad id 0 from position 10 on
    measured = grad_norms(model, [batch], pad_id=0)[0]
    assert measured == pytest.approx(direct_layer_norms(model, lm_loss(model, batch, 0)[0]), rel=1e-5)


def test_angular_distance_of_identical_vectors_is_0_and_of_opposite_vectors_is_1():
    x = torch.randn(50, 16)
    same = AngularDistance(1)
    same.update([x, 3.0 * x])  # the angle ignores length
    assert same.distances[0, 0] == pytest.approx(0.0, abs=1e-6)
    opposite = AngularDistance(1)
    opposite.update([x, -x])
    assert opposite.distances[0, 0] == pytest.approx(1.0, abs=1e-6)
    orthogonal = AngularDistance(1)
    orthogonal.update([torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])])
    assert orthogonal.distances[0, 0] == pytest.approx(0.5)


def direct_distances(states: list[np.ndarray]) -> np.ndarray:
    """mean over tokens of arccos(cos(x_l, x_l+n)) / pi, written out pair by pair."""
    depth = len(states) - 1
    table = np.full((depth, depth), np.nan)
    for n in range(1, depth + 1):
        for l in range(depth - n + 1):
            a, b = states[l], states[l + n]
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
            table[n - 1, l] = np.mean(np.arccos(np.clip(cos, -1.0, 1.0)) / np.pi)
    return table


def test_angular_distance_matches_a_direct_computation_on_random_activations():
    states = [torch.randn(200, 24) + 0.5 * i for i in range(5)]  # 4 layers: 5 states, drifting apart
    accumulated = AngularDistance(4)
    accumulated.update(states)
    expected = direct_distances([s.double().numpy() for s in states])
    np.testing.assert_allclose(accumulated.distances, expected, rtol=1e-10)
    assert np.isnan(accumulated.distances[3, 1])  # l + n > L has no value
    assert accumulated.tokens == 200


def test_streaming_accumulation_equals_all_at_once():
    batches = [[torch.randn(rows, 16) for _ in range(4)] for rows in (7, 30, 1)]
    streamed = AngularDistance(3)
    for states in batches:
        streamed.update(states)
    at_once = AngularDistance(3)
    at_once.update([torch.cat([b[i] for b in batches]) for i in range(4)])
    np.testing.assert_allclose(streamed.distances, at_once.distances, rtol=1e-12)
    assert streamed.tokens == at_once.tokens == 38


def test_angular_distance_of_a_model_uses_every_layer_input_and_the_last_output():
    model = tiny_llama(depth=3)
    batches = token_batches(count=2)
    states = []
    hooks = [model.embed.register_forward_hook(lambda m, a, out: states.append(out))]
    hooks += [block.register_forward_hook(lambda m, a, out: states.append(out)) for block in model.layers]
    with torch.no_grad():
        per_batch = []
        for batch in batches:
            states.clear()
            model(batch[:, :-1])
            per_batch.append([s.flatten(0, 1).double().numpy() for s in states])
    for hook in hooks:
        hook.remove()
    expected = direct_distances([np.concatenate([b[i] for b in per_batch]) for i in range(4)])

    streamed = angular_distance(model, batches)
    np.testing.assert_allclose(streamed.distances, expected, rtol=1e-6)
    assert streamed.tokens == 2 * 4 * 16
    one_batch = angular_distance(model, [torch.cat(batches)])
    np.testing.assert_allclose(one_batch.distances, streamed.distances, rtol=1e-6)
    assert model(batches[0][:, :-1]).shape == (4, 16, 64)  # the hooks are gone: a forward pass reaches the head again


def test_angular_distance_skips_padding_and_covers_vit_tokens():
    model = tiny_llama(depth=2)
    batch = token_batches(count=1)[0].clamp(min=1)  # no pad id in the text ...
    batch[0, 5:] = 0  # ... but at the end of the first row: its last 11 input positions
    assert angular_distance(model, [batch], pad_id=0).tokens == 4 * 16 - 11
    vit = tiny_vit(depth=2)
    assert angular_distance(vit, image_batches(count=2)).tokens == 2 * 5 * (16 + 1)  # patches and the class token


def zero_branch_outputs(block) -> None:
    with torch.no_grad():
        block.attn.branch.proj.weight.zero_()
        block.mlp.branch.down.weight.zero_()


def test_skipping_a_layer_whose_branch_output_is_zeroed_changes_nothing():
    model = tiny_llama(depth=3, alpha=0.0).eval()  # Pre-LN everywhere: x + 0 is x
    zero_branch_outputs(model.layers[1])
    batches = token_batches(count=2)
    before = model(batches[0][:, :-1])
    for metric in ("val_loss", "val_ppl"):
        result = layer_drop(model, batches, metric)
        assert result["change"][1] == pytest.approx(0.0, abs=1e-6)
        assert abs(result["change"][0]) > 1e-4 and abs(result["change"][2]) > 1e-4
        assert len(result["dropped_metrics"]) == 3 and result["baseline"] == result["baseline_metrics"][metric]
    assert torch.equal(model(batches[0][:, :-1]), before)  # every block is back in place


def test_layer_drop_of_a_vit_reports_accuracy_and_rejects_perplexity():
    model = tiny_vit(depth=2).eval()
    result = layer_drop(model, image_batches(count=2), "val_acc")
    assert 0.0 <= result["baseline"] <= 1.0 and len(result["change"]) == 2
    with pytest.raises(BlockforgeError, match="val_ppl"):
        layer_drop(model, image_batches(count=1), "val_ppl")


def test_layer_skipped_puts_the_block_back_after_an_error():
    model = tiny_llama(depth=2)
    block = model.layers[0]
    with pytest.raises(RuntimeError):
        with layer_skipped(model, 0):
            assert model.layers[0] is not block
            raise RuntimeError("boom")
    assert model.layers[0] is block


def test_logged_grad_norms_read_the_run_log(tmp_path):
    lines = [
        {"step": 5, "event": "train", "loss": 3.0, "layer_grad_norms": [1.0, 2.0]},
        {"step": 6, "event": "train", "loss": 2.9},
        {"step": 10, "event": "eval", "val_loss": 3.1},
        {"step": 10, "event": "train", "loss": 2.8, "layer_grad_norms": [0.5, 0.25]},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert logged_grad_norms(tmp_path) == {"steps": [5, 10], "norms": [[1.0, 2.0], [0.5, 0.25]]}
    assert logged_grad_norms(tmp_path / "nothing-here") is None


def test_replot_redraws_a_figure_from_its_json(tmp_path):
    record = {
        "analysis": "angular_distance", "inputs": {},
        "results": [{"label": "a", "state": "init", "seeds": [0], "tokens": 10, "distances": [[0.1, 0.2], [0.3, None]]}],
    }
    (tmp_path / "angular_distance.json").write_text(json.dumps(record))
    png = replot(tmp_path / "angular_distance.json")
    assert png == tmp_path / "angular_distance.png" and png.read_bytes()[:4] == b"\x89PNG"
    assert plot(record, tmp_path / "again.png").stat().st_size > 1000
