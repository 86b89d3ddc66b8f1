"""When a run is unstable, and how often its loss spikes: one definition for every run (a search's trials, the stability
stage's probes, `blockforge train`).

A run is **unstable** when one of these holds (the first that does is its reason):

- it diverged: its training loss became non-finite, or crossed the divergence ceiling after warm-up (train.divergence),
  and the run stopped there;
- after warm-up, the *level* of its training loss (the mean of the last `window` steps' losses) rose more than `rise`
  nats above the lowest level it had reached since warm-up ended: it lost what it had learnt and did not win it back
  within a window;
- its final validation loss lies less than `learnt` nats below the data's own baseline (the unigram model of its tokens
  for text, the uniform guess over the classes for images): it learnt almost nothing a count could not. At the sizes this
  project trains on CPUs, a learning rate far above the best does not blow the loss up: the model collapses to about the
  unigram model and stays there, which only this test sees.

A **spike** is a step whose loss lies more than `spike` nats above the level of the steps before it (counted once per run
of such steps). Spikes are counted, not judged: runs near the edge of stability spike before they diverge, and a run that
spikes and recovers is not unstable by the rule above (a single spike moves a window's mean by 1/window of its height).

The thresholds (RULE) come from measurements of healthy and unstable runs at the sizes this project trains on CPUs
(benchmarks/stability_thresholds.py; docs/concepts/evidence.md says what they were and why these values). The monitor is
fed every step's loss in order by the training loop, when it reads them from the device, so it costs no extra device
synchronization; its state is plain JSON kept in every checkpoint, so a resumed run is judged as an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Rule:
    window: int = 10  # steps whose mean loss is the level
    rise: float = 1.0  # nats the level may rise above its lowest after warm-up
    learnt: float = 0.15  # nats the final validation loss must lie below the data's baseline
    spike: float = 1.0  # nats a step's loss may lie above the level before it without counting as a spike

    def text(self) -> str:
        return (f"when the level of its training loss (the mean of {self.window} steps) rises more than {self.rise:g} nats above its lowest "
                f"after warm-up, or when its final validation loss is less than {self.learnt:g} nats below the data's baseline (the unigram "
                f"model of its tokens; for images, a uniform guess); a spike is a step {self.spike:g} nats above the level before it")


RULE = Rule()


@dataclass(frozen=True)
class Stability:
    """How a run stood: its reason to be unstable ('' when stable), its spikes, and the largest rise of its level."""

    unstable: str = ""
    spikes: int = 0
    largest_spike: float = 0.0  # nats above the level before it (the largest jump, spike or not)
    rise: float = 0.0  # the largest rise of the level above its lowest after warm-up, in nats
    rise_step: int = 0  # where that rise peaked
    crossed: int = 0  # the first step at which the rise passed the rule's (0: it never did)

    @property
    def stable(self) -> bool:
        return not self.unstable

    def record(self) -> dict:
        return asdict(self)

    @classmethod
    def of_record(cls, record) -> "Stability | None":
        """A Stability from its JSON record (result.json's), or None when it is not one."""
        if not isinstance(record, dict):
            return None
        kinds = {"unstable": str, "spikes": int, "largest_spike": (int, float), "rise": (int, float), "rise_step": int, "crossed": int}
        if set(record) != set(kinds) or any(not isinstance(record[k], kind) or isinstance(record[k], bool) for k, kind in kinds.items()):
            return None
        return cls(**record)


class Monitor:
    """Fed every step's training loss in order (`update`); `state` is its whole state as plain JSON, held by reference, so
    the dict a training loop checkpoints is always current."""

    def __init__(self, warmup_steps: int, state: dict | None = None, rule: Rule = RULE):
        self.warmup_steps, self.rule = warmup_steps, rule
        self.state = state if state is not None else {}
        if not _valid(self.state):
            self.state.clear()
        if not self.state:
            self.state.update({"recent": [], "lowest": None, "rise": 0.0, "rise_step": 0, "crossed": 0, "spikes": 0, "in_spike": False,
                               "largest_spike": 0.0, "steps": 0})

    def update(self, step: int, loss: float) -> None:
        """Step `step`'s (1-based) training loss. A non-finite loss is the divergence rule's to judge, and is not taken in."""
        if not math.isfinite(loss):
            return
        s, window = self.state, self.rule.window
        recent = s["recent"]
        if len(recent) == window:
            jump = loss - sum(recent) / window
            s["largest_spike"] = max(s["largest_spike"], jump)
            spiking = jump > self.rule.spike
            s["spikes"] += int(spiking and not s["in_spike"])
            s["in_spike"] = spiking
        recent.append(loss)
        del recent[:-window]
        s["steps"] = step
        if step >= self.warmup_steps and len(recent) == window:
            level = sum(recent) / window
            s["lowest"] = level if s["lowest"] is None else min(s["lowest"], level)
            if level - s["lowest"] > s["rise"]:
                s["rise"], s["rise_step"] = level - s["lowest"], step
            if not s["crossed"] and level - s["lowest"] > self.rule.rise:
                s["crossed"] = step

    def judge(self, *, diverged: str | None = None, final_loss: float | None = None, baseline: float | None = None) -> Stability:
        """The run's stability at its end: `diverged` (the divergence rule's sentence, if it stopped the run), its final
        validation loss and the data's baseline loss (None where there is none)."""
        s, rule = self.state, self.rule
        reason = ""
        if diverged:
            reason = diverged.removeprefix("training ").split(";")[0]
        elif s["rise"] > rule.rise:
            reason = (f"its training loss level rose more than {rule.rise:g} nats above its lowest after warm-up at step {s['crossed']} "
                      f"({s['rise']:.2f} at most, at step {s['rise_step']})")
        elif final_loss is not None and baseline is not None and not final_loss < baseline - rule.learnt:
            reason = (f"its final validation loss {final_loss:.4g} is less than {rule.learnt:g} nats below the data's baseline {baseline:.4g}: "
                      "it learnt almost nothing a count of the data could not")
        return Stability(reason, s["spikes"], round(s["largest_spike"], 6), round(s["rise"], 6), s["rise_step"], s["crossed"])


def _valid(state: dict) -> bool:
    """Whether `state` is a monitor's state (a checkpoint from before the monitor, or an edited one, is not: it starts anew)."""
    if not state:
        return True
    try:
        return (isinstance(state["recent"], list) and all(isinstance(v, (int, float)) for v in state["recent"])
                and (state["lowest"] is None or isinstance(state["lowest"], (int, float)))
                and all(isinstance(state[k], (int, float)) for k in ("rise", "largest_spike"))
                and all(isinstance(state[k], int) and not isinstance(state[k], bool) for k in ("rise_step", "crossed", "spikes", "steps"))
                and isinstance(state["in_spike"], bool))
    except (KeyError, TypeError):
        return False


def baseline_loss(data_info: dict, classes: int | None = None) -> float | None:
    """The loss of a model that knows only counts: the unigram model of the text's tokens (data.json's unigram_val_ppl), or
    a uniform guess over `classes` (images); None where neither is known."""
    ppl = data_info.get("unigram_val_ppl") if isinstance(data_info, dict) else None
    if isinstance(ppl, (int, float)) and not isinstance(ppl, bool) and ppl > 1:
        return math.log(ppl)
    if classes:
        return math.log(classes)
    return None


def judge_curve(losses: list[float], warmup_steps: int, *, final_loss: float | None = None, baseline: float | None = None,
                diverged: str | None = None, rule: Rule = RULE) -> Stability:
    """The stability of a run whose step losses (from step 1) were `losses`: the monitor fed them in order."""
    monitor = Monitor(warmup_steps, rule=rule)
    for step, loss in enumerate(losses, start=1):
        monitor.update(step, loss)
    return monitor.judge(diverged=diverged, final_loss=final_loss, baseline=baseline)
