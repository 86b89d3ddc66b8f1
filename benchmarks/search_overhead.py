"""What a search costs beyond its trainings: the quickstart's search (one cell, then three) against the same trainings done
in warm processes, in one run; and, with --storage, what keeping a search in object storage adds per trial.

The floor: every run the search trained (its recipe, as its run folder keeps it) trained again in as many warm processes
as the search had slots (each with the search's threads per trial, torch and the data already loaded), longest first to
the least loaded, so the floor has the search's parallelism and none of its process starts, set-ups or barriers. Each
side's training steps are timed by the runs themselves (result.json's elapsed); the floor is scaled by the ratio of the
two sides' step times, so a machine that is busier during one side does not move the ratio.

The split of the search's slot-seconds (slots x wall): training steps and evaluation (result.json), each trial's set-up
(from reaching its process to its first step: attempts.jsonl), process starts (a trial that is its process's first: from
the process's start, or for a worker Ray started with itself from when the driver began asking for trials),
the driver's own time before the first trial and after the last one (plan, data, Ray, reports), and the slots' idle
time (the rest: a slot with no trial, at a barrier or while Tune starts the next).

    python benchmarks/search_overhead.py                     # one cell and three cells (about 20 minutes on two cores)
    python benchmarks/search_overhead.py --cells 1           # the one-cell search only
    python benchmarks/search_overhead.py --storage [--uri s3://bucket/prefix]   # Ray's and object storage's cost per trial
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "searches" / "quickstart.yaml"


# ---- one search against its floor ------------------------------------------------------------------------------------


def run_search(out: Path, depths: list[int]) -> float:
    """The quickstart's search at `depths`, as the command runs it; its wall seconds."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    command = [sys.executable, "-m", "blockforge", "search", str(QUICKSTART), "--out", str(out), "--set", f"cells.model.depth={depths}"]
    started = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the search failed:\n{done.stderr[-3000:]}")
    (out / "benchmark-started").write_text(str(started))
    return time.time() - started


def trained_runs(out: Path) -> list[dict]:
    """Every run the search trained to its end: its folder, its recipe, its step and evaluation seconds and its attempt."""
    runs = []
    for result in sorted(out.glob("trials/*/*/result.json")):
        folder = result.parent
        data = json.loads(result.read_text())
        attempts = [json.loads(line) for line in (folder / "attempts.jsonl").read_text().splitlines()]
        if data.get("status") != "completed" or len(attempts) != 1:
            continue  # a run that continued another, or ended otherwise, has no like-for-like floor
        runs.append({"folder": folder, "recipe": folder / "recipe.yaml", "steps_s": data["elapsed"], "eval_s": data.get("eval_s", 0.0),
                     **attempts[0]})
    return runs


def _warm_worker(recipes, threads, conn) -> None:
    """One floor process: imports and threads as a trial's, then, on the go signal, its recipes back to back."""
    import torch

    torch.set_num_threads(threads)
    from blockforge.spec import load_recipe
    from blockforge.train.loop import Trainer

    loaded = [load_recipe(path) for path in recipes]
    scratch = Path(tempfile.mkdtemp(prefix="bf-floor-"))
    Trainer(loaded[0], scratch / "warm", progress=False)  # the data's caches and the first set-up, before the clock starts
    conn.send("ready")
    conn.recv()
    steps = 0.0
    for i, recipe in enumerate(loaded):
        trainer = Trainer(recipe, scratch / str(i), progress=False)
        trainer.run()
        steps += trainer.state["elapsed"]
    conn.send(steps)
    shutil.rmtree(scratch, ignore_errors=True)


def floor(runs: list[dict], slots: int, threads: int) -> tuple[float, float]:
    """(wall seconds, step seconds) of the same trainings in `slots` warm processes, longest first to the least loaded."""
    queues: list[list] = [[] for _ in range(slots)]
    load = [0.0] * slots
    for run in sorted(runs, key=lambda r: -r["steps_s"]):
        i = load.index(min(load))
        queues[i].append(str(run["recipe"]))
        load[i] += run["steps_s"]
    context = multiprocessing.get_context("spawn")
    pipes, workers = [], []
    for recipes in queues:
        mine, theirs = context.Pipe()
        worker = context.Process(target=_warm_worker, args=(recipes, threads, theirs))
        worker.start()
        pipes.append(mine)
        workers.append(worker)
    for pipe in pipes:
        assert pipe.recv() == "ready"
    started = time.perf_counter()
    for pipe in pipes:
        pipe.send("go")
    steps = sum(pipe.recv() for pipe in pipes)
    wall = time.perf_counter() - started
    for worker in workers:
        worker.join()
    return wall, steps


