"""The `blockforge` command: inspect, prepare, train, eval, generate, analyze, search, export, convert, schema.

Every subcommand goes through the same load -> resolve -> build path as the Python API; a problem
with a file, a flag or a path is printed as one sentence and exits with status 2. Each subcommand's
flags and its work live in a module of this package; `--set KEY=VALUE` is parsed once, by argparse,
into `Assignment`s (cli.common).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading

from blockforge.errors import BlockforgeError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    from blockforge import __version__
    from blockforge.cli import analyze, convert, evaluate, export, generate, inspect, prepare, schema, search, train

    parser = _Parser(prog="blockforge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"blockforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in (inspect, prepare, train, evaluate, generate, analyze, search, export, convert, schema):
        command.add_parser(sub)
    return parser


# A disk that fills up or a file size limit hit anywhere is the machine's state, not a bug: one sentence too.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # a bad flag (already printed as one line), --help or --version
        return stop.code if isinstance(stop.code, int) else 0
    if threading.current_thread() is threading.main_thread():
        # Past a file size limit (ulimit -f) a write then fails with an OSError, reported below, instead of killing us.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    ends = argv is None and args.command == "search"  # this process is the command: it ends soon after the search did
    if ends:
        from blockforge.cluster import ends_with_command

        ends_with_command()
    try:
        code = args.func(args)
        if ends:
            from blockforge.cli.search import end_process

            end_process(code)
        return code
    except BlockforgeError as err:
        print(f"blockforge: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("blockforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`blockforge inspect ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    except OSError as err:
        if err.errno not in _WRITE_ERRNOS:
            raise
        print(f"blockforge: error: {err.filename or 'a file'}: cannot be written ({err.strerror}); free space there or choose another folder",
              file=sys.stderr)
        return 2
