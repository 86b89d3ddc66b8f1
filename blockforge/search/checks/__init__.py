"""Tests of an answer already given: at each candidate's own learning rate (lr_check), at longer training (length_check),
near divergence (stability_check, and stability_law across cells) and at larger sizes (transfer). Each reads a cell's
records and evidence; imports evidence, records and the vocabulary."""

from blockforge.search.checks.length_check import LengthCheck, length_check
from blockforge.search.checks.lr_check import LrCheck, lr_check
from blockforge.search.checks.stability_check import CandidateStability, StabilityCheck, stability_check
from blockforge.search.checks.stability_law import StabilityLaw, stability_law
from blockforge.search.checks.transfer import Prediction, TargetOutcome, predictions

__all__ = ["CandidateStability", "LengthCheck", "LrCheck", "Prediction", "StabilityCheck", "StabilityLaw", "TargetOutcome",
           "length_check", "lr_check", "predictions", "stability_check", "stability_law"]
