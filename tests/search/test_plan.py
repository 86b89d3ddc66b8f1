"""Compute plans: FLOPs against a hand computation and torch's flop counter, worst-case trials per stage, GPU time."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import blockforge
from blockforge.cli import main
from blockforge.nn.flops import model_costs
from blockforge.search.config import load_search
from blockforge.search.reports.plan import GPU_PEAKS, critical_path, search_plan, trial_flops
from blockforge.spec import ModelSpec, resolve
from blockforge.spec.model import LayerOverride, LayerRules

from .conftest import write_search

ALPHA = "model.layers.mix_ln.alpha"


def test_trial_flops_equal_a_hand_computation(tmp_path):
    plan = load_search(write_search(tmp_path))
    recipe = plan.recipe(plan.trial_overrides(plan.cell("depth=2"), {}))
    # width 32, 2 layers, 2 heads of 16, ffn 64, vocab 300, context 32; 30 steps of 4 rows, evaluated 3 times on 2 batches of 4
    blocks = 2 * (3 * 32 * 32 + 32 * 32 + 2 * 64 * 32 + 64 * 32)  # q/k/v, output, gate and up, down
    forward = 2 * 32 * blocks + 4 * 32 * 32 * (2 * 2 * 16) + 2 * 32 * 32 * 300
    parameters, non_embedding, flops = trial_flops(recipe)
    assert flops == 30 * 4 * 3 * forward + 3 * 2 * 4 * forward
    assert non_embedding == parameters - 300 * 32


@pytest.mark.parametrize("spec,bound", [
    (ModelSpec(family="llama", width=64, depth=3, heads=4, kv_heads=2, ffn=128, vocab=100, context=32, attention="eager",
               layers=LayerRules(overrides=[LayerOverride(at=1, heads=2, window=8)])), 1e-9),
    # the flop counter skips the gradient of the patch projection's input (the images): 1.7% less
    (ModelSpec(family="vit", width=48, depth=2, heads=3, ffn=96, image_size=16, patch_size=4, classes=7, attention="eager"), 0.05),
], ids=["llama gqa per-layer heads window", "vit"])
def test_training_flops_match_torchs_flop_counter(spec, bound):
    spec = resolve(spec)
    model = blockforge.build_model(spec, seed=0)
    batch = torch.randint(0, 100, (2, 32)) if spec.family == "llama" else torch.randn(2, 3, 16, 16)
    with FlopCounterMode(display=False) as counter:
        model(batch).float().sum().backward()
    predicted = 2 * model_costs(blockforge.build_model(spec, device="meta")).train_flops
    assert abs(counter.get_total_flops() / predicted - 1) <= bound


def test_worst_case_trials_per_stage_and_gpu_time(tmp_path, capsys):
    # depth 2 enumerates its k (0, 1); depth 4 samples 3 of its 4 with ASHA: promotion may bring all 3 back with 3 seeds
    path = write_search(tmp_path, trials_per_cell=3, confirm={"top": 1, "seeds": 2, "max_seeds": 3})
    plan = load_search(path)
    cells = {c.cell: c for c in search_plan(plan)}
    assert cells["depth=2"].trials == {"explore": 2, "confirm": 4 * 2, "racing": 3}  # finalists: top 1, 2 baselines, Pre-LN
    assert cells["depth=4"].trials == {"explore": 3, "confirm": 4 * 2 + 4, "racing": 3, "promotion": 3 * 3}
    total = sum(c.total_flops for c in cells.values())
    assert main(["search", str(path), "--plan", "--gpu", "H100", "--gpus", "8", "--mfu", "0.5"]) == 0
    out = capsys.readouterr().out
    hours = total / (GPU_PEAKS["H100"][0] * 1e12 * 0.5) / 3600
    assert hours < 0.01 and f"{hours:.3g} GPU-hours" in out and "8 trial(s) at once" in out  # three figures, never "0.0" and f"{total:.3g}" in out
    assert not (tmp_path / "runs").exists()
    # with a GPU per trial for everything, the wall time is the longest chain of stages: depth=4's explore,
    # confirmation's two rounds (a seed at a time, so a clearly worse finalist can leave the race), one racing round
    # and promotion, each one trial of depth 4 long
    chain, longest = critical_path(list(cells.values()), GPU_PEAKS["H100"][0] * 1e12 * 0.5)
    assert chain == pytest.approx(5 * cells["depth=4"].trial_flops / (GPU_PEAKS["H100"][0] * 1e12 * 0.5)) and longest == "depth=4's stages"
    assert cells["depth=2"].rounds == 4 and cells["depth=4"].rounds == 5


@pytest.mark.parametrize("flags,needle", [(["--gpu", "K80"], "--gpu K80: unknown"), (["--gpus", "8"], "add --plan"),
                                          (["--plan", "--gpu", "H100", "--mfu", "1.5"], "--mfu must be a fraction")])
def test_a_bad_plan_flag_is_one_sentence(tmp_path, capsys, flags, needle):
    path = write_search(tmp_path)
    code = main(["search", str(path), *(["--plan"] if flags[0] == "--gpu" else []), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_transfer_targets_are_planned_after_every_proxy_cell(tmp_path):
    path = write_search(tmp_path, cells={"model.depth": [2, 4]}, scheduler=None, confirm={"top": 1, "seeds": 1},
                        transfer={"to": [{"model.depth": 8}], "seeds": 2, "neighbours": 1})
    cells = {c.cell: c for c in search_plan(load_search(path))}
    target = cells["depth=8"]
    assert target.target and target.trials == {"transfer": (2 * 1 + 2) * 2}  # predicted k, one neighbour each side, Pre-LN; 2 seeds
    assert target.trial_flops > cells["depth=4"].trial_flops
    chain, longest = critical_path(list(cells.values()), 1e12)
    slowest = max(c.rounds * c.trial_flops for c in cells.values() if not c.target)
    assert chain == pytest.approx((slowest + target.trial_flops) / 1e12) and longest.endswith("then target depth=8")
