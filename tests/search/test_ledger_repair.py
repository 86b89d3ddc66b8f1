"""A damaged ledger is repaired before a resume, or refused by name: never resumed into a smaller answer.

A search is stopped half-way (driven without Ray: the runs write metrics.jsonl and, when finished, result.json,
as trials do), its ledger is damaged in each way a kill, a full disk or a user can damage it, and the search is
resumed from it; the answer must be the undamaged resume's."""

import json
import shutil

import pytest

from blockforge.errors import BlockforgeError
from blockforge.search.config import load_search
from blockforge.search.evidence.evidence import evidence_by_cell
from blockforge.search.records.ledger import Ledger
from blockforge.search.records.repair import repair_ledger
from blockforge.search.run.searcher import CellSearcher

from .conftest import drive_curves, write_search
from .test_golden import NoScheduler


def curve(config):
    k = round(dict(config["overrides"])["model.layers.mix_ln.alpha"] * 4)
    seed = dict(config["overrides"])["train.seed"]
    return {10: 7.0, 20: 6.0 - 0.01 * seed, 30: 5.0 + 0.1 * abs(k - 1) + 0.02 * seed}


@pytest.fixture
def stopped(tmp_path):
    """A search stopped after 5 trials (the plan, and the folder it left)."""
    plan = load_search(write_search(tmp_path, cells={"model.depth": [4]}, scheduler=None, trials_per_cell=4,
                                    space={"model.layers.mix_ln.alpha": {"grid": [0.0, 0.25, 0.5, 0.75]}}, sampler={"grid": {}},
                                    baselines=[], confirm={"top": 1, "seeds": 1}))
    folder = tmp_path / "search"
    searcher = CellSearcher(plan, str(folder))
    drive_curves(searcher, NoScheduler(), curve, stop_after=lambda handed: len(handed) >= 5)
    for record in Ledger(folder / "trials.jsonl").records():
        if record.status == "completed":
            (folder / record.run_dir.split(str(folder) + "/", 1)[1] / "result.json").write_text(
                json.dumps({"status": "completed", "step": record.steps, "metrics": {"val_loss": record.value}}))
    return plan, folder


def resumed_answer(plan, folder) -> list:
    searcher = CellSearcher(plan, str(folder), from_ledger=True)
    drive_curves(searcher, NoScheduler(), curve)
    records = Ledger(folder / "trials.jsonl").records()
    evidence = evidence_by_cell(plan, records)["depth=4"]
    finished = sorted((r.seed, r.post_ln_layers, r.status, r.value) for r in records if r.status in ("completed", "diverged"))
    return [evidence.claim(), finished]


