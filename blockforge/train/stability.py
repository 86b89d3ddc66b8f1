"""When a run is unstable, and how often its loss spikes: one definition for every run (a search's trials, the learning-rate
curves' probes, `blockforge train`), and one for a run among others of the same model at other learning rates.

A run on its own is **unstable** when one of these holds (the first that does is its reason):

- it diverged: its training loss became non-finite, or crossed the divergence ceiling after warm-up (train.divergence),
  and the run stopped there;
- after warm-up, the *level* of its training loss (the mean of the last `window` steps' losses) rose more than `rise`
  nats above the lowest level it had reached since warm-up ended: it lost what it had learnt and did not win it back
  within a window.

What a run **learnt** is how far its final validation loss lies below the loss of a model that knows only counts, on
exactly the tokens that validation loss is measured on (`count_baseline`: the training split's unigram model, on the
scored tokens; for images a uniform guess over the classes). A run that learnt little is not unstable on its own: it may
be a model too slow to learn at this length. Among runs of one model and seed at several learning rates (`judge_sweep`),
a run **collapsed** (unstable) when it learnt less than `collapse` of what a lower learning rate of the same model and
seed learnt: at the sizes this project trains on CPUs a learning rate far above the best does not blow the loss up, the
model falls back to about the count model and stays there. When no learning rate of the sweep learnt `learnt` nats, the
model **did not train** at this length; that is said, and never called unstable.

A **spike** is a step whose loss lies more than `spike` nats above the level of the steps before it (counted once per run
of such steps). Spikes are counted, not judged: runs near the edge of stability spike before they diverge, and a run that
spikes and recovers is not unstable by the rule above (a single spike moves a window's mean by 1/window of its height).

The thresholds (RULE) come from measurements of healthy and unstable runs at the sizes this project trains on CPUs
(benchmarks/stability_thresholds.py; docs/studies/stability.md gives what they were and why these values). The monitor is
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
    spike: float = 1.0  # nats a step's loss may lie above the level before it without counting as a spike
    learnt: float = 0.1  # nats below the count baseline a run must end to have learnt (judge_sweep)
    collapse: float = 0.5  # a run that learnt less than this fraction of what a lower lr learnt collapsed (judge_sweep)
    noise: float = 0.05  # nats: the seed-to-seed spread of a final loss; a decision closer than this is near the threshold

    def text(self) -> str:
        return (f"when the level of its training loss (the mean of {self.window} steps) rises more than {self.rise:g} nats above its lowest "
                f"after warm-up; among the runs of one model and seed at several learning rates, when it learnt (ended below the count "
                f"model of the scored tokens; for images, a uniform guess) less than {self.collapse:g} of what a lower learning rate learnt "
                f"(collapsed); a model whose runs all learnt less than {self.learnt:g} nats did not train at this length; a spike is a "
                f"step {self.spike:g} nats above the level before it")


RULE = Rule()


@dataclass(frozen=True)
class Stability:
    """How a run stood: its reason to be unstable ('' when stable), its spikes, the largest rise of its level, and what it
    learnt (nats its final validation loss lies below the count baseline of the scored tokens; None where unknown)."""

    unstable: str = ""
    spikes: int = 0
    largest_spike: float = 0.0  # nats above the level before it (the largest jump, spike or not)
    rise: float = 0.0  # the largest rise of the level above its lowest after warm-up, in nats
    rise_step: int = 0  # where that rise peaked
    crossed: int = 0  # the first step at which the rise passed the rule's (0: it never did)
    learnt: float | None = None

    @property
    def stable(self) -> bool:
        return not self.unstable

    def record(self) -> dict:
        return asdict(self)

    @classmethod
    def of_record(cls, record) -> "Stability | None":
        """A Stability from its JSON record (result.json's), or None when it is not one (`learnt` may be absent: a run
        judged before it was recorded)."""
        if not isinstance(record, dict):
            return None
        kinds = {"unstable": str, "spikes": int, "largest_spike": (int, float), "rise": (int, float), "rise_step": int, "crossed": int}
        optional = {"learnt": (int, float, type(None))}
        if not set(kinds) <= set(record) <= set(kinds) | set(optional):
            return None
        if any(not isinstance(record[k], kind) or isinstance(record[k], bool) for k, kind in {**kinds, **optional}.items() if k in record):
            return None
        if any(isinstance(v, float) and not math.isfinite(v) for v in record.values()):
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
        validation loss and the count baseline of the tokens that loss was measured on (None where there is none)."""
        s, rule = self.state, self.rule
        reason = ""
        if diverged:
            reason = diverged.removeprefix("training ").split(";")[0]
        elif s["rise"] > rule.rise:
            reason = (f"its training loss level rose more than {rule.rise:g} nats above its lowest after warm-up at step {s['crossed']} "
                      f"({s['rise']:.2f} at most, at step {s['rise_step']})")
        learnt = None
        if not diverged and final_loss is not None and baseline is not None and math.isfinite(final_loss):
            learnt = round(baseline - final_loss, 6)
        return Stability(reason, s["spikes"], round(s["largest_spike"], 6), round(s["rise"], 6), s["rise_step"], s["crossed"], learnt)


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


