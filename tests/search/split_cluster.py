"""A Ray cluster on one machine whose nodes do not share one folder: for tests of searches without a shared disk.

    with SplitCluster(hidden=tmp_path / "out", worker_cpus=2, env={"AWS_ENDPOINT_URL": ...}) as split:
        ...  # the driver (on a 0-CPU head, so every task runs on the worker) writes under `hidden`;
        split.replace_worker()  # the worker node is lost; a fresh one, with an empty `hidden`, takes its place

The head node runs in this process's namespace and sees the real `hidden`. Each worker node runs
isolated_node.py under `unshare --mount` and sees `hidden` as a private, empty tmpfs, gone with the node;
the rest of the filesystem (Ray's session folder, the code, the caches) is shared. Needs root on Linux:
tests skip unless SplitCluster.available(). Ray must not be initialised in this process already.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Before Ray is imported: keep Ray on 127.0.0.1, without token auth.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

NODE_SCRIPT = Path(__file__).with_name("isolated_node.py")
UNSHARE = ["unshare", "--mount", "--propagation", "private", "--"]
OBJECT_STORE = 100 * 2**20


@dataclass
class _Worker:
    proc: subprocess.Popen
    node_id: str
    mnt_ns: str  # its mount namespace, e.g. "mnt:[4026532301]": every process of the node, and only those, has it
    ns_fd: int  # held open so that the namespace, and so its number, is not freed and reused before we sweep it
    log: Path


class SplitCluster:
    """hidden: the folder worker nodes do not share with the driver; worker_cpus: CPUs of each worker node; env: set
    in each worker node's environment, so its Ray workers see it; timeout_s: for a node to come up or be declared
    dead."""

    def __init__(self, hidden: Path, worker_cpus: int = 2, env: dict | None = None, timeout_s: float = 60, unset: tuple = ()):
        self.hidden = Path(hidden).resolve()
        self.worker_cpus = worker_cpus
        self.env = dict(env or {})
        self.unset = tuple(unset)  # variables a worker node lacks although this process has them (a node set up without them)
        self.timeout_s = timeout_s
        self.workers: list[_Worker] = []  # live worker nodes, oldest first
        self.cluster: Cluster | None = None
        self._tmp: Path | None = None
        self._started = 0

    @staticmethod
    def available() -> bool:
        """Whether this machine can run it: root on Linux, with a working `unshare --mount`."""
        if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("unshare") is None:
            return False
        try:
            return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    @property
    def worker_id(self) -> str:
        """The node id of the current (newest) worker node."""
        return self.workers[-1].node_id

    def __enter__(self) -> SplitCluster:
        self.hidden.mkdir(parents=True, exist_ok=True)
        # A temp dir of our own (short: Ray's socket paths must stay under 108 characters) keeps this cluster's
        # sessions, logs and sockets apart from any other Ray on the machine, and names our processes in `ps`.
        self._tmp = Path(tempfile.mkdtemp(prefix="splitray_", dir="/tmp"))
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 0, "object_store_memory": OBJECT_STORE, "temp_dir": str(self._tmp),
                # A node killed outright is declared dead after ~3 s rather than the default ~30 s.
                "_system_config": {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
                                   "health_check_failure_threshold": 3}})
            # Connected before any worker node exists: the driver must attach to the head's raylet, never to a
            # worker that a test will take away.
            ray.init(address=self.cluster.address, log_to_driver=False, logging_level="warning")
            self.add_worker()
        except BaseException:
            self.__exit__(*sys.exc_info())  # tidy up; the start-up error is the one raised
            raise
        return self

    def __exit__(self, *exc) -> None:
        # Every step runs even if one before it fails: nothing of ours may outlive the with-block.
        steps = [ray.shutdown, *[lambda w=w: self._stop(w, graceful=True, wait_dead=False) for w in self.workers]]
        if self.cluster is not None:
            steps.append(self.cluster.shutdown)
        errors = []
        for step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        self.workers, self.cluster = [], None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if errors and exc[0] is None:
            raise errors[0]

    def add_worker(self) -> str:
        """Start one more isolated worker node (a new, empty tmpfs at `hidden`); return its node id once the head
        lists it alive."""
        self._started += 1
        log = self._tmp / f"worker{self._started}"
        cmd = [*UNSHARE, sys.executable, str(NODE_SCRIPT), "--gcs", self.cluster.address, "--hide", str(self.hidden),
               "--num-cpus", str(self.worker_cpus), *[f"--env={k}={v}" for k, v in self.env.items()], *[f"--unset={k}" for k in self.unset]]
        # stdout and stderr to files, not pipes: nobody reads the node's output after start-up, and a full pipe
        # would block it. A session of its own: a Ctrl-C at the terminal reaches us, not the node directly.
        with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + self.timeout_s
        info, ns_fd = None, None
        while ns_fd is None:
            # Whole lines only: the last piece may still be being written.
            lines = log.with_suffix(".out").read_text().split("\n")[:-1]
            info = next((json.loads(x) for x in lines if x.startswith('{"node_id"')), None)
            try:
                if info is not None:
                    ns_fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY)
            except OSError:  # it died just now
                pass
            if ns_fd is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    self._kill_tree(proc, _mnt_ns(proc.pid))
                    raise RuntimeError(f"isolated worker node did not start (exit {proc.returncode}); its stderr:\n"
                                       + self._tail(log))
                time.sleep(0.1)
        worker = _Worker(proc, info["node_id"], info["mnt_ns"], ns_fd, log)
        self.workers.append(worker)
        self._wait_for(worker, alive=True)
        return worker.node_id

    def kill_worker(self, graceful: bool = True) -> str:
        """Stop the current worker node (all its processes) without replacing it; return once the head lists it
        dead. graceful=False kills every process of it at once (a node lost outright); otherwise its raylet is
        asked to stop first (a node taken away). Returns the dead node's id."""
        worker = self.workers[-1]
        self._stop(worker, graceful=graceful, wait_dead=True)
        return worker.node_id

    def replace_worker(self, graceful: bool = True) -> str:
        """Kill the current worker node (as kill_worker) and start a fresh one with an empty `hidden`; return the
        new node's id."""
        self.kill_worker(graceful=graceful)
        return self.add_worker()

    def node_alive(self, node_id: str) -> bool | None:
        """What the head says of a node: True alive, False dead, None unknown."""
        return next((n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id), None)

    # -- inside --

    def _stop(self, worker: _Worker, graceful: bool, wait_dead: bool) -> None:
        self.workers.remove(worker)
        if graceful:
            worker.proc.send_signal(signal.SIGTERM)
            try:
                worker.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            self._kill_tree(worker.proc, worker.mnt_ns)
        finally:
            os.close(worker.ns_fd)  # the namespace, with its tmpfs, goes now
        if wait_dead:
            self._wait_for(worker, alive=False)

    @staticmethod
    def _kill_tree(proc: subprocess.Popen, mnt_ns: str | None, timeout_s: float = 20) -> None:
        """SIGKILL whatever of a node still runs: its node process, and every process in its mount namespace (the
        raylet, agents and Ray workers, which the node process may have left orphaned)."""
        if mnt_ns == _mnt_ns(os.getpid()):
            mnt_ns = None  # not unshared yet (or ever): our own namespace is everyone's, never sweep it
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        deadline = time.monotonic() + timeout_s
        while mnt_ns is not None:
            left = [pid for pid in _pids() if _mnt_ns(pid) == mnt_ns]
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of an isolated worker node survive SIGKILL: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def _wait_for(self, worker: _Worker, alive: bool) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self.node_alive(worker.node_id) is not alive:
            if alive and worker.proc.poll() is not None:
                raise RuntimeError(f"isolated worker node {worker.node_id} exited (exit {worker.proc.returncode}); "
                                   f"its stderr:\n{self._tail(worker.log)}")
            if time.monotonic() > deadline:
                state = "alive" if alive else "dead"
                raise TimeoutError(f"the head does not list worker node {worker.node_id} as {state} after "
                                   f"{self.timeout_s} s; its stderr:\n{self._tail(worker.log)}")
            time.sleep(0.2)

    @staticmethod
    def _tail(log: Path, chars: int = 3000) -> str:
        try:
            return log.with_suffix(".err").read_text()[-chars:]
        except OSError:
            return "(no stderr file)"


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:  # gone, or a zombie (no namespace any more)
        return None
