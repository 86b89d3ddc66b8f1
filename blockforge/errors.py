"""User-facing errors: each carries one sentence that names the file, the key path and the fix."""

import difflib
import json
import sys
from typing import Any, Iterable


class BlockforgeError(Exception):
    """An error caused by user input (a file, a flag, a path); the CLI prints it as one line."""

    exit_code = 2


class SpecError(BlockforgeError, ValueError):
    """A recipe, search file or dotted override that cannot be turned into a valid spec."""

    def __init__(self, message: str, *, path: str = "", file: str | None = None):
        self.message = message
        self.path = path
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        where = ": ".join(part for part in (self.file, self.path) if part)
        return f"{where}: {self.message}" if where else self.message

    def given_by(self, assignments) -> "SpecError":
        """The same error, its key path marked with the --set (KEY, VALUE) that gave the value, when one did: the
        file named does not hold that value."""
        if self.file == "--set":  # already said of the --set itself
            return self
        key = self.path.rsplit(": ", 1)[-1]
        for name, value in reversed(list(assignments or ())):  # the last --set of a key is the one that stands
            if key == name or key.startswith((f"{name}.", f"{name}[")):
                shown = value if isinstance(value, str) else json.dumps(value, default=str)
                return SpecError(self.message, path=f"{self.path} (from --set {name}={shown})", file=self.file)
        return self

    def located(self, file: str | None) -> "SpecError":
        """The same error, attributed to `file` unless it already names one."""
        if self.file is not None or file is None:
            return self
        return SpecError(self.message, path=self.path, file=file)


class DataError(BlockforgeError):
    """Training or evaluation data that cannot be found, read or tokenized."""


class CorruptFolderError(BlockforgeError):
    """A run, checkpoint or export folder whose files are missing, damaged, or do not belong to its spec."""


class FolderInUseError(BlockforgeError):
    """A run folder that another live process is training into."""


class WriteError(BlockforgeError, OSError):
    """A file that could not be written (a full disk, a file size limit, a read-only folder)."""


class SearchInterrupted(BlockforgeError):
    """A search stopped by a signal (SIGTERM, Ctrl-C) before it finished: `search` is its view so far; resuming it
    continues it."""

    def __init__(self, message: str, search=None, signal: int | None = None):
        super().__init__(message)
        self.search, self.signal = search, signal


def warn(message: str) -> None:
    """One line on stderr for something the user should know but that does not stop the work."""
    print(f"blockforge: warning: {message}", file=sys.stderr)


def unknown_choice_message(value: str, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    hint = difflib.get_close_matches(value, allowed, n=1)
    did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
    return f"unknown value '{value}'{did_you_mean}; choose one of: {', '.join(allowed)}"


def unknown_key_message(key: Any, known: Iterable[str]) -> str:
    known = list(dict.fromkeys(known))  # each once, in order (a search file's keys and its recipe's overlap)
    hint = difflib.get_close_matches(str(key), known, n=1)
    did_you_mean = f"did you mean '{hint[0]}'? " if hint else ""
    return f"unknown key; {did_you_mean}known keys here: {', '.join(known)}"

