"""The `tracking:` section of a recipe (a single run) or of a search file (every trial): the experiment trackers it is
logged to, named as the HF Trainer's `report_to` names them. Credentials never come from here: each tool reads its own
environment variables (WANDB_API_KEY, WANDB_MODE, MLFLOW_TRACKING_URI, ...), which keeps them out of files and reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from blockforge.errors import SpecError, unknown_choice_message

REPORTERS = ("wandb", "mlflow", "tensorboard")


@dataclass(kw_only=True)
class Tracking:
    report_to: list[str] = field(default_factory=list, metadata={"choices": REPORTERS})  # wandb, mlflow, tensorboard (any of them); empty: none
    project: str | None = None  # the W&B project and the MLflow experiment; default: the search's name (a single run's: blockforge)
    entity: str | None = None  # the W&B entity (a team or user); default: WANDB_ENTITY, else the key's own

    def check(self, path: str) -> None:
        if len(set(self.report_to)) != len(self.report_to):
            raise SpecError("names a tracker twice", path=f"{path}.report_to")
        for key in ("project", "entity"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise SpecError(f"is empty; give a W&B {key} name, or leave the key out for the default one", path=f"{path}.{key}")
            if value is not None and "/" in value:
                raise SpecError(f"{value!r} cannot name a W&B {key}; give a name without '/'", path=f"{path}.{key}")


def report_to_flag(text: str) -> list[str]:
    """`--report-to wandb,mlflow` (as the HF Trainer takes it; `none` for none) -> the tracker names, each checked."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["none"]:
        return []
    for name in names:
        if name not in REPORTERS:
            raise SpecError(unknown_choice_message(name, REPORTERS), file="--report-to")
    return list(dict.fromkeys(names))
