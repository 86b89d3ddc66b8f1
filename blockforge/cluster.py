"""Ray, as every command meets it: started on loopback or joined at an address, shut down, and its own failures (a slow
start, a memory kill) said in one sentence. `blockforge search` and `blockforge prepare` both start Ray here.

A local Ray is started in a thread that lives as long as it (so signals reach the caller's handlers), with a watcher
process (blockforge/reaper.py) that ends every process carrying the caller's environment mark when the caller ends,
however it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from blockforge import reaper
from blockforge.errors import BlockforgeError, warn

OBJECT_STORE_BYTES = 256 * 2**20  # trials pass no large objects; the default (30% of RAM) only wastes memory
PROBE_TIMEOUT_S = 5.0  # a cluster's address must accept a connection within this
CONNECT_TIMEOUT_S = 15.0  # ...and Ray must join it within this (ray.init alone waits for minutes)


# Settings Ray and Ray Tune read from the environment that blockforge sets or relies on, and what each accepts. Ray reads
# its own as it is imported: a number it cannot read crashes the process (SIGSEGV, no word of why), a flag other than 1 or
# true is false and an auth mode it does not know is none; Tune raises on a number it cannot read. Checked before `import ray`.
_NUMBER = r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"
_FLAG = ("0", "1", "true", "false")


def _number_in(low: float, high: float = float("inf")):
    return lambda text: re.fullmatch(_NUMBER, text) is not None and low <= float(text) <= high


RAY_SETTINGS = {
    "RAY_memory_usage_threshold": (_number_in(0, 1), "a fraction of a node's memory from 0 to 1, above which Ray kills a worker"),
    "RAY_memory_monitor_refresh_ms": (lambda t: re.fullmatch(r"\+?\d+", t) is not None, "a whole number of milliseconds, 0 or more "
                                      "(0: no memory monitor)"),
    "RAY_worker_niceness": (lambda t: re.fullmatch(r"[+-]?\d+", t) is not None and -20 <= int(t) <= 19, "a nice level from -20 to 19"),
    "RAY_AUTH_MODE": (lambda t: t.lower() in ("disabled", "token"), "disabled or token"),
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": (lambda t: t.lower() in _FLAG, "1 or 0 (true or false)"),
    "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": (lambda t: t.lower() in _FLAG, "1 or 0 (true or false)"),
    "RAY_AIR_NEW_OUTPUT": (lambda t: t in ("0", "1"), "0 or 1"),
    "TUNE_GLOBAL_CHECKPOINT_S": (lambda t: t == "auto" or _number_in(0)(t), "a number of seconds, or auto"),
    "TUNE_WARN_THRESHOLD_S": (_number_in(0), "a number of seconds"),
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": (lambda t: t in ("0", "1"), "0 or 1"),
}


def check_ray_environment() -> None:
    """Each of RAY_SETTINGS in the environment holds a value Ray (or Tune) reads as it is meant, else one sentence naming it."""
    for name, (accepts, what) in RAY_SETTINGS.items():
        value = os.environ.get(name)
        if value is not None and not accepts(value):
            raise BlockforgeError(f"{name}={value!r} in the environment is not {what}, which Ray reads there (a value it cannot read "
                                  f"crashes it, or is taken for another); set {name} to one, or unset it")


def ensure_ray(address: str | None) -> bool:
    """Connect to Ray: join `address`, reuse a running local Ray, or start one on loopback. True if started or joined here."""
    ray = _ray_settings(address)
    if ray.is_initialized():
        return False
    if address is not None:
        _join(address, QUIET)
        return True
    _start_here()
    return True


QUIET = dict(include_dashboard=False, log_to_driver=False, configure_logging=True)


def _ray_settings(address: str | None):
    """The environment Ray and Tune read, set and checked, then `import ray` (its module)."""
    if address is None:
        # Before `import ray`: keep a local Ray on 127.0.0.1 and without token auth.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if os.environ.get("BLOCKFORGE_CACHE"):  # trials run in folders of their own: a relative cache would be one per trial
        os.environ["BLOCKFORGE_CACHE"] = os.path.abspath(os.path.expanduser(os.environ["BLOCKFORGE_CACHE"]))
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # snapshot state often: a killed driver loses less
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Tune warns of any of its steps slower than half a second (a callback writing the live view's files): noise to a search's
    # user, who can change none of it; only a step slower than a minute is said
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "60")
    # Tune's per-trial result files (json, csv, TensorBoard): the ledger and each run folder's metrics hold it all.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Tune gives its trial processes this setting; Ray's own workers have it too, so a trial may take one (search/run/slots.py)
    os.environ.setdefault("PL_DISABLE_FORK", "1")
    check_ray_environment()
    return _import_ray()


def _start_here() -> None:
    """Start a local Ray on loopback, its processes marked for the reaper."""
    global _started_env
    token = reaper.start()  # before Ray starts: whatever of it outlives this process is ended
    environment = dict(os.environ)
    if token is not None:
        environment[reaper.MARK] = os.environ[reaper.MARK] = token  # inherited by every Ray process started from here
    try:
        # address="local": a Ray of its own, even where `ray start` left a cluster ray.init would join.
        _start_local(address="local", num_cpus=os.cpu_count(), object_store_memory=OBJECT_STORE_BYTES, _node_ip_address="127.0.0.1", **QUIET)
        _started_env = environment
    except BaseException:
        stop_ray()
        raise
    finally:
        os.environ.pop(reaper.MARK, None)


class RayStart:
    """A local Ray starting in a thread of its own while its caller does other work (a search's memory plan and its
    checks); joining a cluster, or a Ray this process already has, waits for `wait` (ensure_ray then)."""

    def __init__(self, address: str | None):
        self.address, self.taken, self._thread, self._outcome = address, False, None, {}
        if address is None and not _ray_settings(None).is_initialized():
            self._thread = threading.Thread(target=self._start, name="ray-start", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        try:
            _start_here()
        except BaseException as err:  # handed to the waiting thread
            self._outcome["error"] = err

    def wait(self) -> bool:
        """ensure_ray's answer: True if started or joined here; raises what starting raised."""
        self.taken = True
        if self._thread is None:
            return ensure_ray(self.address)
        self._finished()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return True

    def abandon(self) -> None:
        """For a caller that stopped before it took the Ray (a refusal): the start is waited for, and Ray stopped."""
        if self.taken or self._thread is None:
            return
        self.taken = True
        self._finished()
        if "error" not in self._outcome:
            stop_ray()

    def _finished(self) -> None:
        while self._thread.is_alive():
            self._thread.join(0.2)  # the main thread stays free to run signal handlers


