"""Searches on a local Ray: statuses, divergence, duplicates, resume after SIGKILL, reports and export."""

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from blockforge.cli import main
from blockforge.search.records.ledger import Ledger
from blockforge.search.run.driver import run_search

from .conftest import write_search  # noqa: E402


def rows(search_dir):
    with open(search_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def test_tpe_asha_search_completes_with_statuses_duplicates_and_reports(tmp_path, ray_session):
    path = write_search(tmp_path)
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    records = outcome.records
    statuses = {r.status for r in records}
    assert statuses <= {"completed", "pruned", "duplicate"} and "completed" in statuses
    trained = lambda cell: [r for r in records if r.cell == cell and r.status != "duplicate"]  # noqa: E731
    for cell in ("depth=2", "depth=4"):  # the budget counts trained trials, and none is trained twice
        assert 2 <= len(trained(cell)) <= 5 and len({r.identity for r in trained(cell)}) == len(trained(cell))
    # At depth 2, alpha in [0, 0.75] gives only two models (0 or 1 Post-LN layer): they fit the budget, so
    # the cell enumerates them, each trained once, and proposes nothing more.
    depth2 = [r for r in records if r.cell == "depth=2"]
    assert sorted(r.post_ln_layers for r in trained("depth=2")) == [0, 1]
    assert len(depth2) == 2
    # At depth 4 (k = 0..3 from alpha in [0, 0.75]) the same holds: four distinct models, no duplicate.
    depth4 = [r for r in records if r.cell == "depth=4"]
    assert sorted(r.post_ln_layers for r in depth4) == [0, 1, 2, 3] and all(r.status != "duplicate" for r in depth4)
    for r in records:
        if r.status == "duplicate":
            original = next(o for o in records if o.cell == r.cell and o.trial == r.duplicate_of)
            assert original.identity == r.identity and original.post_ln_layers == r.post_ln_layers
    # Baselines first, and counted like any trial.
    assert [r.alpha for r in depth2[:2]] == [0.0, 0.5]
    for r in records:
        if r.status == "completed":
            assert r.steps == 30 and r.value is not None
        if r.status == "pruned":
            assert r.steps < 30
    out = outcome.search_dir
    for name in ("results.csv", "summary.md", "metric_vs_alpha.png", "alpha_law.json", "trials.jsonl"):
        assert (out / name).exists(), name
    assert {row["cell"] for row in rows(out)} == {"depth=2", "depth=4"}
    assert sorted(p.name for p in (out / "best").glob("*.yaml")) == ["depth=2.recipe.yaml", "depth=2.yaml", "depth=4.recipe.yaml", "depth=4.yaml"]
    assert "depth=2" in outcome.summary and "cannot decide" in outcome.summary


def test_asha_compares_only_inside_a_cell(tmp_path):
    from blockforge.search.config import load_search
    from blockforge.search.run.scheduler import CellScheduler
    from blockforge.search.run.searcher import CellSearcher

    from .conftest import drive_curves

    # margin 0: plain ASHA once a rung has trials; alpha over [0, 1] at depths 2 and 4 is sampled, not enumerated
    plan = load_search(write_search(tmp_path, space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 1.0]}}, trials_per_cell=2,
                                    scheduler={"asha": {"grace_steps": 10, "reduction_factor": 2, "margin": 0.0}}, baselines=[]))
    search_dir = str(tmp_path / "search")
    # depth 2 is far better at every step than depth 4; within depth 4 each later trial is worse at the rung
    curve = lambda config: {10: (1.0 if config["cell"] == "depth=2" else 9.0) + config["number"], 30: 0.5}  # noqa: E731
    drive_curves(CellSearcher(plan, search_dir), CellScheduler(plan, search_dir), curve)
    records = Ledger(tmp_path / "search" / "trials.jsonl").records()
    trained = [r for r in records if r.status in ("completed", "pruned")]
    for cell in ("depth=2", "depth=4"):
        mine = sorted((r for r in trained if r.cell == cell), key=lambda r: r.trial)
        # the first trial of each cell is the first at its rung, however it compares with the other cell's
        assert mine[0].status == "completed" and all(r.status == "pruned" for r in mine[1:]), [(r.trial, r.status) for r in mine]


