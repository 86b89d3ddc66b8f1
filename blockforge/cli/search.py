"""`blockforge search`: run (or resume) a search file on Ray Tune + Optuna and print its summary."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from blockforge.cli.common import add_report_to, add_set, positive_int

    p = sub.add_parser("search", help="search alpha (or any dotted keys) per cell on Ray Tune + Optuna")
    p.add_argument("file", help="a search YAML file (see searches/)")
    p.add_argument("--out", help="the search folder (default: runs/search-<name>): a local path, or a URI such as s3://bucket/prefix "
                                 "(any pyarrow or installed fsspec filesystem; credentials from the environment)")
    p.add_argument("--address", help="join a Ray cluster ('auto' or ray://host:port); default: start a local Ray")
    p.add_argument("--resume", nargs="?", const=True, default=False, choices=[True, "auto"], metavar="auto", help="continue the search in --out; --resume=auto: continue it if --out holds one, else start it "
                                        "(for jobs that may run again: a Slurm requeue, a restarted pod)")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as many as resources allow)")
    p.add_argument("--plan", action="store_true", help="print the compute plan (parameters, FLOPs, worst-case trials) and stop: no Ray, no training")
    p.add_argument("--gpu", help="with --plan: a GPU type for GPU-hours and wall time (A100, H100, H200, L40S, B200, MI300X)")
    p.add_argument("--gpus", type=positive_int, help="with --plan --gpu: GPUs the search has (default: one trial's)")
    p.add_argument("--mfu", type=float, default=None, help="with --plan --gpu: the fraction of the dense bf16 peak reached (default 0.4)")
    add_set(p, help="override a key of the search file (trials_per_cell=4, steps=60, confirm.seeds=3, cells.model.depth=[4,8]) or of its "
                    "base recipe (train.lr=0.003), by dotted key (repeatable); a resume takes the same ones")
    add_report_to(p, "every trial")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from blockforge.errors import BlockforgeError
    from blockforge.search.run.driver import nothing_finished, run_search

    if not args.plan and (args.gpu or args.gpus or args.mfu is not None):
        raise BlockforgeError("--gpu, --gpus and --mfu describe a compute plan: add --plan")
    if args.plan:
        from blockforge.search.config import load_search

        if args.resume or args.address:
            raise BlockforgeError("--plan runs nothing: drop --resume and --address")
        plan = load_search(args.file, args.overrides)  # a bad file is refused before torch is imported
        from blockforge.search.reports.plan import DEFAULT_MFU, format_plan, search_plan
        from blockforge.search.run.datasets import describe_sets

        print(format_plan(plan, search_plan(plan), gpu=args.gpu, gpus=args.gpus, mfu=DEFAULT_MFU if args.mfu is None else args.mfu,
                          concurrency=args.max_concurrent or plan.max_concurrent))
        for line in describe_sets(plan):
            print(line)
        return 0
    outcome = run_search(args.file, out=args.out, address=args.address, resume=args.resume, max_concurrent=args.max_concurrent,
                         overrides=args.overrides)
    print()
    print(outcome.summary)
    print(f"\nsearch folder: {outcome.location or outcome.search_dir} (summary.md, results.csv, best/, plots)")
    code = 0
    unfinished = nothing_finished(outcome)
    if unfinished is not None and outcome.interrupted is None:
        print(f"blockforge: error: {unfinished}", file=sys.stderr)
        code = 1
    if outcome.interrupted is not None:
        name = signal.Signals(outcome.interrupted).name
        print(f"blockforge: stopped by {name}; the reports cover the trials so far; resume with: {outcome.resume_command}", file=sys.stderr)
        code = 128 + outcome.interrupted
    return code


EXIT_GRACE_S = 60.0  # how long the search's libraries may hold the finished process open


def end_process(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """End the `blockforge` process once the search is done and said, with exit status `code`; never returns.

    As the interpreter's own exit does, it waits for the threads that are no daemons and runs the exit handlers (Ray's,
    logging's, the trackers', temporary folders'); then it leaves without tearing down every module and native library
    loaded (torch's alone takes most of a second, all of them about two). A library's thread that keeps running (a
    tracker's service, a storage's pool) is cut off after `grace_s`, with one line, since everything the search keeps is
    written by then. Only for the `blockforge` process itself (cli.main on the command line's own arguments), never for a
    caller that runs the command in its own process."""
    import atexit
    import os
    import sys
    import threading
    import time

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    def cut_off(after_s: float = 0.0) -> None:
        threading.Event().wait(after_s)
        print(f"blockforge: the search ended {grace_s:.0f} s ago and a library's threads still held the process open; it exits now",
              file=sys.stderr, flush=True)
        flush()
        os._exit(code)

    flush()
    deadline = time.monotonic() + grace_s
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in others):
        cut_off()
    threading.Thread(target=cut_off, args=(grace_s,), name="blockforge-exit", daemon=True).start()  # an exit handler that hangs
    from blockforge.cluster import leave_ray

    leave_ray()  # a Ray still stopping ends with the process
    atexit._run_exitfuncs()
    flush()
    os._exit(code)
