"""A search as the tools its users know show it: optuna-dashboard names the objective, TensorBoard names each run by its
trial, k and seed and has an HParams session per trial, results() keeps the search file's order of cells."""

import optuna
import pytest

from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.views import optuna_storage

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


def test_a_notebook_sees_tables_not_dumps_and_pictures_of_the_curves(tmp_path):
    """The quickstart along the golden curves, finished: the view, its cells and law show as compact tables with each
    cell's verdict and interval; keys complete in the file's order; curves() carries k and alpha; plot() draws the points."""
    import html.parser

    import blockforge

    _, store = quickstart(tmp_path / "qs", tmp_path / "node")
    search = blockforge.open_search(store.local)

    class Parse(html.parser.HTMLParser):  # the HTML is well formed: every tag opened is closed, in order
        def __init__(self):
            super().__init__()
            self.open, self.text = [], []

        def handle_starttag(self, tag, attrs):
            self.open.append(tag)

        def handle_endtag(self, tag):
            assert self.open and self.open.pop() == tag

        def handle_data(self, data):
            self.text.append(data)

    page = Parse()
    page.feed(search._repr_html_())
    assert not page.open
    shown = " ".join(page.text)
    for name, answer in search.cells().items():
        interval = answer.vs_pre_ln.text() if answer.vs_pre_ln is not None and answer.verdict not in ("Pre-LN", "n/a") else ""
        assert name in shown and answer.verdict in shown and interval in shown
        assert len(repr(answer)) < 2048 and repr(answer).startswith(f"<CellAnswer {name}: {answer.verdict}")
        assert answer.verdict in answer._repr_html_() and answer.claim in repr(answer) or len(answer.claim) > 400
    assert len(repr(search)) < 4096 and "search quickstart at" in repr(search)
    assert "<table" in search.law()._repr_html_() and search.law().verdict[:60] in repr(search.law())
    assert "Candidate" in repr(search.cell("depth=8").winner) and len(repr(search.cell("depth=8").evidence)) < 4096

    cells = search.cells()
    assert cells._ipython_key_completions_() == list(cells) == ["depth=4", "depth=8", "depth=12"]
    assert "<table" in cells._repr_html_()

    curves = search.curves("depth=8")
    assert {"cell", "trial", "seed", "stage", "model", "alpha", "post_ln_layers", "depth", "step", "val_loss"} <= set(curves.columns)
    answer = search.cell("depth=8")
    figure = answer.plot()
    (ax,) = figure.axes
    drawn = {(float(x), float(y)) for line in ax.get_lines() for x, y in zip(*line.get_data())}
    winner_runs = set(answer.winner.run_dirs.values())
    chosen = curves[curves["model"] == answer.winner.model]
    assert {(float(s), float(v)) for s, v in zip(chosen["step"], chosen["val_loss"])} <= drawn and winner_runs
    plot = search.plot("metric_vs_alpha")
    assert len(plot.axes) >= 3 and any(ax.collections for ax in plot.axes)  # one panel per cell, the trials' points in it
    with pytest.raises(blockforge.BlockforgeError, match="plot: this search has no pareto plot"):
        search.plot("pareto")


def test_the_live_view_in_a_notebook_is_one_bar_of_the_trials_done(tmp_path):
    from blockforge.search.reports.live import ProgressView

    _, store = quickstart(tmp_path / "qs", tmp_path / "node")
    plan = load_search(ROOT / "searches" / "quickstart.yaml")
    view = ProgressView(Ledger(store.local / "trials.jsonl"), plan, every_s=0, mode="bar")
    view.update(journal=False)
    records = Ledger(store.local / "trials.jsonl").records()
    assert view.bar.n == len(records) and view.bar.total == sum(view._planned().values())
    assert "completed" in view.bar.postfix
    view.close()
    assert view.bar is None


def test_run_search_in_a_notebook_shows_a_bar_and_keeps_rays_lines_out(monkeypatch):
    import logging

    from blockforge.search import api

    ray_log = logging.getLogger("ray")
    before = ray_log.level
    monkeypatch.setattr(api, "in_notebook", lambda: True)
    with api._quiet_ray_in_notebook() as mode:
        assert mode == "bar" and ray_log.level == logging.ERROR
    assert ray_log.level == before
    monkeypatch.setattr(api, "in_notebook", lambda: False)
    with api._quiet_ray_in_notebook() as mode:
        assert mode == "lines" and ray_log.level == before