def test_diverged_trial_is_recorded_and_the_search_finishes(tmp_path, ray_session):
    path = write_search(
        tmp_path, cells={"model.depth": [6]}, trials_per_cell=2, scheduler=None,
        baselines=[{"model.layers.mix_ln.alpha": 1.0, "train.lr": 50.0, "train.warmup": 0.0}, {"model.layers.mix_ln.alpha": 0.0, "train.lr": 3e-3, "train.warmup": 0.1}],
        space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 1.0]}, "train.lr": {"loguniform": [1e-3, 100.0]}, "train.warmup": {"uniform": [0.0, 0.2]}},
    )
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    statuses = sorted(r.status for r in outcome.records)
    assert statuses == ["completed", "diverged"]
    diverged = next(r for r in outcome.records if r.status == "diverged")
    assert diverged.alpha == 1.0 and diverged.steps < 30
    assert json.loads((tmp_path / "out" / "trials" / "depth=6" / diverged.identity / "result.json").read_text())["status"] == "diverged"


@pytest.mark.slow
def test_a_corpus_named_relative_to_the_start_directory_trains(tmp_path, ray_session, monkeypatch):
    from .test_config import relative_data

    path = relative_data(tmp_path, monkeypatch, "corpus.txt")
    data = yaml.safe_load(path.read_text())
    data.update(cells={"model.depth": [2]}, trials_per_cell=1, scheduler=None, baselines=[{"model.layers.mix_ln.alpha": 0.0}])
    path.write_text(yaml.safe_dump(data))
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    assert [r.status for r in outcome.records] == ["completed"]