def count_baseline(batches, log_probs, pad_id: int | None = None, classes: int | None = None) -> float | None:
    """The loss of a model that knows only counts, on exactly what `batches` score: for text, the mean negative log
    probability of their target tokens (each row's tokens after its first; padding left out) under `log_probs` (the training
    split's unigram model); for images, a uniform guess over `classes`. None where neither is known."""
    if classes:
        return math.log(classes)
    if log_probs is None:
        return None
    total, count = 0.0, 0
    for batch in batches:
        targets = batch[:, 1:].reshape(-1).numpy()
        if pad_id is not None:
            targets = targets[targets != pad_id]
        total -= float(log_probs[targets].sum())
        count += len(targets)
    return total / count if count else None


def judge_curve(losses: list[float], warmup_steps: int, *, final_loss: float | None = None, baseline: float | None = None,
                diverged: str | None = None, rule: Rule = RULE) -> Stability:
    """The stability of a run whose step losses (from step 1) were `losses`: the monitor fed them in order."""
    monitor = Monitor(warmup_steps, rule=rule)
    for step, loss in enumerate(losses, start=1):
        monitor.update(step, loss)
    return monitor.judge(diverged=diverged, final_loss=final_loss, baseline=baseline)


STABLE, UNSTABLE, UNTRAINED = "stable", "unstable", "did not train"


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep as judged among the others: its state, why, and its margin: how far (nats) it lay from the
    threshold that decided it, on the side it was decided (None where a divergence decided it)."""

    lr: float
    state: str  # stable | unstable | did not train
    why: str
    margin: float | None
    learnt: float | None

    def near(self, rule: "Rule" = RULE) -> bool:
        """Decided by less than the seed-to-seed noise of a final loss."""
        return self.margin is not None and self.margin < rule.noise


def judge_sweep(runs: list[tuple[float, Stability]], rule: Rule = RULE) -> list[SweepPoint]:
    """The runs of one model and seed at several learning rates (lr, its Stability), judged in order of learning rate: a
    run unstable on its own is unstable; one that learnt less than `rule.collapse` of the most a lower learning rate learnt
    collapsed; one that learnt under `rule.learnt` nats where no lower learning rate learnt more did not train; the rest
    are stable. A run whose `learnt` is unknown (no count baseline) is judged on its own."""
    out, best = [], None  # best: the most a lower, stable learning rate learnt
    for lr, run in sorted(runs, key=lambda item: item[0]):
        learnt = run.learnt
        if run.unstable:
            rise = rule.rise - run.rise if "rose" in run.unstable else None
            out.append(SweepPoint(lr, UNSTABLE, run.unstable, None if rise is None else -rise, learnt))
            continue
        if learnt is None:
            out.append(SweepPoint(lr, STABLE, "no count baseline: judged on its own", None, None))
            continue
        if best is not None and best >= rule.learnt and learnt < rule.collapse * best:
            out.append(SweepPoint(lr, UNSTABLE, f"it learnt {learnt:.3g} nats, under {rule.collapse:g} of the {best:.3g} a lower lr "
                                                f"learnt: it collapsed", rule.collapse * best - learnt, learnt))
            continue
        if learnt < rule.learnt and (best is None or best < rule.learnt):
            out.append(SweepPoint(lr, UNTRAINED, f"it learnt {learnt:.3g} nats, under {rule.learnt:g}, and no lower lr learnt more",
                                  rule.learnt - learnt, learnt))
        else:
            margin = learnt - rule.collapse * best if best is not None and best >= rule.learnt else learnt - rule.learnt
            out.append(SweepPoint(lr, STABLE, "", margin, learnt))
        best = learnt if best is None else max(best, learnt)
    return out
