"""Run by test_split_cluster: checks that SplitCluster's worker nodes share every folder with the driver but
`hidden`, that a replaced worker starts with an empty `hidden`, and that env vars reach its tasks. A script, not a
test module, so its Ray cluster does not meet the test session's Ray. Prints one JSON line of findings."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from split_cluster import SplitCluster, _mnt_ns, _pids  # noqa: E402


@ray.remote(num_cpus=1)
def look(hidden: str, shared: str, write: str | None = None) -> dict:
    hidden_dir = Path(hidden)
    seen = {
        "hidden_files": sorted(os.listdir(hidden_dir)),
        "shared": Path(shared).read_text() if Path(shared).exists() else None,
        "env": os.environ.get("SPLIT_CHECK_TOKEN"),
        "node_id": ray.get_runtime_context().get_node_id(),
        "mnt_ns": os.readlink("/proc/self/ns/mnt"),
    }
    if write:
        (hidden_dir / write).write_text("from the worker")
    return seen


@ray.remote(num_cpus=1, max_retries=0)
def busy() -> None:
    time.sleep(600)  # still running when its node goes away


def on(node_id: str, *args) -> dict:
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(look.options(scheduling_strategy=strategy).remote(*args), timeout=120)


def running(pids: list[int]) -> dict[int, str]:
    """The command lines of those of `pids` that still run (zombies do not)."""
    found = {}
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found[pid] = cmd[:160]
    return found


def in_namespace(mnt_ns: str) -> list[int]:
    # Read while the node runs: a namespace's number is reused once it is freed.
    return [pid for pid in _pids() if _mnt_ns(pid) == mnt_ns]


def outcome(ref) -> str:
    try:
        ray.get(ref, timeout=60)
        return "returned"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def main(folder: Path) -> None:
    hidden, shared = folder / "hidden", folder / "shared.txt"
    shared.write_text("from the driver")
    report, t0 = {"timings": {}}, time.monotonic()
    lap = lambda name: report["timings"].__setitem__(name, round(time.monotonic() - t0, 1))  # noqa: E731

    with SplitCluster(hidden, worker_cpus=2, env={"SPLIT_CHECK_TOKEN": "a=b c"}) as split:
        lap("started")
        marks = [str(split._tmp), split.cluster.address]
        (hidden / "driver.txt").write_text("from the driver")
        first = split.worker_id
        report["first"] = on(first, str(hidden), str(shared), "worker.txt")
        report["first_again"] = on(first, str(hidden), str(shared))  # the worker's own file stays, on its node
        report["driver_sees_worker_file"] = (hidden / "worker.txt").exists()
        report["driver_mnt_ns"] = os.readlink("/proc/self/ns/mnt")
        lap("first worker checked")

        # Replaced mid-task: the task fails with its node, and nothing of the old node survives.
        task = busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(first, soft=False)).remote()
        time.sleep(2)
        old_pids = in_namespace(split.workers[-1].mnt_ns)
        second = split.replace_worker()
        report["replaced"] = {"new_id_differs": second != first, "old_alive": split.node_alive(first),
                              "old_node_pids": len(old_pids), "old_processes_left": running(old_pids),
                              "busy_task": outcome(task)}
        report["second"] = on(second, str(hidden), str(shared))
        lap("replaced and checked")

        old_pids = in_namespace(split.workers[-1].mnt_ns)
        split.kill_worker(graceful=False)  # a node lost outright: the head must still notice
        report["killed"] = {"old_alive": split.node_alive(second), "old_node_pids": len(old_pids),
                            "old_processes_left": running(old_pids)}
        lap("killed outright")
        third = split.add_worker()
        report["third"] = on(third, str(hidden), str(shared))
        report["alive_nodes"] = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        report["head_id"] = split.cluster.head_node.node_id
        lap("added and checked")
    lap("shut down")
    report["left_running"] = [f"{pid}: {cmd}" for pid, cmd in running(_pids()).items()
                              if pid != os.getpid() and any(m in cmd for m in marks)]
    report["hidden_on_disk"] = sorted(os.listdir(hidden))
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