def damage(folder, how):
    main, backup = folder / "trials.jsonl", folder / "trials.backup.jsonl"
    lines = main.read_text().splitlines(keepends=True)
    if how == "a cut last line":  # killed while writing a completion: the main copy has half of it, the backup none
        last = json.loads(lines[-1])
        assert last["status"] == "completed"
        main.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
        backup.write_text("".join(backup.read_text().splitlines(keepends=True)[:-1]))
    elif how == "empty":
        main.write_text("")
    elif how == "deleted":
        main.unlink()
    elif how == "a line of garbage in the middle":
        lines[len(lines) // 2] = "\x00\x00 not json at all\n"
        main.write_text("".join(lines))


@pytest.mark.parametrize("how", ["a cut last line", "empty", "deleted", "a line of garbage in the middle"])
def test_a_damaged_ledger_resumes_into_the_undamaged_answer(stopped, tmp_path, how):
    plan, folder = stopped
    undamaged = tmp_path / "undamaged"
    shutil.copytree(folder, undamaged)
    damage(folder, how)
    said = repair_ledger(folder, plan.metric, "blockforge search ... --resume")
    assert said is not None and "repaired before resuming" in said and "\n" not in said
    assert resumed_answer(plan, folder) == resumed_answer(plan, undamaged)


def test_a_ledger_with_a_damaged_line_and_no_copy_is_refused_with_how_to_recover(stopped):
    plan, folder = stopped
    (folder / "trials.backup.jsonl").unlink()
    damage(folder, "a line of garbage in the middle")
    with pytest.raises(BlockforgeError, match=r"line \d+ is not a record .* no trials.backup.jsonl to restore it from, so finished trials "
                                              r"could be missing; restore trials.jsonl from a copy, then resume with: RESUME"):
        repair_ledger(folder, plan.metric, "RESUME")


def test_run_folders_no_record_names_are_refused(stopped):
    plan, folder = stopped
    (folder / "trials.jsonl").unlink()
    (folder / "trials.backup.jsonl").unlink()
    with pytest.raises(BlockforgeError, match=r"both copies of the ledger are empty or missing, while \d+ trial run folder\(s\)"):
        repair_ledger(folder, plan.metric, "RESUME")


def test_an_intact_ledger_needs_no_repair(stopped):
    plan, folder = stopped
    before = (folder / "trials.jsonl").read_text()
    assert repair_ledger(folder, plan.metric, "RESUME") is None and (folder / "trials.jsonl").read_text() == before


def front_and_claims(plan, folder) -> list:
    """Resume to the end; every cell's claim, its front (points, on it or not, values) and every finished trial."""
    from blockforge.search.reports.findings import Findings

    searcher = CellSearcher(plan, str(folder), from_ledger=True)
    drive_curves(searcher, NoScheduler(), curve)
    records = Ledger(folder / "trials.jsonl").records()
    found = Findings.of(plan, records)
    fronts = {cell: ([(p.candidate.model, p.on_front, sorted(p.candidate.values.items())) for p in front.points], round(front.hypervolume, 12))
              for cell, front in (found.fronts.items() if plan.costs else [])}
    claims = [found.evidence[cell].claim() for cell in plan.cell_names() + plan.target_names()]
    finished = sorted((r.cell, r.seed, r.post_ln_layers, r.status, r.value) for r in records if r.status in ("completed", "diverged"))
    return [claims, fronts, finished]


KINDS = {
    "multi-objective": dict(cells={"model.depth": [4]}, scheduler=None, trials_per_cell=6, baselines=[], overrides={"model.heads": 4},
                            space={"model.layers.mix_ln.alpha": {"grid": [0.0, 0.25]}, "model.kv_heads": {"choice": [1, 2, 4]}},
                            sampler={"grid": {}}, objective=None, objectives=[{"metric": "val_loss"}, {"cost": "kv_cache_bytes"}],
                            confirm={"top": 2, "seeds": 1}),
    "a transfer target": dict(cells={"model.depth": [4]}, scheduler=None, trials_per_cell=4, baselines=[], sampler={"grid": {}},
                              space={"model.layers.mix_ln.alpha": {"grid": [0.0, 0.25, 0.5, 0.75]}}, confirm={"top": 1, "seeds": 1},
                              transfer={"to": [{"model.depth": 8}], "seeds": 2, "neighbours": 0}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cut_line_loses_nothing_in_a_front_or_a_transfer_target(tmp_path, kind):
    plan = load_search(write_search(tmp_path, **KINDS[kind]))
    folder = tmp_path / "search"
    if kind == "multi-objective":
        stop = lambda handed: len(handed) >= 7  # noqa: E731  (exploration done, a confirmation seed finished)
    else:
        stop = lambda handed: sum(c["cell"] in plan.target_names() for c in handed) >= 2  # noqa: E731  (two target runs finished)
    drive_curves(CellSearcher(plan, str(folder)), NoScheduler(), curve, stop_after=stop)
    for record in Ledger(folder / "trials.jsonl").records():
        if record.status == "completed":
            (folder / record.run_dir.split(str(folder) + "/", 1)[1] / "result.json").write_text(
                json.dumps({"status": "completed", "step": record.steps, "metrics": {"val_loss": record.value}}))
    undamaged = tmp_path / "undamaged"
    shutil.copytree(folder, undamaged)
    damage(folder, "a cut last line")
    said = repair_ledger(folder, plan.metric, "blockforge search ... --resume")
    assert said is not None and "1 finished trial(s) whose last line was lost were read back" in said
    answer = front_and_claims(plan, folder)
    assert answer == front_and_claims(plan, undamaged)
    if kind == "multi-objective":
        assert answer[1]["depth=4"][0] and sum(cell == "depth=4" for cell, *_ in answer[2]) >= 6  # a front, and every explored point finished
    else:
        assert sum(cell == plan.target_names()[0] for cell, *_ in answer[2]) == 4  # the target's 2 candidates x 2 seeds


@pytest.mark.parametrize("line", ["null", "42", '"text"', "[1, 2]", "{}", '{"cell": "depth=4", "trial": "1", "status": "completed"}',
                                  '{"cell": "depth=4", "trial": 1, "status": "completed", "seq": "two"}',
                                  '{"cell": ["depth=4"], "trial": 1, "status": "completed"}',
                                  '{"cell": "depth=4", "trial": 1, "status": "won"}'])
@pytest.mark.parametrize("copy", ["trials.jsonl", "trials.backup.jsonl"])
def test_a_line_of_any_json_that_is_not_a_record_in_either_copy_is_repaired_without_a_traceback(stopped, line, copy):
    plan, folder = stopped
    clean = folder.parent / "clean"
    shutil.copytree(folder, clean)
    path = folder / copy
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + line + "\n" + "".join(lines[2:]))
    said = repair_ledger(folder, plan.metric, "RESUME")
    assert copy == "trials.backup.jsonl" or "line(s) 3 were not records" in said  # the main copy's damage is said; the backup's is read past
    assert resumed_answer(plan, folder) == resumed_answer(plan, clean)


@pytest.mark.parametrize("finished", [True, False])
def test_a_copied_or_moved_search_resumes_where_it_stopped(tmp_path, stopped, finished):
    plan, folder = stopped
    if finished:
        drive_curves(CellSearcher(plan, str(folder), from_ledger=True), NoScheduler(), curve)
    reference = tmp_path / "reference"
    shutil.copytree(folder, reference)
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(folder, moved)
    shutil.rmtree(folder)  # moved, not copied: nothing may be read from where it was
    assert repair_ledger(moved, plan.metric, "RESUME") is None  # records name run folders relative to the search: nothing to repair
    assert all(r.run_dir.startswith(str(moved)) for r in Ledger(moved / "trials.jsonl").records() if r.run_dir)
    searcher = CellSearcher(plan, str(moved), from_ledger=True)
    handed = drive_curves(searcher, NoScheduler(), curve)
    assert (handed == []) is finished  # a finished search trains nothing; an unfinished one goes on
    assert resumed_answer(plan, moved) == resumed_answer(plan, reference) and not folder.exists()


def test_an_old_ledger_naming_run_folders_by_absolute_paths_is_read_at_the_folder_and_rewritten_once(tmp_path, stopped):
    plan, folder = stopped
    for name in ("trials.jsonl", "trials.backup.jsonl"):  # as ledgers were written before: where the search was then
        path = folder / name
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "run_dir": f"/somewhere/old/{r['run_dir']}" if r["run_dir"] else ""}) + "\n" for r in lines))
    said = repair_ledger(folder, plan.metric, "RESUME")
    assert "now name them relative to the search folder" in said
    assert all(not json.loads(line)["run_dir"].startswith("/") for line in (folder / "trials.jsonl").read_text().splitlines())
    assert repair_ledger(folder, plan.metric, "RESUME") is None  # rewritten once


