"""Ends the processes of a local Ray when the search driver that started it ends, however it ends.

Ray's own fate sharing ends the GCS and the raylet with the driver, but the raylet's agents and
workers outlive a killed driver for a minute or more. So before it starts Ray, the driver starts this
file as a process of its own session (a `kill -9` of the driver's process group does not reach it),
holding the read end of a pipe, and marks the environment Ray inherits with a token: every Ray
process, trial and data-parallel peer of the search carries it. When the driver ends — normally,
through an exception, a signal or SIGKILL — the pipe closes; this process then sends SIGTERM to every
process carrying the token, and SIGKILL to those still there after a grace period.

Only the standard library is imported here: the watcher starts in a fraction of a second.
"""

from __future__ import annotations

import os
import secrets
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


def reap(token: str, spare: set[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = marked(token, spare)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = marked(token, spare)
        if not pids:
            return


def main(token: str, driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is for the driver
    while sys.stdin.buffer.read(4096):
        pass  # the driver never writes: this returns when its end closes
    reap(token, spare={os.getpid(), driver})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
