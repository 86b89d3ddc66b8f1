"""A search as the tools its users know show it: optuna-dashboard names the objective, TensorBoard names each run by its
trial, k and seed and has an HParams session per trial, results() keeps the search file's order of cells."""

import optuna
import pytest

from blockforge.search.config import load_search
from blockforge.search.ledger import Ledger
from blockforge.search.views import optuna_storage

from .test_api import quickstart
from .test_golden import ROOT


def test_optuna_names_the_metric_and_tensorboard_has_an_hparams_session_per_trial(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plan, store = quickstart(tmp_path / "qs", tmp_path / "node", plan=load_search(ROOT / "searches" / "quickstart.yaml", [("cells.model.depth", [4])]))
    study = optuna.load_study(study_name="depth=4", storage=optuna_storage(store.local / "optuna.journal"))
    assert study.metric_names == ["val_loss"]
    records = [r for r in Ledger(store.local / "trials.jsonl").records() if r.run_dir and r.status != "duplicate"]
    runs = sorted((store.local / "tensorboard" / "depth=4").iterdir())
    assert len(runs) == len({r.run_dir for r in records})
    for run in runs:
        trial = int(run.name.split("-")[0].removeprefix("trial"))
        record = next(r for r in records if r.trial == trial)
        assert run.name == f"trial{trial:03d}-k={record.post_ln_layers}-seed{record.seed}"
        events = EventAccumulator(str(run), size_guidance={"tensors": 0, "scalars": 0})
        events.Reload()
        plugins = events.PluginTagToContent("hparams")
        assert "_hparams_/session_start_info" in plugins and "_hparams_/experiment" in plugins
        if record.status == "completed":
            last = [r for r in Ledger(store.local / "trials.jsonl").records() if r.run_dir == record.run_dir][-1]
            assert events.Scalars("hparams/val_loss")[-1].value == pytest.approx(last.value, rel=1e-6)  # (float32 in TensorBoard)


def test_results_keep_the_search_files_order_of_cells(tmp_path):
    import blockforge

    _, store = quickstart(tmp_path / "qs", tmp_path / "node")
    table = blockforge.open_search(store.local).results()
    cells = list(dict.fromkeys(table["cell"]))
    assert cells == ["depth=4", "depth=8", "depth=12"]  # as the search file lists them, not as text sorts them
    assert list(table[table["cell"] == "depth=8"]["trial"]) == sorted(table[table["cell"] == "depth=8"]["trial"])


def test_a_running_searchs_answers_are_provisional_and_a_finished_ones_final(tmp_path):
    import blockforge

    _, store = quickstart(tmp_path / "running", tmp_path / "node", stop_after=lambda handed: len(handed) >= 12)
    running = blockforge.open_search(store.local)
    answers = running.cells()
    assert all(a.provisional for a in answers.values())
    said = answers["depth=4"].progress
    assert said.running == 1 or said.pending  # one trial left running, somewhere in the search
    assert any(a.progress.running for a in answers.values())
    text = (store.local / "summary.md").read_text()
    assert "Provisional answers" in text and f"- depth=4: {said.text()}" in text and said.text().startswith("provisional: ")
    assert f"of at most {said.planned} trials trained" in said.text()

    _, store = quickstart(tmp_path / "done", tmp_path / "node")
    finished = blockforge.open_search(store.local).cells()
    assert not any(a.provisional for a in finished.values()) and all(a.progress.text() == "final" for a in finished.values())
    assert "Provisional answers" not in (store.local / "summary.md").read_text()
