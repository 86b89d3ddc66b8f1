"""A Ray worker node that does not share one folder with the rest of the machine (used by split_cluster.py).

Run as:  unshare --mount --propagation private -- PYTHON isolated_node.py --gcs ADDRESS --hide PATH --num-cpus N
                                                                           [--env KEY=VALUE ...]

In its own mount namespace it mounts an empty tmpfs over PATH, so this node (its raylet and every Ray worker the
raylet starts: they inherit the namespace) sees a private, empty PATH while the driver and other nodes see the real
one: a node that shares no disk at PATH. It joins the head at ADDRESS on 127.0.0.1, prints one JSON line
{"node_id", "mnt_ns", "pid"} once the node is registered, and stays up until SIGTERM or SIGINT, then stops the
node's processes and exits 0. When its last process exits, the namespace and the tmpfs (with what was written
there) are gone. It also stops if the process that started it dies.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading

# Before Ray is imported: keep Ray on 127.0.0.1, without token auth (as the driver does).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcs", required=True, help="the head's GCS address, host:port")
    parser.add_argument("--hide", required=True, help="the folder this node sees as a private, empty tmpfs")
    parser.add_argument("--num-cpus", type=int, default=1)
    parser.add_argument("--object-store-mib", type=int, default=100)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in this node's environment, so its Ray workers inherit it (repeatable)")
    parser.add_argument("--unset", action="append", default=[], metavar="KEY", help="removed from this node's environment (repeatable)")
    return parser.parse_args()


def hide(path: str) -> None:
    # Refuse to mount in our parent's namespace (unshare execs us, so the parent is whoever started unshare): that
    # would hide the folder from everyone, driver included.
    if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
        sys.exit("isolated_node.py: not in a mount namespace of its own; run it under `unshare --mount "
                 "--propagation private`")
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m,mode=0777", "tmpfs", path], check=True)


def main() -> None:
    args = parse_args()
    parent = os.getppid()
    hide(args.hide)
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"isolated_node.py: --env wants KEY=VALUE, got {item!r}")
        os.environ[key] = value  # before the raylet starts: it and its workers inherit os.environ
    for key in args.unset:
        os.environ.pop(key, None)

    stop = threading.Event()
    # Our own handlers, not Ray's (shutdown_at_exit=False): Ray's SIGTERM handler drains the node first, which only
    # slows the stop, and exits 1.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    import ray._private.node
    import ray._private.parameter
    import ray._private.services

    # As ray.cluster_utils.Cluster.add_node starts a worker node, but in this process (and namespace).
    params = ray._private.parameter.RayParams(
        gcs_address=args.gcs, node_ip_address="127.0.0.1", num_cpus=args.num_cpus, num_gpus=0,
        object_store_memory=args.object_store_mib * 2**20, include_log_monitor=False, node_manager_port=0,
        min_worker_port=0, max_worker_port=0, dashboard_agent_listen_port=None)
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=True)
    try:
        ray._private.services.wait_for_node(node.gcs_address, node.plasma_store_socket_name, 60)
        print(json.dumps({"node_id": node.node_id, "mnt_ns": os.readlink("/proc/self/ns/mnt"), "pid": os.getpid()}),
              flush=True)
        # A timed wait, so the signal handler gets to run. Stop too if whoever started us died without stopping us
        # (we were re-parented): an orphaned node would otherwise run on, joined to nothing.
        while not stop.wait(0.5) and os.getppid() == parent:
            pass
    finally:
        # The raylet first, gracefully: it tells the head it is leaving (the head marks the node dead at once) and
        # stops its workers; wait=True reaps what we started.
        node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)


if __name__ == "__main__":
    main()
