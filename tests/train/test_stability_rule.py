"""The instability rule (train/stability.py) on synthetic curves of known shape: healthy, spiking and recovering,
diverged, rising back, collapsed to the baseline; and its state carried through a checkpoint gives the same judgement as
an uninterrupted run."""

import json
import math
import random

import pytest

from blockforge.train.stability import RULE, Monitor, Rule, Stability, baseline_loss, judge_curve

WARMUP = 15
BASELINE = 6.66  # ln of a unigram perplexity of 780


def healthy(steps: int = 150, seed: int = 0, end: float = 5.9) -> list[float]:
    """A loss falling from ln(8192) towards `end`, with per-step noise of the size small batches give (sd 0.12)."""
    rng = random.Random(seed)
    return [end + (9.0 - end) * math.exp(-step / 25) + rng.gauss(0.0, 0.12) for step in range(1, steps + 1)]


def test_a_healthy_curve_is_stable_without_spikes():
    for seed in range(5):
        judged = judge_curve(healthy(seed=seed), WARMUP, final_loss=5.95, baseline=BASELINE)
        assert judged.stable and judged.spikes == 0, judged
        assert judged.rise < RULE.rise / 2  # far from the threshold: noise moves a 10-step level by a few hundredths


def test_a_spike_that_recovers_is_counted_not_called_unstable():
    losses = healthy()
    losses[80] += 3.0  # one step 3 nats up, then back
    losses[81] += 1.5
    judged = judge_curve(losses, WARMUP, final_loss=5.95, baseline=BASELINE)
    assert judged.stable and judged.spikes == 1 and judged.largest_spike > 2.5
    losses[120] += 2.0  # a second, separate spike
    assert judge_curve(losses, WARMUP, final_loss=5.95, baseline=BASELINE).spikes == 2


def test_a_loss_that_rises_back_for_good_is_unstable_at_the_step_it_rose():
    losses = healthy()
    losses[90:] = [loss + 2.0 for loss in losses[90:]]  # falls to ~6, then blows up to ~8 and stays there
    judged = judge_curve(losses, WARMUP, final_loss=7.9, baseline=BASELINE)
    assert not judged.stable and "rose" in judged.unstable and judged.rise > RULE.rise
    assert 91 <= judged.crossed <= 100 + RULE.window and f"at step {judged.crossed}" in judged.unstable


def test_a_run_stuck_at_the_unigram_level_is_unstable_and_one_that_learnt_is_not():
    plateau = [6.55 + (9.0 - 6.55) * math.exp(-step / 10) for step in range(1, 151)]
    judged = judge_curve(plateau, WARMUP, final_loss=6.52, baseline=BASELINE)
    assert not judged.stable and "baseline" in judged.unstable and judged.rise < RULE.rise
    assert judge_curve(plateau, WARMUP, final_loss=BASELINE - RULE.learnt - 0.01, baseline=BASELINE).stable
    assert judge_curve(plateau, WARMUP, final_loss=6.52, baseline=None).stable  # no baseline known (a stream): this test cannot apply


def test_a_diverged_run_is_unstable_with_the_divergence_rules_sentence():
    losses = healthy(steps=40) + [float("nan")]
    judged = judge_curve(losses, WARMUP, diverged="training diverged at step 41: the loss became nan; try a lower train.lr")
    assert judged.unstable == "diverged at step 41: the loss became nan"


def test_warm_up_is_not_judged_and_thresholds_are_the_rules():
    losses = [9.0 - 0.01 * step for step in range(1, 31)] + [9.5] * 40  # rises by 0.8 after warm-up: under the default, over 0.5
    assert judge_curve(losses, 30).stable
    assert not judge_curve(losses, 30, rule=Rule(rise=0.5)).stable
    early = [9.0 + 0.2 * step for step in range(1, 16)] + [9.0] * 40  # a rise inside warm-up is not held against it
    assert judge_curve(early, 15).stable


def test_the_monitors_state_carried_through_json_judges_as_an_uninterrupted_run():
    losses = healthy(seed=3)
    losses[60] += 2.5
    losses[100:] = [loss + 1.5 for loss in losses[100:]]
    whole = judge_curve(losses, WARMUP, final_loss=7.3, baseline=BASELINE)
    first = Monitor(WARMUP)
    for step, loss in enumerate(losses[:70], start=1):
        first.update(step, loss)
    state = json.loads(json.dumps(first.state))  # as a checkpoint's state.json keeps it
    second = Monitor(WARMUP, state)
    for step, loss in enumerate(losses[70:], start=71):
        second.update(step, loss)
    assert second.judge(final_loss=7.3, baseline=BASELINE) == whole and not whole.stable and whole.spikes == 2  # the jump up counts too


@pytest.mark.parametrize("state", [{"recent": "x"}, {"recent": [], "lowest": None}, {"spikes": True}])
def test_a_damaged_state_starts_the_monitor_anew(state):
    monitor = Monitor(WARMUP, state)
    assert monitor.state["spikes"] == 0 and monitor.state["recent"] == []


def test_the_baseline_is_the_unigram_model_of_text_or_a_uniform_guess_over_classes():
    assert baseline_loss({"unigram_val_ppl": 780.4}) == pytest.approx(math.log(780.4))
    assert baseline_loss({}, classes=10) == pytest.approx(math.log(10))
    assert baseline_loss({}) is None and baseline_loss({"unigram_val_ppl": "x"}) is None


def test_a_result_record_reads_back_and_an_edited_one_does_not():
    judged = Stability("why", 2, 1.5, 0.3, 40, 0)
    assert Stability.of_record(json.loads(json.dumps(judged.record()))) == judged
    assert Stability.of_record({**judged.record(), "spikes": "2"}) is None and Stability.of_record(None) is None


def test_a_trained_run_says_how_stable_it_was_in_its_result_and_on_the_command_line(tmp_path, capsys):
    """A sane learning rate trains a stable run; one far too high leaves the tiny model at about its unigram baseline (or
    diverged): result.json keeps the judgement, the stability event is logged, and `train` says it."""
    from blockforge.cli import main
    from tiny_data import write_recipe

    path = write_recipe(tmp_path, steps=150, eval_every=0, checkpoint_every=0, grad_norm_every=0, log_every=10, lr=1e-2)
    assert main(["train", str(path), "--out", str(tmp_path / "sane"), "--no-progress"]) == 0
    sane = json.loads((tmp_path / "sane" / "result.json").read_text())
    assert Stability.of_record(sane["stability"]).stable and "unstable" not in capsys.readouterr().out
    code = main(["train", str(path), "--out", str(tmp_path / "wild"), "--no-progress", "--set", "train.lr=0.8", "--set", "train.warmup=0.0"])
    wild = json.loads((tmp_path / "wild" / "result.json").read_text())
    judged = Stability.of_record(wild["stability"])
    assert judged is not None and not judged.stable, wild
    events = [json.loads(line) for line in (tmp_path / "wild" / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "stability" and events[-1]["unstable"] == judged.unstable
    printed = capsys.readouterr()
    assert (code == 3 and "diverged" in printed.err) or (code == 0 and f"unstable: {judged.unstable}" in printed.out)
