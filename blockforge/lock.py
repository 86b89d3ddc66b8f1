"""One owner per folder: a run folder's `run.lock` (held by the training process, the main rank, while it trains), and
the same lock under other names for a search folder, a prepared set being written, or a node's cached copy of one.

The lock is an exclusive flock on the file, so the kernel releases it when its owner dies, however it
dies; the file also says who owns it (pid, host), for the sentence that refuses a second `train`. A lock
left by a dead process is taken over. Within one process the newest Trainer of a folder takes it over
(a search trial abandoned by Ray, a Trainer never iterated to its end).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from blockforge.errors import FolderInUseError, WriteError
from blockforge.io import read_mapping

LOCK_NAME = "run.lock"
_HELD: dict[Path, "RunLock"] = {}  # the locks this process holds, by resolved path


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


class RunLock:
    """The lock of one run folder (or, named otherwise, of a search folder); `acquire` takes it or refuses, `release`
    gives it back (idempotent)."""

    def __init__(self, run_dir: Path, name: str = LOCK_NAME, doing: str = "training into it"):
        self.path = Path(run_dir) / name
        self.doing = doing  # what the owner does there, for the refusal
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def _refuse(self, owner: dict) -> None:
        who = f"process {owner.get('pid', '?')} on {owner.get('host', 'an unknown host')}"
        raise FolderInUseError(f"{self.path.parent}: is in use by {who}, which is {self.doing}; wait for it to end, "
                               f"or choose another --out (if that process is gone, delete {self.path})")

    def acquire(self, wait_s: float = 0.0) -> "RunLock":
        """Take the lock, or refuse naming its owner; with `wait_s`, wait up to that long for the owner to let go first."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._acquire()
            except FolderInUseError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _acquire(self) -> "RunLock":
        if self.held:
            return self
        key = self.path.resolve()
        previous = _HELD.get(key)
        if previous is not None:  # this process's own, abandoned lock
            previous.release()
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise WriteError(f"{self.path.parent}: cannot create {self.path.name} ({err.strerror}); choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                owner = read_mapping(self.path)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or (owner and not self._stale(owner)):
                    os.close(fd)
                    self._refuse(owner)
                # A file system without flock, and a lock file that is new or left by a dead process: ours.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the owner released (and removed) it between our open and our flock: try again
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(owner) + "\n").encode())
        self.fd = fd
        _HELD[key] = self
        return self

    @staticmethod
    def _stale(owner: dict) -> bool:
        """Whether a lock file's owner is known to be gone (this host, no such process)."""
        pid = owner.get("pid")
        return owner.get("host") == socket.gethostname() and isinstance(pid, int) and not process_alive(pid)

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        if _HELD.get(self.path.resolve()) is self:
            del _HELD[self.path.resolve()]
        try:
            os.unlink(self.path)  # while still holding it: whoever opens it next opens a new file
        except OSError:
            pass
        os.close(fd)