def _completed(folder):
    return [r for r in Ledger(folder / "trials.jsonl").records() if r.status == "completed"]


def test_a_record_of_a_run_this_search_does_not_hold_is_refused_naming_its_file_and_line(stopped):
    plan, folder = stopped
    backup = folder / "trials.backup.jsonl"
    stranger = {**json.loads(backup.read_text().splitlines()[-1]), "trial": 77, "status": "completed", "value": 0.1, "seq": 999,
                "run_dir": "trials/depth=4/0123456789ab", "identity": "0123456789ab"}
    with open(backup, "a") as f:
        f.write(json.dumps(stranger) + "\n")
    lines = len(backup.read_text().splitlines())
    before = (folder / "trials.jsonl").read_text()
    with pytest.raises(BlockforgeError, match=rf"trials.backup.jsonl: line {lines}: records trial 77 of cell depth=4 as completed, but this "
                                              r"search holds no run of it .*remove the line from both copies, then resume with: RESUME"):
        repair_ledger(folder, plan.metric, "RESUME", plan)
    assert (folder / "trials.jsonl").read_text() == before  # nothing rewritten before the whole merge was checked


def test_a_record_whose_run_folder_the_storage_lost_is_refused_saying_so(stopped):
    import shutil

    plan, folder = stopped
    trial = _completed(folder)[0]
    shutil.rmtree(trial.run_dir)  # a lifecycle rule, a person: the trial's own folder is gone
    with pytest.raises(BlockforgeError, match=rf"records trial {trial.trial} of cell {trial.cell} as completed, but its run folder "
                                              r"trials/.* is gone from the search .the storage lost it, or someone removed it."):
        repair_ledger(folder, plan.metric, "RESUME", plan)


def test_no_record_outvotes_the_run_it_describes(stopped):
    plan, folder = stopped
    trial = _completed(folder)[0]
    backup = folder / "trials.backup.jsonl"
    newer = {**json.loads(next(line for line in backup.read_text().splitlines() if json.loads(line)["trial"] == trial.trial
                                and json.loads(line)["status"] == "completed")), "value": 0.5, "seq": 999}
    with open(backup, "a") as f:
        f.write(json.dumps(newer) + "\n")
    said = repair_ledger(folder, plan.metric, "RESUME")
    assert "1 record(s) whose value was not their run's own last evaluation now hold the run's" in said
    assert next(r for r in _completed(folder) if r.trial == trial.trial).value == trial.value


def test_a_result_file_edited_after_the_run_loses_to_the_runs_own_log(stopped):
    plan, folder = stopped
    trial = _completed(folder)[0]
    for name in ("trials.jsonl", "trials.backup.jsonl"):  # both copies lost its completion: it reads as still running
        path = folder / name
        kept = [line for line in path.read_text().splitlines() if not (json.loads(line)["trial"] == trial.trial and json.loads(line)["status"] == "completed")]
        path.write_text("".join(line + "\n" for line in kept))
    run = folder / trial.run_dir.split(str(folder) + "/", 1)[1]
    (run / "result.json").write_text(json.dumps({"status": "completed", "step": trial.steps, "metrics": {"val_loss": 1.0}}))
    assert "read back from their run folders" in repair_ledger(folder, plan.metric, "RESUME")
    assert next(r for r in _completed(folder) if r.trial == trial.trial).value == trial.value  # the log's, not the edited 1.0


def test_a_ledger_copy_that_is_a_folder_is_one_sentence(stopped):
    plan, folder = stopped
    (folder / "trials.backup.jsonl").unlink()
    (folder / "trials.backup.jsonl").mkdir()
    with pytest.raises(BlockforgeError, match=r"trials.backup.jsonl: is not a file, and the search's records are kept there; move it aside"):
        repair_ledger(folder, plan.metric, "RESUME")
