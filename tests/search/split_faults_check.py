"""Run by test_split_cluster: the faults of a cluster whose worker node shares no disk with the driver, tried as a user
would (a driver started with `blockforge search --address`). Prints one JSON line of findings.

1. A worker node started without the storage's variables: the search is refused before its first trial, naming the node
   and the variables it lacks, and nothing is written to the storage.
2. A second driver of the same search, while the first runs: refused, naming the first.
3. SIGTERM to the driver: the resume line it prints names --address; run as printed, the search continues on the
   cluster, the interrupted trial from its checkpoint, and its TensorBoard holds each step once.
4. The storage taken away mid-search: the driver says so in one line, no traceback.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
import s3_server  # noqa: E402  (before Ray: the endpoint and keys reach every node)
from conftest import write_search  # noqa: E402
from split_cluster import SplitCluster  # noqa: E402

from blockforge.errors import BlockforgeError  # noqa: E402
from blockforge.search.run.driver import run_search  # noqa: E402
from blockforge.storage import Storage  # noqa: E402

STORAGE_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
STEPS = 400  # long enough that a SIGTERM comes while the first trial trains


def search_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_search(folder, cells={"model.depth": [3]}, space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.5]}},
                        trials_per_cell=2, baselines=[], scheduler=None, sampler={"grid": {}}, max_concurrent=1,
                        overrides={"train.steps": STEPS, "train.eval_every": 10, "train.checkpoint_every": 10, "train.tensorboard": True})


def machine(cwd: Path) -> dict:
    """The environment of a driver on a machine of its own: its own cache, so its own working copy of the search."""
    return dict(os.environ, BLOCKFORGE_CACHE=str(cwd / "cache"))


def driver(path: Path, uri: str, address: str, *extra: str, cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "blockforge", "search", str(path), "--out", uri, "--address", address, *extra]
    return subprocess.Popen(command, cwd=cwd, env=machine(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def in_flight(storage: Storage, deadline_s: float) -> tuple[str, int] | None:
    """A trial's run folder with a whole checkpoint past step 10 and no result yet: (its folder, the checkpoint's step)."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        files = storage.listing("trials")
        for name in files:
            if name.endswith("/state.json") and "/checkpoints/step-" in name:
                run, step = name.split("/checkpoints/")[0], int(name.split("/checkpoints/step-")[1].split("/")[0])
                if f"{run}/result.json" not in files and step >= 50:
                    return run, step
        time.sleep(0.1)
    return None


def tensorboard_steps(storage: Storage, run: str, tmp: Path) -> dict:
    """The event files of a run folder in the storage, and the steps its `loss` scalar holds (once each, or not)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    names = [name for name in storage.listing(f"trials/{run}/tensorboard") if "tfevents" in name]
    steps = []
    for name in names:
        local = tmp / name.replace("/", "_")
        storage.download(f"trials/{run}/tensorboard/{name}", local)
        events = EventAccumulator(str(local))
        events.Reload()
        steps += [event.step for event in events.Scalars("loss")] if "loss" in events.Tags()["scalars"] else []
    return {"files": len(names), "steps": sorted(steps)}


def main(folder: Path) -> None:
    s3 = s3_server.S3()
    report = {}
    try:
        path = search_file(folder / "search")
        work = folder / "work"
        work.mkdir()
        with SplitCluster(folder / "hidden", worker_cpus=2, env=s3_server.ENV, unset=STORAGE_VARIABLES) as split:
            address = split.cluster.address
            # 1. The worker node lacks the storage's variables: refused before any trial.
            uri = f"s3://{s3.bucket()}/unreachable"
            started = time.time()
            try:
                run_search(path, out=uri, address=address, progress_every_s=1000)
                report["refused"] = None
            except BlockforgeError as err:
                report["refused"] = str(err)
            report["refused_after_s"] = round(time.time() - started, 1)
            report["written_when_refused"] = sorted(Storage.open(uri).listing())

            split.kill_worker()
            split.unset = ()
            split.add_worker()  # a node set up as the driver is
            import ray

            ray.shutdown()  # the drivers below are processes of their own, as a user starts them
            uri = f"s3://{s3.bucket()}/search"
            storage = Storage.open(uri)
            first = driver(path, uri, address, cwd=work)
            stopped_at = in_flight(storage, 300)
            report["stopped_at"] = stopped_at
            # 2. A second driver of the same search, elsewhere, while the first runs.
            elsewhere = folder / "elsewhere"
            elsewhere.mkdir()
            second = subprocess.run([sys.executable, "-m", "blockforge", "search", str(path), "--out", uri, "--address", address, "--resume"],
                                    cwd=elsewhere, env=machine(elsewhere), capture_output=True, text=True, timeout=300)
            report["second"] = {"rc": second.returncode, "stderr": second.stderr.strip().splitlines()[-3:]}
            # 3. SIGTERM, then the resume line as printed.
            first.send_signal(signal.SIGTERM)
            out, err = first.communicate(timeout=300)
            report["first"] = {"rc": first.returncode, "stderr": err.strip().splitlines()[-3:]}
            line = next((x.split("resume with: ", 1)[1] for x in err.splitlines()[::-1] if "resume with: " in x), None)
            report["resume_line"] = line
            if line is not None:
                argv = shlex.split(line)
                resumed = subprocess.run([sys.executable, "-m", "blockforge", *argv[1:]], cwd=work, env=machine(work), capture_output=True,
                                         text=True, timeout=600)
                report["resumed"] = {"rc": resumed.returncode, "stderr": resumed.stderr.strip().splitlines()[-3:]}
                run = stopped_at[0] if stopped_at else None
                if run is not None:
                    lines = storage.read_bytes(f"trials/{run}/attempts.jsonl").decode().splitlines()
                    report["attempts"] = [json.loads(x) for x in lines]
                    report["worker"] = split.worker_id
                    report["tensorboard"] = tensorboard_steps(storage, run.removeprefix("trials/"), folder)
            # 4. The storage taken away mid-search.
            uri = f"s3://{s3.bucket()}/cut"
            storage = Storage.open(uri)
            cut = driver(path, uri, address, cwd=work)
            report["cut_at"] = in_flight(storage, 300)
            s3.proxy.cut()
            try:
                out, err = cut.communicate(timeout=400)
            finally:
                s3.proxy.restore()
            report["cut"] = {"rc": cut.returncode, "stderr": err.strip().splitlines()}
    finally:
        s3.close()
    print(json.dumps(report))


if __name__ == "__main__":
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    main(Path(sys.argv[1]))