def split(out: Path, runs: list[dict], wall: float, slots: int) -> dict[str, float]:
    """The search's slot-seconds by where they went (see the module's docstring)."""
    started = float((out / "benchmark-started").read_text())
    ledger = {json.loads(line)["identity"]: json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()}
    ready = (out / "search.json").stat().st_mtime  # the driver wrote it as it began asking for trials
    # A process counts from its start, or from `ready` for one of the workers Ray started with itself (idle till then).
    begun = {id(run): max(run["process_started"] or run["entered"], ready) for run in runs}
    first_of_process: dict[int, float] = {}
    for run in runs:
        first_of_process[run["pid"]] = min(first_of_process.get(run["pid"], float("inf")), run["entered"])
    starts = sum(run["entered"] - begun[id(run)] for run in runs
                 if run["process_started"] is not None and run["entered"] == first_of_process[run["pid"]])
    ends = [run["entered"] + ledger[run["folder"].name]["wall_s"] for run in runs if run["folder"].name in ledger]
    first = min(begun.values())  # a slot's first process start is not the driver's
    driver = (first - started) + (started + wall - max(ends))  # before the first trial and after the last: by the slots' count
    parts = {"training steps": sum(r["steps_s"] for r in runs), "evaluation": sum(r["eval_s"] for r in runs),
             "trial set-up": sum(r["set_up"] - r["entered"] for r in runs), "process starts": starts, "driver (plan, Ray, reports)": slots * driver}
    in_trials = sum(ledger[r["folder"].name]["wall_s"] for r in runs if r["folder"].name in ledger)
    parts["in trials, other (checkpoints, reports to Tune)"] = max(0.0, in_trials - parts["training steps"] - parts["evaluation"]
                                                                    - parts["trial set-up"])
    parts["idle slots"] = slots * wall - sum(parts.values())
    return parts


def measure(depths: list[int], slots: int = 2, threads: int = 1) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bf-overhead-")) / "search"
    wall = run_search(out, depths)
    runs = trained_runs(out)
    floor_wall, floor_steps = floor(runs, slots, threads)
    search_steps = sum(r["steps_s"] for r in runs)
    scaled = floor_wall * search_steps / floor_steps  # the floor at the search's own step speed
    parts = split(out, runs, wall, slots)
    shutil.rmtree(out.parent, ignore_errors=True)
    return {"cells": len(depths), "runs": len(runs), "wall_s": wall, "floor_s": floor_wall, "floor_scaled_s": scaled, "ratio": wall / scaled,
            "step_speed_ratio": search_steps / floor_steps, "split_s": parts, "processes": len({r["pid"] for r in runs})}


def show(result: dict, slots: int) -> None:
    print(f"\n{result['cells']} cell(s), {result['runs']} runs: search {result['wall_s']:.0f} s, floor {result['floor_s']:.0f} s "
          f"(x{result['step_speed_ratio']:.2f} for the search's step speed: {result['floor_scaled_s']:.0f} s): "
          f"{result['ratio']:.2f}x its floor; {result['processes']} trial processes")
    total = slots * result["wall_s"]
    for name, seconds in result["split_s"].items():
        print(f"  {name:48s} {seconds:8.1f} s  {seconds / total:6.1%}")


# ---- object storage's cost per trial -------------------------------------------------------------------------------------


