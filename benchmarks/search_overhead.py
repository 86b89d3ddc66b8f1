"""Ray Tune's cost per trial, against a ~60-second training run done directly; and what keeping the search in
object storage adds to it.

The direct run is `Trainer.run()` in this process; the search runs the same recipe (alphas with
different Post-LN counts, the same FLOPs) through `blockforge search` on a local Ray, one trial at a
time. Training-step time, the noisy part that Ray does not touch, is taken out of both sides (each
run records it); what the search spends beyond the direct runs' own set-up, evaluation and
checkpoints, less the once-per-search summary and plots, is Ray's cost per trial: actor start, Tune's
scheduling and reports, the ledger. The same search is then run with --out in an S3 server (a local moto
server by default, or --uri for a real store, credentials from the environment): its cost per trial
beyond the local folder's is the storage's (run folders and checkpoints put up before every report, the
ledger's records as objects, Tune's state, the reports), given as seconds and as a ratio in the same run.

    python benchmarks/search_overhead.py [--steps 200] [--trials 2] [--uri s3://bucket/prefix | --no-storage]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from blockforge.cluster import ensure_ray
from blockforge.search.config import load_search
from blockforge.search.records.ledger import Ledger
from blockforge.search.reports.report import write_reports
from blockforge.search.run.driver import run_search
from blockforge.train.loop import Trainer

RECIPE = str(Path(__file__).resolve().parent.parent / "recipes" / "llama-tiny-mix.yaml")


def write_search(folder: Path, steps: int, alphas: list[float]) -> Path:
    search = {
        "name": "overhead", "base": RECIPE, "steps": steps,
        "overrides": {"train.eval_every": 50, "train.checkpoint_every": 50},
        "space": {"model.layers.mix_ln.alpha": {"grid": alphas}}, "trials_per_cell": len(alphas),
        "sampler": {"grid": {}}, "resources": {"cpu": 2},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    return path


def step_seconds(run_dir: Path) -> float:
    """Seconds a run spent in training steps (result.json's elapsed: no set-up, evaluation or checkpoints)."""
    return json.loads((run_dir / "result.json").read_text())["elapsed"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (about 60 s on two cores by default)")
    parser.add_argument("--trials", type=int, default=2, help="trials in the search, run one after another")
    parser.add_argument("--uri", help="measure this object store (default: a local moto S3 server, if moto is installed)")
    parser.add_argument("--no-storage", action="store_true", help="measure only the local folder")
    args = parser.parse_args()
    server = None if args.no_storage or args.uri else local_s3()
    uri = args.uri or (f"s3://bench/overhead-{os.getpid()}" if server is not None else None)
    folder = Path(tempfile.mkdtemp(prefix="bf-overhead-"))
    alphas = [round(0.125 * (i + 1), 4) for i in range(args.trials)]  # distinct Post-LN counts, the same FLOPs
    path = write_search(folder, args.steps, alphas)
    plan = load_search(path)
    recipe = plan.recipe(plan.trial_overrides({}, {"model.layers.mix_ln.alpha": alphas[0]}))

    import torch

    torch.set_num_threads(2)
    Trainer(recipe, folder / "warm", progress=False)  # corpus, tokenizer and token caches
    start = time.perf_counter()
    Trainer(recipe, folder / "direct", progress=False).run()
    direct = time.perf_counter() - start
    direct_other = direct - step_seconds(folder / "direct")

    ensure_ray(None)  # Ray's own start-up is paid once per session, not per trial: keep it out
    start = time.perf_counter()
    outcome = run_search(path, out=folder / "out", progress_every_s=1e9)
    searched = time.perf_counter() - start
    assert all(r.status == "completed" for r in outcome.records), [r.status for r in outcome.records]
    trial_steps = sum(step_seconds(Path(d)) for d in {r.run_dir for r in outcome.records})
    start = time.perf_counter()
    write_reports(folder / "out", plan, Ledger(folder / "out" / "trials.jsonl"))
    reports = time.perf_counter() - start
    # Training steps are the noisy, Ray-independent part: take them out of both sides. What remains of
    # the search beyond the direct runs' own set-up, evaluation and checkpoints is Ray's (and the
    # search's) cost; the final reports are paid once per search and shown apart.
    per_trial = (searched - trial_steps - reports - args.trials * direct_other) / args.trials
    print(f"direct Trainer.run()                 {direct:7.1f} s  ({direct - direct_other:.1f} s in training steps)")
    print(f"search of {args.trials} trials, one at a time   {searched:7.1f} s  ({trial_steps:.1f} s in training steps)")
    print(f"  summary, CSV and plots (once)      {reports:7.1f} s")
    print(f"Ray cost per trial                   {per_trial:7.1f} s  = {per_trial / direct:.1%} of a {direct:.0f}-second trial")
    print("  (actor start, Tune scheduling and reports, ledger, beyond the direct run's own set-up, evaluation and checkpoints)")
    if uri is not None:
        from blockforge.storage import Storage

        start = time.perf_counter()
        outcome = run_search(path, out=uri, progress_every_s=1e9)
        stored = time.perf_counter() - start
        assert all(r.status == "completed" for r in outcome.records), [r.status for r in outcome.records]
        storage = Storage.open(uri)
        stored_steps = sum(json.loads(storage.read_bytes(f"{Path(r.run_dir).relative_to(outcome.search_dir).as_posix()}/result.json"))["elapsed"]
                           for r in outcome.records)
        up = sum(size for size, _ in storage.listing().values())
        stored_per_trial = (stored - stored_steps - reports - args.trials * direct_other) / args.trials
        print(f"search of {args.trials} trials in {uri.split('?')[0]}  {stored:7.1f} s  ({stored_steps:.1f} s in training steps; "
              f"{up / 2**20:.1f} MiB put up)")
        print(f"cost per trial with object storage   {stored_per_trial:7.1f} s  = {stored_per_trial / direct:.1%} of the trial; "
              f"{stored_per_trial - per_trial:+.1f} s per trial, {stored_per_trial / per_trial:.2f}x the local folder's cost, "
              f"{(stored - stored_steps) / (searched - trial_steps):.2f}x its time outside training steps")
    if server is not None:
        server.terminate()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
