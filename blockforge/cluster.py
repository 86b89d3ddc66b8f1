"""Ray, as every command meets it: started on loopback or joined at an address, shut down, and its own failures (a slow
start, a memory kill) said in one sentence. `blockforge search` and `blockforge prepare` both start Ray here.

A local Ray is started in a thread that lives as long as it (so signals reach the caller's handlers), with a watcher
process (blockforge/reaper.py) that ends every process carrying the caller's environment mark when the caller ends,
however it ends.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading

from blockforge import reaper
from blockforge.errors import BlockforgeError

OBJECT_STORE_BYTES = 256 * 2**20  # trials pass no large objects; the default (30% of RAM) only wastes memory
PROBE_TIMEOUT_S = 5.0  # a cluster's address must accept a connection within this
CONNECT_TIMEOUT_S = 15.0  # ...and Ray must join it within this (ray.init alone waits for minutes)


def ensure_ray(address: str | None) -> bool:
    """Connect to Ray: join `address`, reuse a running local Ray, or start one on loopback. True if started or joined here."""
    if address is None:
        # Before `import ray`: keep a local Ray on 127.0.0.1 and without token auth.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if os.environ.get("BLOCKFORGE_CACHE"):  # trials run in folders of their own: a relative cache would be one per trial
        os.environ["BLOCKFORGE_CACHE"] = os.path.abspath(os.path.expanduser(os.environ["BLOCKFORGE_CACHE"]))
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # snapshot state often: a killed driver loses less
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune's per-trial result files (json, csv, TensorBoard): the ledger and each run folder's metrics hold it all.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    ray = _import_ray()
    if ray.is_initialized():
        return False
    quiet = dict(include_dashboard=False, log_to_driver=False, configure_logging=True)
    if address is not None:
        _join(address, quiet)
        return True
    token = reaper.start()  # before Ray starts: whatever of it outlives this process is ended
    if token is not None:
        os.environ[reaper.MARK] = token  # inherited by every Ray process started from here
    try:
        # address="local": a Ray of its own, even where `ray start` left a cluster ray.init would join.
        _init_ray(address="local", num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES, _node_ip_address="127.0.0.1", **quiet)
    except BaseException:
        stop_ray()
        raise
    finally:
        os.environ.pop(reaper.MARK, None)
    return True


_keeper: threading.Event | None = None  # set by stop_ray: the thread that started Ray may end


def _init_ray(**settings) -> None:
    """ray.init in a thread of its own that lives until stop_ray.

    Not in the main thread: there ray.init puts in a SIGTERM handler that raises SystemExit wherever
    ray.init happens to be, which can crash the interpreter; this way a signal while Ray starts reaches
    the search's handlers (Interrupts), which only note it. The thread outlives the search because Ray
    ties the GCS and the raylet it starts to the life of the thread that started them.
    """
    global _keeper
    import ray

    started, release, outcome = threading.Event(), threading.Event(), {}
    settings = {**settings, "logging_level": "error"}  # its start-up warnings (one about this thread); sentences say what matters

    def keep() -> None:
        try:
            ray.init(**settings)
            logging.getLogger("ray").setLevel(logging.WARNING)
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err
        started.set()
        if "error" not in outcome:
            release.wait()

    threading.Thread(target=keep, name="ray-keeper", daemon=True).start()
    while not started.wait(0.2):
        pass  # the main thread stays free to run signal handlers
    if "error" in outcome:
        raise outcome["error"]
    _keeper = release


def _import_ray():
    """`import ray` with Ray's crash-signal handler off in this process only: it would also catch a SIGTERM
    that arrives while Ray starts and abort, where the search stops cleanly (Interrupts). Ray reads the
    setting once, when imported; the processes Ray starts do not inherit it, and keep theirs."""
    if "ray" not in sys.modules:
        saved = os.environ.get("RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
        os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
        try:
            import ray  # noqa: F401
        finally:
            if saved is None:
                os.environ.pop("RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
            else:
                os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = saved
    return sys.modules["ray"]


def stop_ray() -> None:
    """Shut down the Ray this process started or joined; the watcher ends any process of it that lingers."""
    import ray

    global _keeper
    try:
        ray.shutdown()
    finally:
        if _keeper is not None:
            _keeper.set()
            _keeper = None
        reaper.release()


def probe_address(address: str) -> None:
    """One sentence, within seconds, when nothing accepts a connection at `address` (host:port or ray://host:port)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # 'auto' and the like: Ray finds the address itself, and CONNECT_TIMEOUT_S bounds it
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except TimeoutError:
        raise BlockforgeError(f"--address {address}: nothing answers within {PROBE_TIMEOUT_S:g} s; check the address, or start the cluster with `ray start --head`") from None
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise BlockforgeError(f"--address {address}: cannot connect ({reason}); check the address, or start the cluster with `ray start --head`") from None


# Joins the cluster from a short-lived process first: ray.init can wait for minutes on an address that
# accepts connections but is no Ray (or a stale 'auto'), logging every attempt; a process can be ended.
_JOIN_CHECK = "import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, logging_level='error')"


def _join(address: str, settings: dict) -> None:
    """ray.init(address=...), once a short-lived process has joined the cluster within CONNECT_TIMEOUT_S."""
    try:
        check = subprocess.run([sys.executable, "-c", _JOIN_CHECK, address], capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BlockforgeError(f"--address {address}: no Ray cluster answered within {CONNECT_TIMEOUT_S:g} s; check that the address is the head node's (port 6379 by default)") from None
    if check.returncode != 0:
        lines = [line for line in check.stderr.strip().splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else f"exit status {check.returncode}")
        raise BlockforgeError(f"--address {address}: cannot join the Ray cluster ({reason.strip()}); start it with `ray start --head` or check the address")
    _init_ray(address=address, **settings)