_started_env: dict[str, str] | None = None  # the environment of the local Ray ensure_ray started, until stop_ray


def started_environment() -> dict[str, str] | None:
    """The environment every process of the local Ray this process started (and has not stopped) inherited, its workers
    included; None for a Ray joined at an address or started otherwise."""
    return _started_env


START_ATTEMPTS = 3  # Ray waits 30 s (its own, fixed) for its node to register; a loaded machine gets this many of those
START_PAUSE_S = 5.0  # ...with this pause between them


def _start_local(**settings) -> None:
    """Start a local Ray, again after a start that timed out (a loaded machine, an agent slow to import its packages):
    Ray's own allowance is fixed at 30 s, so the allowance here is START_ATTEMPTS of them. A start that never succeeds,
    or fails otherwise, is one sentence naming Ray's log folder and the likely causes."""
    import time

    import ray

    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            _init_ray(**settings)
            return
        except Exception as err:  # Ray raises a bare Exception for a start that timed out
            timed_out = "timed out during startup" in str(err)
            with contextlib.suppress(Exception):
                ray.shutdown()
            if timed_out and attempt < START_ATTEMPTS:
                warn(f"Ray's local node did not start within its 30 s (attempt {attempt} of {START_ATTEMPTS}, {_load()}); trying again")
                time.sleep(START_PAUSE_S)
                continue
            raise BlockforgeError(start_failure(err, attempt)) from None


