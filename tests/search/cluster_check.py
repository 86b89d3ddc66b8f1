"""Run by test_cluster: a head and a worker node on this machine; trials run on both, and a trial on a
removed worker is retried from its checkpoint. A script, not a test module, so its Ray cluster does not
meet the test session's Ray."""

import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from conftest import write_search  # noqa: E402

from blockforge.search.run.driver import run_search  # noqa: E402


def main(folder: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 * 2**20})
    worker = cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="warning")
    worker_id = worker.node_id
    path = write_search(folder, cells={"model.depth": [2]}, trials_per_cell=3, scheduler=None, baselines=[],
                        space={"model.layers.mix_ln.alpha": {"choice": [0.0, 0.5, 1.0]}}, sampler={"grid": {}},
                        overrides={"train.steps": 1000, "train.checkpoint_every": 10, "train.eval_every": 100})
    out = folder / "out"
    removed = {}

    def remove_worker_mid_trial():
        # Wait until a trial on the worker has written a checkpoint past step 20, then take the node away.
        # (Trials are long enough that the worker's actor, which imports torch first, gets one.)
        deadline = time.time() + 300
        while time.time() < deadline and not removed:
            for attempts in out.glob("trials/*/*/attempts.jsonl"):
                first = json.loads(attempts.read_text().splitlines()[0])
                pointer = attempts.parent / "checkpoints" / "latest.json"
                if first["node_id"] == worker_id and pointer.exists() and json.loads(pointer.read_text())["step"] >= 20:
                    removed["trial"] = str(attempts.parent)
                    removed["at_step"] = json.loads(pointer.read_text())["step"]
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=remove_worker_mid_trial)
    watcher.start()
    # remove_node must run in the main thread: poll here while the search runs in a thread.
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("outcome", run_search(path, out=out, progress_every_s=0)))
    runner.start()
    watcher.join()
    if removed:
        cluster.remove_node(worker)
        cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)  # capacity for the retry
    runner.join()
    records = result["outcome"].records
    nodes = {json.loads(line)["node_id"] for a in out.glob("trials/*/*/attempts.jsonl") for line in a.read_text().splitlines()}
    retried = [json.loads(line) for line in Path(removed["trial"], "attempts.jsonl").read_text().splitlines()] if removed else []
    print(json.dumps({
        "statuses": sorted(r.status for r in records), "nodes": len(nodes), "worker_used": worker_id in nodes,
        "removed": removed, "attempts": retried,
    }))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
