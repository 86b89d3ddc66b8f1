"""What a search keeps: the ledger of its trials (ledger), where its folder is kept (store), the ledger's repair before a
resume (repair) and how each run ended, as its own folder says (runs). Imports the search's vocabulary (config) only."""

from blockforge.search.records.ledger import COLUMNS, Ledger, LedgerFollower, StageName, TrialRecord
from blockforge.search.records.repair import repair_ledger
from blockforge.search.records.runs import evaluations, last_evaluation, run_end
from blockforge.search.records.store import TENSORBOARD_FOLDER, SearchStore, trial_folder

__all__ = ["COLUMNS", "Ledger", "LedgerFollower", "SearchStore", "StageName", "TENSORBOARD_FOLDER", "TrialRecord", "evaluations",
           "last_evaluation", "repair_ledger", "run_end", "trial_folder"]
