"""Ends the processes of a local Ray when the search driver that started it ends, however it ends.

Ray's own fate sharing ends the GCS and the raylet with the driver, but the raylet's agents and
workers outlive a killed driver for a minute or more. So before it starts Ray, the driver starts this
file as a process of its own session (a `kill -9` of the driver's process group does not reach it),
holding the read end of a pipe, and marks the environment Ray inherits with a token: every Ray
process, trial and data-parallel peer of the search carries it. When the driver ends — normally,
through an exception, a signal or SIGKILL — the pipe closes; this process then sends SIGTERM to every
process carrying the token or descended from one (it notes them every second while the driver lives,
since Ray starts some processes with an environment of their own), and SIGKILL to those still there
after a grace period.

Only the standard library is imported here: the watcher starts in a fraction of a second.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

MARK = "BLOCKFORGE_SEARCH_RAY"  # the environment variable that carries a search's token
GRACE_S = 2.0

_pipe: int | None = None  # the driver's write end; closing it (or dying) lets the watcher act


def start() -> str | None:
    """Start the watcher; returns the token to put in Ray's environment (None where /proc is missing)."""
    global _pipe
    if not Path("/proc/self/environ").exists():
        return None
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    read, write = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != MARK}
    subprocess.Popen([sys.executable, "-S", __file__, token, str(os.getpid())], stdin=read, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
    os.close(read)
    _pipe = write
    return token


def release() -> None:
    """The driver is done with its Ray: the watcher ends whatever of it is left."""
    global _pipe
    if _pipe is not None:
        os.close(_pipe)
        _pipe = None


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process; None if it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[19]))


def marked(token: str, spare: set[int]) -> list[int]:
    """The processes whose environment carries `token`."""
    needle = f"{MARK}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def family(token: str, spare: set[int]) -> dict[int, int]:
    """The marked processes and all their descendants, as pid -> start time.

    Ray gives some of the processes its raylet starts (its dashboard and runtime-env agents) an
    environment of their own, without the mark; they are the raylet's children, so they are found by
    descent. Once a parent dies its children belong to init, so the watcher looks while the driver lives.
    """
    parents: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(entry.name))
                started[int(entry.name)] = stat[1]
    found, todo = {}, [pid for pid in marked(token, spare) if pid in started]
    while todo:
        pid = todo.pop()
        if pid not in found and pid not in spare:
            found[pid] = started[pid]
            todo.extend(parents.get(pid, []))
    return found


def alive(known: dict[int, int]) -> dict[int, int]:
    """Those of `known` (pid -> start time) still running as the same process (a reused pid is another)."""
    out = {}
    for pid, start in known.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start:
            out[pid] = start
    return out


def reap(token: str, spare: set[int], known: dict[int, int] | None = None) -> None:
    """End every process of the search's Ray: the marked ones, their descendants, and those seen before (`known`)."""
    known = dict(known or {})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        targets = {**alive(known), **family(token, spare)}
        known.update(targets)
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_S
        while targets and time.monotonic() < deadline:
            time.sleep(0.1)
            targets = {**alive(known), **family(token, spare)}
        if not targets:
            return


LOOK_EVERY_S = 1.0  # how often the watcher notes the search's processes while the driver lives


def main(token: str, driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is for the driver
    spare = {os.getpid(), driver}
    known: dict[int, int] = {}
    stdin = sys.stdin.buffer.raw
    while True:
        ready, _, _ = select.select([stdin], [], [], LOOK_EVERY_S)
        if ready and not stdin.read(4096):
            break  # the driver never writes: its end closed
        known = {**alive(known), **family(token, spare)}
    reap(token, spare, known)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
