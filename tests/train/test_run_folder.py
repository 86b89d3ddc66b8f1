"""A run folder has one owner at a time, and a write that fails (a full disk, a file size limit) ends the
run in one sentence with the previous checkpoint intact and no temporary file left behind."""

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import blockforge
from blockforge.cli import main
from blockforge.io import atomic_write
from blockforge.spec import load_recipe
from blockforge.lock import RunLock
from blockforge.train.loop import Trainer
from blockforge.train.signals import StopRequest


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".partial")]


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another live process owning `folder`."""
    code = f"import time; from blockforge.lock import RunLock; RunLock({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_train_into_a_live_run_is_refused_and_a_dead_owner_is_taken_over(tmp_path, recipe_file, capsys):
    path, run = recipe_file(steps=5), tmp_path / "run"
    run.mkdir()
    holder = hold_lock(run)
    try:
        assert main(["train", str(path), "--out", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"is in use by process {holder.pid} on " in err, err
        assert sorted(p.name for p in run.iterdir()) == ["run.lock"]  # nothing of a second run was written
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((run / "run.lock").read_text())["pid"] == holder.pid  # left behind by the killed owner
    assert main(["train", str(path), "--out", str(run), "--no-progress"]) == 0  # a dead owner's lock is taken over
    assert capsys.readouterr().err == ""
    assert not (run / "run.lock").exists()  # released at the end


def test_a_stale_lock_file_naming_a_dead_process_is_taken_over(tmp_path, recipe_file, capsys):
    run = tmp_path / "run"
    run.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (run / "run.lock").write_text(json.dumps({"pid": int(gone), "host": os.uname().nodename}))
    assert main(["train", str(recipe_file(steps=3)), "--out", str(run), "--no-progress"]) == 0


def test_an_abandoned_trainer_of_this_process_does_not_block_the_folder(tmp_path, recipe_file):
    recipe = load_recipe(recipe_file(steps=3))
    abandoned = Trainer(recipe, tmp_path / "run", progress=False)  # never iterated, still referenced
    assert abandoned.lock.held
    assert Trainer(recipe, tmp_path / "run", progress=False).run().status == "completed"
    assert not abandoned.lock.held


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, recipe_file, capsys, monkeypatch):
    from blockforge.train import tensorfile

    path, run = recipe_file(steps=20, checkpoint_every=5, eval_every=0), tmp_path / "run"
    real_save, calls = tensorfile.save_file, []

    def save_file(tensors, filename, metadata=None):  # the 2nd checkpoint's optimizer state meets a full disk
        calls.append(filename)
        if len(calls) == 5:
            Path(filename).write_bytes(b"half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(tensorfile, "save_file", save_file)
    assert main(["train", str(path), "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"{run / 'checkpoints'}: cannot write the checkpoint of step 10 (No space left on device)" in err
    assert "intact checkpoint of step 5" in err
    assert leftovers(run) == [] and not (run / "run.lock").exists() and not (run / "result.json").exists()
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 5
    monkeypatch.setattr(tensorfile, "save_file", real_save)
    assert blockforge.load(run).spec.depth == 2
    assert main(["train", str(path), "--out", str(run), "--no-progress", "--resume"]) == 0


def _limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("limit,cache,needle", [
    (200_000, False, "checkpoints: cannot write the checkpoint of step 5 (File too large)"),  # the optimizer state is ~320 KB
    pytest.param(32_000, True, "cannot write part train-000000 of the prepared set into the cache (File too large)",  # its shard is ~70 KB
                 marks=pytest.mark.slow),
], ids=["checkpoint", "cache"])
def test_a_file_size_limit_is_one_sentence_not_a_killed_process(tmp_path, recipe_file, limit, cache, needle):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if cache:
        env["BLOCKFORGE_CACHE"] = str(tmp_path / "fresh-cache")
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "blockforge", "train", str(recipe_file(steps=10)), "--out", str(run), "--no-progress"],
                          capture_output=True, text=True, env=env, preexec_fn=_limited(limit), timeout=300)
    assert done.returncode == 2, done.stderr  # not killed by SIGXFSZ
    assert done.stderr.count("\n") == 1 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert leftovers(tmp_path) == []


def test_a_second_signal_stops_at_once_and_leaves_no_temporary_file(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.signum == signal.SIGTERM  # the first one only asks

        def write(tmp: str) -> None:
            Path(tmp).write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)

        with pytest.raises(SystemExit) as stopped:
            atomic_write(tmp_path / "state.json", write)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is previous


def test_lock_file_says_who_owns_the_folder(tmp_path):
    lock = RunLock(tmp_path).acquire()
    owner = json.loads((tmp_path / "run.lock").read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == os.uname().nodename
    lock.release()
    assert not (tmp_path / "run.lock").exists()


def test_files_written_atomically_get_an_ordinary_files_mode(tmp_path):
    from blockforge.io import _umask, atomic_write_text

    mask = os.umask(0o022)
    _umask.cache_clear()  # read once per process; this test sets it
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(mask)
        _umask.cache_clear()
    # readable by others on shared storage, like a file written with open(): not mkstemp's 0600
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == (tmp_path / "plain.json").stat().st_mode & 0o777 == 0o644


def test_temporary_files_a_kill_left_behind_go_on_the_next_start(tmp_path, recipe_file):
    from blockforge.spec import load_recipe
    from blockforge.train.loop import train

    recipe = load_recipe(recipe_file(steps=4, checkpoint_every=2))
    run = tmp_path / "run"
    train(recipe, run, progress=False)
    leftovers = [run / "checkpoints" / ".latest.json.k3j9x1.tmp", run / ".result.json.a8f2.tmp", run / ".metrics.jsonl.x.tmp"]
    for path in leftovers:
        path.write_text("{half")  # as a SIGKILL between mkstemp and the rename leaves them
    keep = run / "checkpoints" / "notes.tmp"  # not one of atomic_write's names
    keep.write_text("mine")
    train(load_recipe(recipe_file(steps=6, checkpoint_every=2)), run, resume=True, progress=False)
    assert not any(path.exists() for path in leftovers) and keep.exists()