def start_failure(err: BaseException, attempts: int) -> str:
    """One sentence for a local Ray that did not start: what Ray said, where its logs are, and what usually causes it."""
    said = " ".join(str(err).split()) or type(err).__name__
    if "timed out during startup" in said:
        what = f"Ray's local node did not start within 30 s, {attempts} time(s) ({_load()})"
    else:
        what = f"Ray did not start ({said.rstrip('.')})"
    return (f"{what}; its logs are in {_log_folder()}. Usually the machine is too loaded, short of memory or of /dev/shm, or a "
            "package installed beside Ray is slow to import in Ray's agents; try again when it is quieter, or start Ray yourself "
            "(`ray start --head`) and pass --address auto")


def _load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "load unknown"


def _log_folder() -> str:
    """Where Ray's session logs are (RAY_TMPDIR, else the system's temporary folder, then ray/session_latest/logs)."""
    import tempfile

    root = os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "ray")
    return os.path.join(root, "session_latest", "logs")


# ---- Ray's failures of a running trial --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialFailure:
    """Why Ray ended a trial's process: a kill by its memory monitor, a lost node or worker, or an error of its own."""

    kind: str  # memory | lost | error
    node: str  # the node's address, where Ray says it
    used_gb: float | None = None  # memory: what the node had in use, and its limit, when Ray killed the trial
    limit_gb: float | None = None
    threshold: float | None = None  # memory: the fraction of the limit Ray kills above
    trial_gb: float | None = None  # memory: the largest trial process among the node's top users, as Ray listed them
    said: str = ""  # the exception's first line

    def sentence(self, needs_gib: float | None = None, at_once: int | None = None) -> str:
        """What happened and what to change (`needs_gib`: the trial's memory plan; `at_once`: trials running on the search)."""
        if self.kind != "memory":
            where = f" on node {self.node}" if self.node else ""
            return f"its process or node was lost{where} ({self.said}); a cause outside the trial, so a resume trains it again"
        had = f"the node had {self.used_gb:.2f} of {self.limit_gb:.2f} GB in use" if self.used_gb is not None else "the node was short of memory"
        limit = f", above Ray's kill threshold of {self.threshold:.0%} of it" if self.threshold is not None else ""
        used = f"; a trial's process used up to {self.trial_gb:.2f} GB" if self.trial_gb is not None else ""
        plan = (f"{'; its' if not used else ' (its'} memory plan: {_size(needs_gib)} of weights, optimizer state and activations"
                f"{')' if used else ''}") if needs_gib is not None else ""
        many = f", with {at_once} trial(s) of the search running" if at_once else ""
        return (f"killed by Ray's memory monitor on node {self.node or '?'}: {had}{limit}{used}{plan}{many}; run fewer trials at once "
                "(--max-concurrent), or give each more of a node (resources.cpu or resources.gpu), then resume")


def _size(gib: float) -> str:
    return f"{gib:.2f} GiB" if gib >= 1 else f"{gib * 1024:.0f} MiB"


def trial_failure(err: BaseException | None) -> TrialFailure:
    """What a trial's exception (as Ray Tune holds it) says of why it ended."""
    import re

    text = str(err or "")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__ if err else "no error kept")
    names = {type(e).__name__ for e in _chain(err)}
    node = re.search(r"IP: ([0-9a-fA-F.:]+)", text)
    if "OutOfMemoryError" in names or "running low on memory" in text:
        used = re.search(r"was ([0-9.]+)GB used / ([0-9.]+)GB limit", text)
        threshold = re.search(r"threshold of \d+B \(([0-9.]+)% of", text)
        trials = [float(gb) for gb in re.findall(r"^\s*\d+\s+([0-9.]+)\s+ray::ImplicitFunc", text, flags=re.M)]
        return TrialFailure("memory", node.group(1) if node else "", float(used.group(1)) if used else None,
                            float(used.group(2)) if used else None, float(threshold.group(1)) / 100 if threshold else None,
                            max(trials) if trials else None, first)
    lost = {"NodeDiedError", "ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError"}
    return TrialFailure("lost" if names & lost else "error", node.group(1) if node else "", said=first[:200])


