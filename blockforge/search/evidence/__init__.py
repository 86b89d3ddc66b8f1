"""Statistics over a search's records: replicates, paired differences and verdicts (evidence), alpha laws and their
bootstrap (law), early stopping against full budgets (rungs) and fronts with a cost axis (pareto). Imports records and
the vocabulary."""

from blockforge.search.evidence.evidence import (
                                                 METHOD,
                                                 Candidate,
                                                 CellEvidence,
                                                 Difference,
                                                 cell_evidence,
                                                 describe,
                                                 evidence_by_cell,
                                                 paired_difference,
                                                 t_quantile,
                                                 verdict,
)
from blockforge.search.evidence.law import LAWS, BootstrapReport, LawFit, LawReport, alpha_range, decided_law, fit_alpha_law
from blockforge.search.evidence.pareto import Front, front_evidence, hypervolume
from blockforge.search.evidence.rungs import CellRungs, Curve, cell_rungs, curve_of

__all__ = ["LAWS", "METHOD", "BootstrapReport", "Candidate", "CellEvidence", "CellRungs", "Curve", "Difference", "Front", "LawFit",
           "LawReport", "alpha_range", "cell_evidence", "cell_rungs", "curve_of", "decided_law", "describe", "evidence_by_cell",
           "fit_alpha_law", "front_evidence", "hypervolume", "paired_difference", "t_quantile", "verdict"]
