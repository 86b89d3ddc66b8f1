"""Searches over per-layer choices, by role, each folder importing only the ones listed before it:

    config costs display preflight   the vocabulary (SearchPlan, costs, tables, what a cluster must hold)
    records/    what a search keeps          evidence/   statistics over records    checks/   tests of an answer given
    stages/     a cell and its pipeline      reports/    what a search tells        run/      Ray Tune, Optuna, the trials
    api         the face: open_search, run_search

docs/design.md says what each owns."""