def local_s3() -> subprocess.Popen | None:
    """A moto S3 server on loopback with its endpoint and dummy keys in the environment (before Ray starts, so trials
    inherit them); None if moto is not installed."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    import boto3

    boto3.client("s3").create_bucket(Bucket="bench")
    return server


def storage_cost(steps: int, trials: int, uri: str | None) -> None:
    """Ray's cost per trial (a search of `trials` trials one at a time against direct Trainer.run()s), and object storage's."""
    import yaml

    from blockforge.cluster import ensure_ray
    from blockforge.search.config import load_search
    from blockforge.search.records.ledger import Ledger
    from blockforge.search.reports.report import write_reports
    from blockforge.search.run.driver import run_search as drive
    from blockforge.storage import Storage
    from blockforge.train.loop import Trainer

    server = local_s3() if uri is None else None
    uri = uri or (f"s3://bench/overhead-{os.getpid()}" if server is not None else None)
    folder = Path(tempfile.mkdtemp(prefix="bf-overhead-"))
    alphas = [round(0.125 * (i + 1), 4) for i in range(trials)]  # distinct Post-LN counts, the same FLOPs
    search = {"name": "overhead", "base": str(ROOT / "recipes" / "llama-tiny-mix.yaml"), "steps": steps,
              "overrides": {"train.eval_every": 50, "train.checkpoint_every": 50}, "space": {"model.layers.mix_ln.alpha": {"grid": alphas}},
              "trials_per_cell": len(alphas), "sampler": {"grid": {}}, "resources": {"cpu": 2}}
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    plan = load_search(path)
    recipe = plan.recipe(plan.trial_overrides({}, {"model.layers.mix_ln.alpha": alphas[0]}))
    import torch

    torch.set_num_threads(2)
    Trainer(recipe, folder / "warm", progress=False)  # corpus, tokenizer and token caches
    start = time.perf_counter()
    direct_trainer = Trainer(recipe, folder / "direct", progress=False)
    direct_trainer.run()
    direct = time.perf_counter() - start
    direct_other = direct - direct_trainer.state["elapsed"]
    ensure_ray(None)  # Ray's own start-up is paid once per session, not per trial: keep it out
    start = time.perf_counter()
    outcome = drive(path, out=folder / "out", progress_every_s=1e9)
    searched = time.perf_counter() - start
    trial_steps = sum(json.loads((Path(d) / "result.json").read_text())["elapsed"] for d in {r.run_dir for r in outcome.records})
    start = time.perf_counter()
    write_reports(folder / "out", plan, Ledger(folder / "out" / "trials.jsonl"))
    reports = time.perf_counter() - start
    per_trial = (searched - trial_steps - reports - trials * direct_other) / trials
    print(f"direct Trainer.run()                 {direct:7.1f} s  ({direct - direct_other:.1f} s in training steps)")
    print(f"search of {trials} trials, one at a time   {searched:7.1f} s  ({trial_steps:.1f} s in training steps)")
    print(f"  summary, CSV and plots (once)      {reports:7.1f} s")
    print(f"Ray cost per trial                   {per_trial:7.1f} s  = {per_trial / direct:.1%} of a {direct:.0f}-second trial")
    if uri is not None:
        start = time.perf_counter()
        outcome = drive(path, out=uri, progress_every_s=1e9)
        stored = time.perf_counter() - start
        storage = Storage.open(uri)
        stored_steps = sum(json.loads(storage.read_bytes(f"{Path(r.run_dir).relative_to(outcome.search_dir).as_posix()}/result.json"))["elapsed"]
                           for r in outcome.records)
        up = sum(size for size, _ in storage.listing().values())
        stored_per_trial = (stored - stored_steps - reports - trials * direct_other) / trials
        print(f"search of {trials} trials in {uri.split('?')[0]}  {stored:7.1f} s  ({stored_steps:.1f} s in training steps; "
              f"{up / 2**20:.1f} MiB put up)")
        print(f"cost per trial with object storage   {stored_per_trial:7.1f} s  = {stored_per_trial / direct:.1%} of the trial; "
              f"{stored_per_trial - per_trial:+.1f} s per trial, {stored_per_trial / per_trial:.2f}x the local folder's cost")
    if server is not None:
        server.terminate()
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", choices=["1", "3", "both"], default="both", help="the one-cell search (depth 8), the three-cell one, or both")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--storage", action="store_true", help="measure Ray's and object storage's cost per trial instead")
    parser.add_argument("--steps", type=int, default=200, help="--storage: training steps per trial")
    parser.add_argument("--trials", type=int, default=2, help="--storage: trials, one at a time")
    parser.add_argument("--uri", help="--storage: this object store (default: a local moto S3 server, if moto is installed)")
    args = parser.parse_args()
    if args.storage:
        return storage_cost(args.steps, args.trials, args.uri)
    shapes = {"1": [[8]], "3": [[4, 8, 12]], "both": [[8], [4, 8, 12]]}[args.cells]
    results = [measure(depths) for depths in shapes]
    for result in results:
        show(result, slots=2)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
