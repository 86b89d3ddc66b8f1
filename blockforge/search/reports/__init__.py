"""How a search tells what it found: findings (computed once from the ledger), the compute plan, summary.md and the console
table (report, with a file per concern), the views users' tools read (results.csv, the Optuna journal, TensorBoard),
figures, the trackers and whether an answer is final (progress). Reached by module; imports stages and below."""
