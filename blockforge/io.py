"""Atomic file writes (temp file in the same folder, fsync, rename): a killed run never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` then rename the temp file over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def writable_folder(path: str | os.PathLike, what: str) -> Path:
    """Create `path` and check a file can be written there; else one sentence naming it (what: 'the run')."""
    from blockforge.errors import BlockforgeError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise BlockforgeError(f"{path}: cannot write {what} there ({err.strerror or err}); choose another --out") from None
    return path