def _chain(err: BaseException | None):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__


class TrialFailures(logging.Filter):
    """Ray Tune logs every failed trial task with Ray's traceback; here that record is kept (by trial id, for the sentence
    the search writes of it) and not shown, so no Ray traceback reaches a terminal or a notebook. A memory kill Tune will
    retry is said in one line."""

    LOGGER = "ray.tune.execution.tune_controller"

    def __init__(self):
        super().__init__()
        self.failures: dict[str, TrialFailure] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Trials did not complete"):
            return False  # Tune's last word on failed trials: the ledger names each, with its reason
        if not message.startswith("Trial task failed for trial"):
            return True
        trial_id = message.rsplit(" ", 1)[-1].rsplit("_", 1)[-1]
        failure = trial_failure(record.exc_info[1] if record.exc_info else None)
        if failure.kind == "memory" and not any(f.kind == "memory" for f in self.failures.values()):
            warn(f"a trial was {failure.sentence().split(';')[0]}; Ray Tune runs such a trial again while it has retries left, "
                 "and the search's end says which failed")
        self.failures[trial_id] = failure
        return False

    def __enter__(self) -> "TrialFailures":
        global _failures
        for name in (self.LOGGER, "ray.tune.tune"):
            logging.getLogger(name).addFilter(self)
        _failures = self
        return self

    def __exit__(self, *exc) -> None:
        global _failures
        for name in (self.LOGGER, "ray.tune.tune"):
            logging.getLogger(name).removeFilter(self)
        _failures = None


_failures: TrialFailures | None = None  # the running search's, while Tune runs it


def failure_of(trial_id: str) -> TrialFailure | None:
    """Why Ray ended trial `trial_id` of the search running in this process, as Tune logged it (None: not known)."""
    return _failures.failures.get(trial_id) if _failures is not None else None


def ray_failure(err: BaseException) -> TrialFailure | None:
    """`err` as a Ray failure (an exception of Ray's own, anywhere in its chain), else None."""
    if not any(type(e).__module__.startswith("ray.") for e in _chain(err)):
        return None
    return trial_failure(err)


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

    global _keeper, _started_env
    _started_env = None
    try:
        ray.shutdown()
    finally:
        if _keeper is not None:
            _keeper.set()
            _keeper = None
        reaper.release()


_ENDS_WITH_COMMAND = threading.Event()  # set in the `blockforge` process itself: it ends as soon as it has answered
_stopping: threading.Thread | None = None  # a stop_ray_behind under way


def ends_with_command() -> None:
    """This process is a `blockforge` command and ends once it has answered: a Ray stopping behind it (stop_ray_behind)
    is not waited for. What is left of it ends with the process: the GCS and the raylet are tied to the thread that started
    them, Ray's workers to the raylet, and the reaper ends any process of it still running."""
    _ENDS_WITH_COMMAND.set()


def leave_ray() -> None:
    """Before the process ends: a stop under way is left to end with it, and Ray's own exit handler, which would stop
    Ray a second time, is dropped."""
    if _stopping is not None and _stopping.is_alive() and "ray" in sys.modules:
        import atexit

        atexit.unregister(sys.modules["ray"]._private.worker.shutdown)


def stop_ray_behind():
    """stop_ray in a thread of its own, for a caller with other work meanwhile (a search's reports); returns the wait for it,
    which raises what stop_ray raised (and returns at once in a process that ends with its command: ends_with_command)."""
    global _stopping
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            stop_ray()
        except BaseException as err:  # handed to the waiting thread
            failed.append(err)

    thread = _stopping = threading.Thread(target=stop, name="ray-stop", daemon=True)
    thread.start()

    def wait() -> None:
        if _ENDS_WITH_COMMAND.is_set():
            return
        thread.join()
        if failed:
            raise failed[0]

    return wait


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
