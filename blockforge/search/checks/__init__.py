"""Tests of an answer already given: over each candidate's learning-rate curve (lr_curve: its best learning rate, its
edge and its LR sensitivity; stability_law: the edge across cells), at longer training (length_check) and at larger sizes
(transfer). Each reads a cell's records and evidence; imports evidence, records and the vocabulary."""

from blockforge.search.checks.length_check import LengthCheck, length_check
from blockforge.search.checks.lr_curve import CandidateCurve, Chain, LrCurves, lr_curves
from blockforge.search.checks.stability_law import StabilityLaw, stability_law
from blockforge.search.checks.transfer import Prediction, TargetOutcome, predictions

__all__ = ["CandidateCurve", "Chain", "LengthCheck", "LrCurves", "Prediction", "StabilityLaw", "TargetOutcome", "length_check", "lr_curves",
           "predictions", "stability_law"]
