"""Run by test_split_cluster: searches on a cluster whose worker node shares no disk with the driver (split_cluster.py),
against the same search in a local folder. A script, not a test module, so its Ray cluster does not meet the test
session's Ray. Prints one JSON line of findings.

1. A local --out the worker node cannot see is refused before any trial.
2. The search kept in an S3 server (s3_server.py) reports exactly what the local folder's does.
3. A worker node replaced mid-search (a fresh, empty disk) loses no progress: its trial continues from the last
   checkpoint it put up, on the new node.
"""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
import s3_server  # noqa: E402  (before Ray: the endpoint and keys reach every node)
from conftest import write_search  # noqa: E402
from report_compare import comparable  # noqa: E402
from split_cluster import SplitCluster  # noqa: E402

from blockforge.errors import BlockforgeError  # noqa: E402
from blockforge.search.run.driver import run_search  # noqa: E402
from blockforge.storage import Storage, fetch_folder  # noqa: E402


def search_file(folder: Path, **changes) -> Path:
    """Explores with ASHA (sampled: fewer trials than distinct k), confirms, and transfers to a larger depth."""
    settings = dict(cells={"model.depth": [3, 4]}, space={"model.layers.mix_ln.alpha": {"uniform": [0.0, 1.0]}}, trials_per_cell=3,
                    baselines=[{"model.layers.mix_ln.alpha": 0.0}], confirm={"top": 1, "seeds": 1}, max_concurrent=1,
                    transfer={"to": [{"model.depth": 5}], "seeds": 2, "neighbours": 0},
                    overrides={"train.steps": 30, "train.eval_every": 10, "train.checkpoint_every": 10})
    settings.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    return write_search(folder, **settings)


def checkpoint_in_flight(storage: Storage) -> tuple[str, int] | None:
    """A run folder with a whole checkpoint and no result yet: (its folder, the checkpoint's step)."""
    files = storage.listing("trials")
    for name in files:
        if name.endswith("/state.json") and "/checkpoints/step-" in name:
            run = name.split("/checkpoints/")[0]
            if f"{run}/result.json" not in files:
                return run, int(name.split("/checkpoints/step-")[1].split("/")[0])
    return None


def main(folder: Path) -> None:
    s3 = s3_server.S3()
    report = {}
    try:
        path = search_file(folder / "search")
        # The reference: the same search in a local folder, by a driver with a local Ray of its own.
        subprocess.run([sys.executable, "-m", "blockforge", "search", str(path), "--out", str(folder / "local")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        long_path = search_file(folder / "long", cells={"model.depth": [3]}, trials_per_cell=2, transfer=None, confirm=None,
                                scheduler=None, overrides={"train.steps": 120, "train.eval_every": 20, "train.checkpoint_every": 10})
        hidden = folder / "not-shared"
        with SplitCluster(hidden, worker_cpus=2, env=s3_server.ENV) as split:
            started = time.time()
            try:
                run_search(path, out=hidden / "search", progress_every_s=1000)
                report["refused"] = None
            except BlockforgeError as err:
                report["refused"] = str(err)
            report["refused_after_s"] = time.time() - started
            report["left_in_refused_folder"] = sorted(p.name for p in (hidden / "search").iterdir()) if (hidden / "search").exists() else []

            uri = f"s3://{s3.bucket()}/split"
            outcome = run_search(path, out=uri, progress_every_s=1000)
            report["statuses"] = sorted(r.status for r in outcome.records)
            report["stages"] = sorted({r.stage for r in outcome.records})
            report["reports_equal"] = comparable(fetch_folder(Storage.open(uri), "compare"), uri) == comparable(folder / "local", str(folder / "local"))
            if not report["reports_equal"]:
                a, b = comparable(fetch_folder(Storage.open(uri), "compare"), uri), comparable(folder / "local", str(folder / "local"))
                report["differ"] = [key for key in a if a[key] != b[key]]

            # A worker node lost mid-trial and replaced by one with an empty disk.
            long_uri = f"s3://{s3.bucket()}/replaced"
            storage = Storage.open(long_uri)
            result = {}
            runner = threading.Thread(target=lambda: result.setdefault("outcome", run_search(long_path, out=long_uri, progress_every_s=1000)))
            runner.start()
            deadline, in_flight = time.time() + 300, None
            while time.time() < deadline and in_flight is None and runner.is_alive():
                in_flight = checkpoint_in_flight(storage)
                time.sleep(0.05)
            report["replaced_at"] = in_flight
            if in_flight is not None:
                split.replace_worker(graceful=False)
            runner.join()
            outcome = result["outcome"]
            report["replaced_statuses"] = sorted(r.status for r in outcome.records)
            if in_flight is not None:
                run = in_flight[0]
                lines = storage.read_bytes(f"trials/{run}/attempts.jsonl").decode().splitlines()
                report["attempts"] = [json.loads(line) for line in lines]
                written = [n for n in storage.listing(f"trials/{run}/checkpoints") if n.endswith("/state.json")]
                report["checkpoints_after"] = sorted(written)
    finally:
        s3.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