def test_a_search_folder_remembers_its_sets_and_start_directory_and_survives_damage(tmp_path, ray_session, monkeypatch, capsys):
    from .test_config import relative_data

    path = relative_data(tmp_path, monkeypatch, "corpus.txt")
    data = yaml.safe_load(path.read_text())
    data.update(cells={"model.depth": [2]}, trials_per_cell=1, scheduler=None, baselines=[{"model.layers.mix_ln.alpha": 0.0}])
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    sets = ["--set", "train.eval_batches=1"]
    assert main(["search", str(path), *sets, "--out", str(out)]) == 0
    # Resuming without the --set is refused with the command line that works.
    capsys.readouterr()
    assert main(["search", str(path), "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "changed since" in err and "--set train.eval_batches=1" in err and len(err.strip().splitlines()) == 1
    # A line cut short by a kill is skipped, and the next record starts a line of its own.
    ledger = Ledger(out / "trials.jsonl")
    unsequenced = lambda: [dataclasses.replace(r, seq=0) for r in Ledger(out / "trials.jsonl").records()]  # noqa: E731
    before = unsequenced()
    with open(out / "trials.jsonl", "a") as f:
        f.write('{"cell": "depth=2", "tri')
    assert unsequenced() == before
    ledger.append(before[0])
    assert unsequenced() == before
    assert main(["search", str(path), *sets, "--out", str(out), "--resume"]) == 0
    # An emptied ledger is restored from its copy before the resume, which then finds everything finished.
    results = (out / "results.csv").read_text()
    (out / "trials.jsonl").write_text("")
    capsys.readouterr()
    assert main(["search", str(path), *sets, "--out", str(out), "--resume"]) == 0
    assert "repaired before resuming" in capsys.readouterr().out and (out / "results.csv").read_text() == results
    # Export from elsewhere rebuilds the plan with the --set and the start directory (the corpus is relative).
    monkeypatch.chdir("/")
    assert main(["export", str(out), "--out", str(tmp_path / "model"), "--retrain", "--no-progress"]) == 0
    assert yaml.safe_load((tmp_path / "model" / "recipe.yaml").read_text())["train"]["eval_batches"] == 1
    # A damaged search.json is one sentence, for export and for resume.
    (out / "search.json").write_text('{"file": ')
    capsys.readouterr()
    assert main(["export", str(out), "--out", str(tmp_path / "again"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "search.json" in err and "not valid JSON" in err and "Traceback" not in err
    assert main(["search", str(path), *sets, "--out", str(out), "--resume"]) == 2
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_after_sigkill_does_not_repeat_finished_trials(tmp_path, ray_session):
    path = write_search(tmp_path, scheduler=None, trials_per_cell=4, cells={"model.depth": [4]},
                        space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.25, 0.5, 0.75]}}, sampler={"random": {"seed": 0}},
                        baselines=[], overrides={"train.steps": 120, "train.checkpoint_every": 10}, max_concurrent=1)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    driver = subprocess.Popen([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(out)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 1800  # a guard against a hang, not a speed limit
    while time.time() < deadline:
        if any(r.status == "completed" for r in Ledger(out / "trials.jsonl").records()):
            break
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started, as a crash would
    driver.wait()
    finished = [r for r in Ledger(out / "trials.jsonl").records() if r.status == "completed"]
    assert finished, "the driver was killed before any trial finished"
    stamps = {r.identity: os.stat(out / "trials" / "depth=4" / r.identity / "result.json").st_mtime_ns for r in finished}

    outcome = run_search(path, out=out, resume=True, progress_every_s=0)
    records = outcome.records
    assert all(r.status in ("completed", "duplicate") for r in records), [(r.trial, r.status) for r in records]
    assert sorted(r.post_ln_layers for r in records if r.status == "completed") == [0, 1, 2, 3]
    for identity, stamp in stamps.items():  # finished trials were not trained again
        assert os.stat(out / "trials" / "depth=4" / identity / "result.json").st_mtime_ns == stamp
    for r in records:
        if r.status == "completed":
            lines = [json.loads(x) for x in (out / "trials" / "depth=4" / r.identity / "metrics.jsonl").read_text().splitlines()]
            steps = [x["step"] for x in lines if x["event"] == "train"]
            assert steps == sorted(set(steps)) and steps[-1] == 120


@pytest.mark.slow
def test_export_best_of_a_cell(tmp_path, ray_session, capsys):
    path = write_search(tmp_path, cells={"model.depth": [2, 3]}, trials_per_cell=2, scheduler=None)
    run_search(path, out=tmp_path / "out", progress_every_s=0)
    capsys.readouterr()
    assert main(["export", str(tmp_path / "out"), "--out", str(tmp_path / "x")]) == 2
    assert "--cell" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "out"), "--cell", "depth=3", "--out", str(tmp_path / "model"), "--no-progress"]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert "## Search" in card and "cell `depth=3`" in card
    import blockforge.export

    model = blockforge.export.load(tmp_path / "model")
    assert model.spec.depth == 3
    assert model(torch.randint(0, 300, (1, 8))).shape == (1, 8, 300)
    # The same winner for transformers; a vit-only format is refused before anything is retrained.
    assert main(["export", str(tmp_path / "out"), "--cell", "depth=3", "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    tokens = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        assert (hf_model(tokens).logits - model(tokens)).abs().max().item() <= 1e-5
    assert "## Search" in (tmp_path / "hf" / "README.md").read_text()
    capsys.readouterr()
    assert main(["export", str(tmp_path / "out"), "--cell", "depth=3", "--out", str(tmp_path / "t"), "--format", "timm", "--retrain"]) == 2
    assert "--format timm exports vit models" in capsys.readouterr().err and not (tmp_path / "out" / "retrain").exists()


@pytest.mark.parametrize("change,needle", [
    ({"space": {"model.layers.mix_ln.alpah": {"uniform": [0, 1]}}}, "space.model.layers.mix_ln.alpah"),
    ({"space": {"model.layers.mix_ln.alpha": {"uniform": [1, 0]}}}, "space.model.layers.mix_ln.alpha.uniform"),
    ({"space": {"model.layers.mix_ln.alpha": {"gaussian": [0, 1]}}}, "space.model.layers.mix_ln.alpha"),
    ({"cells": {"model.depth": [2, 0]}}, "model.depth"),
    ({"objective": {"metric": "accuracy"}}, "objective.metric"),
    ({"sampler": {"tpe": {}, "random": {}}}, "sampler"),
    ({"scheduler": {"asha": {"grace_steps": 1000}}}, "scheduler.asha.grace_steps"),
    ({"scheduler": {"asha": {"grace_steps": 2}}}, "warmup"),
    ({"base": "missing.yaml"}, "base"),
    ({"trials": 3}, "trials"),
    ({"baselines": [{"train.lr": 0.1}]}, "baselines[0]"),
])
def test_bad_search_file_is_one_sentence(tmp_path, capsys, change, needle):
    path = write_search(tmp_path, **change)
    assert main(["search", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert str(path) in err and needle in err, err


@pytest.mark.slow
def test_cluster_trials_use_both_nodes_and_a_lost_node_is_retried_from_checkpoint(tmp_path):
    env = dict(os.environ, BLOCKFORGE_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "cluster_check.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["statuses"] == ["completed"] * 3, report
    assert report["worker_used"] and report["nodes"] >= 2, report
    assert report["removed"], "no trial ran on the worker long enough to remove it"
    attempts = report["attempts"]
    assert len(attempts) >= 2 and attempts[-1]["start_step"] >= 10, attempts  # resumed, not restarted


@pytest.mark.slow
def test_two_worker_data_parallel_trial_on_cpu(tmp_path, ray_session):
    path = write_search(tmp_path, cells={"model.depth": [2]}, trials_per_cell=1, baselines=[], scheduler=None,
                        resources={"cpu": 2, "workers": 2}, overrides={"train.batch_size": 8, "train.micro_batch_size": 2})
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    (record,) = outcome.records
    assert record.status == "completed", record
    attempts = [json.loads(x) for x in (Path(record.run_dir) / "attempts.jsonl").read_text().splitlines()]
    assert attempts[0]["workers"] == 2
    assert "error" not in (Path(record.run_dir) / "rank1.log").read_text().lower()


def test_confirmation_records_seeds_and_verdicts_and_export_takes_the_confirmed_winner(tmp_path, ray_session, capsys):
    path = write_search(tmp_path, cells={"model.depth": [4]}, trials_per_cell=4, confirm={"top": 2, "seeds": 2})
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    records = outcome.records
    explore = [r for r in records if r.stage == "explore"]
    confirm = [r for r in records if r.stage == "confirm"]
    assert sorted(r.post_ln_layers for r in explore) == [0, 1, 2, 3]  # k = 0..3 enumerated, one seed each
    assert {r.seed for r in explore} == {0}
    assert confirm and all(r.status == "completed" and r.steps == 30 for r in confirm)  # never stopped early
    by_model = {}
    for r in records:
        if r.status == "completed":
            by_model.setdefault(r.model, set()).add(r.seed)
    finalists = {m for m, seeds in by_model.items() if seeds == {0, 1, 2}}
    # The 2 best, the baselines (k = 0 and k = 2) and Pre-LN: at least 2 and at most 4 distinct models, 3 seeds each.
    assert 2 <= len(finalists) <= 4
    assert any(r.uniform_pre and r.model in finalists for r in records)
    assert all(len({r.identity for r in records if r.model == m and r.status == "completed"}) == 3 for m in finalists)
    table = rows(outcome.search_dir)
    assert {"seed", "stage", "model"} <= set(table[0]) and {row["seed"] for row in table} == {"0", "1", "2"}
    summary = (outcome.search_dir / "summary.md").read_text()
    assert "paired t" in summary and "n=3" in summary and "minus Pre-LN [95% CI]" in summary
    assert any(word in outcome.summary for word in ("Pre-LN", "better", "tied", "worse"))

    from blockforge.search.evidence.evidence import evidence_by_cell

    evidence = evidence_by_cell(outcome_plan(path), records)["depth=4"]
    assert evidence.winner.n == 3 and evidence.winner.model in finalists
    assert main(["export", str(outcome.search_dir), "--out", str(tmp_path / "model"), "--no-progress"]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert "### Replicates" in card and evidence.verdict in card and "seed-0 run" in card
    from safetensors.torch import load_file

    import blockforge.export

    exported = load_file(tmp_path / "model" / "model.safetensors")
    run = Path(evidence.winner.run_dirs[0])
    assert not (run / "checkpoints").exists()  # its cell done, the run keeps its final weights only: no optimizer state
    trained = load_file(run / "model.safetensors")
    assert all(torch.equal(exported[k], trained[k]) for k in exported)  # the winner's own weights
    assert blockforge.export.load(tmp_path / "model").spec.post_ln_count() == evidence.winner.post_ln_layers


def outcome_plan(path):
    from blockforge.search.config import load_search

    return load_search(path)


@pytest.mark.slow
def test_learning_rate_searched_with_alpha_is_reported_per_cell(tmp_path, ray_session):
    path = write_search(tmp_path, cells={"model.depth": [2]}, trials_per_cell=3, scheduler=None, confirm={"top": 1, "seeds": 1},
                        space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 0.75]}, "train.lr": {"loguniform": [1e-3, 1e-2]}},
                        baselines=[{"model.layers.mix_ln.alpha": 0.0, "train.lr": 3e-3}])
    outcome = run_search(path, out=tmp_path / "out", progress_every_s=0)
    lrs = {r.overrides["train.lr"] for r in outcome.records if r.stage == "explore" and r.status == "completed"}
    assert len(lrs) >= 2  # the sampler moves lr as well as alpha
    assert "best lr" in outcome.summary
    from blockforge.search.evidence.evidence import evidence_by_cell

    winner = evidence_by_cell(outcome_plan(path), outcome.records)["depth=2"].winner
    best_lr = f"{winner.overrides['train.lr']:.4g}"
    assert best_lr in outcome.summary.splitlines()[2]  # the winner's lr in the cell's row, beside its alpha range

    # The search seen by pandas, optuna-dashboard and TensorBoard.
    table = rows(outcome.search_dir)
    assert {"depth", "lr", "alpha", "seed"} <= set(table[0]) and {row["depth"] for row in table} == {"2"}  # an int stays an int
    import optuna

    from blockforge.search.reports.views import optuna_storage

    study = optuna.load_study(study_name="depth=2", storage=optuna_storage(outcome.search_dir / "optuna.journal"))
    trained = [r for r in outcome.records if r.status in ("completed", "pruned", "diverged", "failed")]
    assert len(study.trials) == len(trained) and study.direction == optuna.study.StudyDirection.MINIMIZE
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all({"train.lr", "model.layers.mix_ln.alpha"} <= set(t.params) and "seed" in t.user_attrs for t in done)
    assert min(t.value for t in done) == min(r.value for r in trained if r.status == "completed")
    assert list((outcome.search_dir / "tensorboard" / "depth=2").glob("*/events.out.tfevents.*"))


@pytest.mark.slow
def test_resume_after_a_kill_during_confirmation_repeats_no_finished_trial(tmp_path, ray_session):
    path = write_search(tmp_path, scheduler=None, cells={"model.depth": [2]}, trials_per_cell=2, confirm={"top": 2, "seeds": 2},
                        overrides={"train.steps": 60, "train.checkpoint_every": 10}, max_concurrent=1)
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(out)], env=dict(os.environ),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 1800  # a guard against a hang, not a speed limit
    while time.time() < deadline:
        if any(r.stage == "confirm" and r.status == "completed" for r in Ledger(out / "trials.jsonl").records()):
            break
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    finished = [r for r in Ledger(out / "trials.jsonl").records() if r.status == "completed"]
    assert any(r.stage == "confirm" for r in finished), "the driver was killed before confirmation"
    stamps = {r.identity: os.stat(Path(r.run_dir) / "result.json").st_mtime_ns for r in finished}

    outcome = run_search(path, out=out, resume=True, progress_every_s=0)
    completed = [r for r in outcome.records if r.status == "completed"]
    for identity, stamp in stamps.items():
        assert os.stat(Path(next(r.run_dir for r in completed if r.identity == identity)) / "result.json").st_mtime_ns == stamp
    # Two models (k = 0, 1) x three seeds, each replicate trained once.
    assert sorted((r.post_ln_layers, r.seed) for r in completed) == [(k, s) for k in (0, 1) for s in (0, 1, 2)]


def test_a_search_prepares_its_data_once_and_every_trial_reads_that_set(tmp_path, ray_session, s3, monkeypatch):
    """The search prepares the data its trials read into data/<fingerprint>/ of its folder before the first trial (as
    Ray tasks); a search whose recipe names a set in object storage reads that one instead, each node taking it down once."""
    from blockforge.data import prepare as prepare_module
    from blockforge.storage import Storage

    monkeypatch.setattr(prepare_module, "PART_CHARS", 20_000)  # a few parts, so that Ray tasks prepare them
    path = write_search(tmp_path, cells={"model.depth": [2]}, space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.5]}},
                        baselines=[], trials_per_cell=2, scheduler=None, sampler={"grid": {}}, max_concurrent=1)
    outcome = run_search(path, out=tmp_path / "local", progress_every_s=0)
    sets = list((tmp_path / "local" / "data").glob("*/manifest.json"))
    assert len(sets) == 1
    records = [json.loads(p.read_text()) for p in (sets[0].parent / "parts").glob("*.json")]
    assert len(list((sets[0].parent / "parts").glob("train-*.json"))) > 1 and {r["host"] for r in records}  # parts, run as tasks
    assert {r["nice"] for r in records} == {os.nice(0)}  # at the driver's priority, not Ray's 15 levels below
    runs = [tmp_path / "local" / r.run_dir for r in outcome.records if r.status == "completed"]
    assert len(runs) == 2 and {json.loads((run / "data.json").read_text())["prepared"] for run in runs} == {str(sets[0].parent)}

    uri = s3.direct(s3.bucket(), "sets/tiny")
    assert main(["prepare", str(tmp_path / "tiny.yaml"), "--out", uri, "--no-progress", "--workers", "1"]) == 0
    outcome = run_search(path, out=tmp_path / "remote-data", overrides=[("data.prepared", uri)], progress_every_s=0)
    assert not (tmp_path / "remote-data" / "data").exists()  # nothing to prepare: the recipe names its set
    runs = [tmp_path / "remote-data" / r.run_dir for r in outcome.records if r.status == "completed"]
    assert len(runs) == 2 and {json.loads((run / "data.json").read_text())["prepared"] for run in runs} == {uri}
    assert [r.value for r in outcome.records] == [r.value for r in Ledger(tmp_path / "local" / "trials.jsonl").records()]
    manifest = json.loads(Storage.open(uri).read_bytes("manifest.json"))
    shards = [f"{s['name']}.{kind}" for split in manifest["splits"].values() for s in split["shards"] for kind in ("bin", "idx")]
    fetched = Storage.open(uri).working_copy("prepared") / "fetched.jsonl"
    assert sorted(json.loads(line)["file"] for line in fetched.read_text().splitlines()) == sorted(shards)  # each file once
