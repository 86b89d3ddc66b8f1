"""A search saved before search/ was regrouped by role resumes: its Ray Tune state names modules this layout does not
have, so it is set aside and the search goes on from its ledger, to the same trials and answer, training nothing twice."""

import json
import os
import shutil
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "saved-before-regroup"


def test_a_search_saved_before_the_regroup_resumes_to_the_same_answer(tmp_path, ray_session, capsys):
    from blockforge.search.api import run_search

    folder = tmp_path / "saved"
    shutil.copytree(FIXTURE, folder)
    out = folder / "out"
    expected = json.loads((FIXTURE / "expected.json").read_text())
    before = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("trials/*/*/result.json")}
    saved = {json.loads(line)["identity"]: json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()
             if json.loads(line)["status"] == "completed"}
    cwd = os.getcwd()
    os.chdir(folder)  # the search file names its base and corpus relative to itself
    try:
        search = run_search("search.yaml", out="out", resume=True)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert "saved by another version of blockforge" in err and "tune.damaged" in err
    assert (out / "tune.damaged").is_dir()

    completed = {r.identity: r for r in search.records if r.status == "completed"}
    assert {i: {"stage": str(r.stage), "seed": r.seed, "alpha": r.alpha} for i, r in completed.items()} == expected["trials"]
    for identity, stamp in before.items():  # what had finished was not trained again
        assert (out / "trials" / "depth=4" / identity / "result.json").stat().st_mtime_ns == stamp
    for identity in expected["kept"]:
        assert completed[identity].value == saved[identity]["value"]
    for identity in expected["trained_on_resume"]:
        assert identity not in before
        steps = [json.loads(x)["step"] for x in (out / "trials" / "depth=4" / identity / "metrics.jsonl").read_text().splitlines()
                 if json.loads(x)["event"] == "train"]
        assert steps == sorted(set(steps)), f"{identity} trained a step twice"
    cell = search.cell("depth=4")
    winner = expected["winner"]
    assert cell.winner.post_ln_layers == winner["post_ln_layers"] and len(cell.winner.values) == winner["n"]
    assert cell.progress.final
