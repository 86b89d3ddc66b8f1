"""Files: atomic writes (temp file in the same folder, fsync, rename), so a killed run never leaves half a
file; write failures (a full disk, a file size limit) as one sentence naming the folder; JSON records
read back with one sentence when they are damaged."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from blockforge.errors import CorruptFolderError, WriteError

# Errors of reading, not writing, when they come out of a write callback (a source file that is gone).
_READ_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR}
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def write_failure(err: BaseException) -> str | None:
    """Why `err` means a file could not be written ('No space left on device'), or None if it is something else."""
    if isinstance(err, WriteError):
        return getattr(err, "reason", None)  # said again by the outer block, which knows what was being written
    if isinstance(err, OSError):
        if err.errno in _READ_ERRNOS:
            return None
        if err.errno is None:  # numpy: "N requested and M written"
            return "only part of it was written: the disk is full or a file size limit was reached"
        return err.strerror or str(err)
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return None
    if isinstance(err, SafetensorError) and "I/O error" in str(err):
        return str(err).split("I/O error:", 1)[1].split(" (os error")[0].strip()
    # Libraries written in Rust (tokenizers) raise a plain Exception that ends with the OS error's number.
    code = re.search(r"\(os error (\d+)\)", str(err))
    if code is not None and int(code.group(1)) in _WRITE_ERRNOS:
        return os.strerror(int(code.group(1)))
    return None


@contextlib.contextmanager
def writes_into(folder: str | os.PathLike, what: str, fix: str = "free space there or choose another folder") -> Iterator[None]:
    """Turn a failed write inside the block into one WriteError sentence naming `folder` (what: 'the checkpoint').

    Blocks nest: the outermost one words the sentence.
    """
    try:
        yield
    except Exception as err:
        reason = write_failure(err)
        if reason is None:
            raise
        failure = WriteError(f"{folder}: cannot write {what} ({reason}); {fix}")
        failure.folder, failure.what, failure.reason = Path(folder), what, reason  # for callers that know a better fix
        raise failure from None


@functools.cache
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def plain_file_mode(tmp: str) -> None:
    """Give a mkstemp file (0600) the mode an ordinary new file gets, so others on shared storage can read it."""
    os.chmod(tmp, 0o666 & ~_umask())


class FolderInTheWay(CorruptFolderError):
    """A folder where a file is written (a report, a record): no file can be renamed over it."""


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` then rename the temp file over `path`; the temp file never outlives a failure. A folder at
    `path` is one sentence naming it, before anything is written."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():  # a link is replaced, whatever it points to
        raise FolderInTheWay(f"{path}: is a folder where a file belongs ({path.name} is written there); move the folder aside or remove it")
    with writes_into(path.parent, path.name):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            plain_file_mode(tmp)
            write(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:  # also on KeyboardInterrupt or SystemExit (a second Ctrl-C, SIGTERM)
            if os.path.exists(tmp):
                os.unlink(tmp)


def remove_leftover_temporaries(folder: str | os.PathLike) -> None:
    """Remove the temporary files atomic_write leaves in `folder` when a process is killed mid-write (`.NAME.*.tmp`).

    Only for a folder this process owns (a locked run or search folder): another writer's file would go too."""
    for leftover in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if leftover.is_file():
                leftover.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures are written to files, never shown (no screen is assumed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(rows: int = 1, columns: int = 1, **kwargs):
    """A matplotlib figure and its axes (`Figure.subplots` takes the rest of the arguments; `figsize` the figure's), made
    without pyplot: no backend is chosen for the process, so a notebook shows the figure inline and a report writes it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(rows, columns, **kwargs)


def saved(fig, path: str | os.PathLike | None, dpi: int = 110):
    """`fig` written as a PNG to `path` (when given); the figure itself, for a caller that shows it."""
    if path is not None:
        save_png(fig, path, dpi=dpi)
    return fig


def save_png(figure, path: str | os.PathLike, dpi: int = 120) -> None:
    """A matplotlib figure written as a PNG atomically (the temporary name has no .png suffix, so the format is named)."""
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi))


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """A JSON file's data; a missing, unreadable or cut-off file is one CorruptFolderError sentence ending in `fix`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CorruptFolderError(f"{path}: is missing; {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CorruptFolderError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err}); {fix}") from None
    try:
        return json.loads(text)
    except ValueError as err:  # JSONDecodeError, and numbers too long to convert
        reason = "it is empty" if not text.strip() else f"{err.msg} at line {err.lineno}" if hasattr(err, "lineno") else str(err)
        raise CorruptFolderError(f"{path}: is not valid JSON ({reason}); {fix}") from None


def read_mapping(path: str | os.PathLike) -> dict:
    """A JSON object from `path`, or {} when it is missing, unreadable or not one: for files that only help (a lock's
    owner, a record of checksums already computed), where nothing is lost by starting without them."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def writable_folder(path: str | os.PathLike, what: str) -> Path:
    """Create `path` and check a file can be written there; else one sentence naming it (what: 'the run')."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise WriteError(f"{path}: cannot write {what} there ({err.strerror or err}); choose another --out") from None
    return path
