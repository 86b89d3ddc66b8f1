"""How a trial's run ended, as its own run folder says it: the folder's evidence wins over any record of it.

result.json says whether the run finished (completed or diverged) and at which step; metrics.jsonl holds every
evaluation the run logged as it went, so the metrics of its last evaluation are the run's own. A ledger record, or
result.json's copy of the metrics, that disagrees with that log loses to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from blockforge.train.events import Status
from blockforge.train.stability import Stability


@dataclass(frozen=True)
class RunEnd:
    status: str  # completed | diverged
    step: int
    metrics: dict[str, float]
    value: float | None  # the objective metric at the last evaluation (None: diverged)
    stability: Stability | None = None  # how stable it was, as result.json says (None: a run from before the rule)


def metric_lines(run_dir: str | Path) -> list[dict]:
    """Every whole line of the run folder's metrics.jsonl, in order (a line cut short by a kill is skipped; no file: [])."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "step" in event:
            out.append(event)
    return out


def numbers(event: dict) -> dict[str, float]:
    """A metrics line's numeric values, without its step."""
    return {k: v for k, v in event.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def evaluations(run_dir: str | Path) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of every evaluation in the run's metrics.jsonl, by step (the last line of a step wins, as for a
    resumed run that evaluated a step again)."""
    found = {int(e["step"]): numbers(e) for e in metric_lines(run_dir) if e.get("event") == "eval"}
    return sorted(found.items())


def last_evaluation(run_dir: str | Path, step: int | None = None) -> dict[str, float] | None:
    """The numeric metrics of the run's last evaluation (at `step`, when given) in its metrics.jsonl."""
    found = None
    for event in metric_lines(run_dir):
        if event.get("event") == "eval" and (step is None or event.get("step") == step):
            found = numbers(event)
    return found


def result_of(run_dir: str | Path) -> dict | None:
    """result.json's record (None: missing, cut short or not a record)."""
    try:
        result = json.loads((Path(run_dir) / "result.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or not isinstance(result.get("status"), str) or isinstance(result.get("step"), bool) \
            or not isinstance(result.get("step"), int):
        return None
    return result


def run_end(run_dir: str | Path, metric: str) -> RunEnd | None:
    """How the run ended, if it finished (completed or diverged): its step from result.json, its metrics from the log's
    evaluation at that step (result.json's copy only where the log has none)."""
    result = result_of(run_dir)
    if result is None or result["status"] not in (Status.COMPLETED, Status.DIVERGED):
        return None
    copied = {k: v for k, v in (result.get("metrics") or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
        if isinstance(result.get("metrics"), dict) else {}
    logged = last_evaluation(run_dir, result["step"]) if result["status"] == Status.COMPLETED else None
    metrics = {**copied, **(logged or {})}
    value = metrics.get(metric) if result["status"] == Status.COMPLETED else None
    return RunEnd(result["status"], result["step"], metrics, value, Stability.of_record(result.get("stability")))


def finished_without_result(run_dir: str | Path, metric: str) -> RunEnd | None:
    """A run whose result.json was lost or cut short after it finished: its recipe's last step has an evaluation in its log
    and a whole checkpoint. Its end, as the log says it (None otherwise)."""
    import yaml

    if result_of(run_dir) is not None:
        return None
    try:
        steps = yaml.safe_load((Path(run_dir) / "recipe.yaml").read_text())["train"]["steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    logged = last_evaluation(run_dir, steps) if isinstance(steps, int) else None
    kept = (Path(run_dir) / "checkpoints" / f"step-{steps:08d}" / "state.json").is_file() or (Path(run_dir) / "model.safetensors").is_file()
    if not logged or metric not in logged or not kept:  # its last checkpoint, or the final weights a finished run keeps
        return None
    return RunEnd(Status.COMPLETED, steps, logged, logged[metric])


def damaged_result(run_dir: str | Path) -> bool:
    """Whether the run folder holds a result.json that cannot be read as one (cut short, edited into something else)."""
    return (Path(run_dir) / "result.json").exists() and result_of(run_dir) is None
