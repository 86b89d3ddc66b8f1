"""One search trial: a training run with the trial's overrides, reporting to Ray Tune at every evaluation.

A trial's run folder is named by its cell and identity inside the search folder, and the trial
resumes from that folder's checkpoint whenever it exists. That is what makes a restarted trial (a
resumed search, a retry after its node died) continue instead of starting over. The ledger decides
whether a restarted trial trains at all: one it records as pruned, or a run folder with a result,
reports that end at once. On a multi-node cluster the search folder is either on storage every node
mounts, or in an object store: then the trial trains in a scratch folder of its node that starts as
the storage's copy of its run folder, and puts its files up before every report (search/records/store.py), so
whatever the storage holds is what Tune was told, and a trial continues on any node.

A trial with several workers (resources.gpu > 1, or resources.workers) trains data-parallel: this
process is rank 0 and reports to Tune; ranks 1.. are `blockforge train` processes on the same node,
joined through torch.distributed (NCCL on GPUs, gloo on CPUs).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from blockforge.errors import WriteError
from blockforge.io import write_failure
from blockforge.search.config import OBJECTIVE, SearchPlan, trial_rel
from blockforge.spec.strict import to_plain
from blockforge.storage import Storage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def data_parallel_peers(recipe, run_dir: Path, workers: int, resume: bool):
    """Start ranks 1..workers-1 as `blockforge train` processes and make this process rank 0."""
    if workers == 1:
        yield
        return
    import torch.distributed as dist

    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = run_dir / ".trial-recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(to_plain(recipe), sort_keys=False))
    shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(workers)}
    saved = {k: os.environ.get(k) for k in [*shared, "RANK", "LOCAL_RANK"]}
    os.environ.update(shared, RANK="0", LOCAL_RANK="0")
    command = [sys.executable, "-m", "blockforge", "train", str(recipe_file), "--out", str(run_dir), "--no-progress"] + (["--resume"] if resume else [])
    peers = []
    try:
        for rank in range(1, workers):
            log = open(run_dir / f"rank{rank}.log", "a")
            peers.append(subprocess.Popen(command, env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=log, stderr=subprocess.STDOUT))
        yield
    finally:
        for peer in peers:  # a stopped (pruned) trial leaves its peers waiting on rank 0: end them
            if peer.poll() is None:
                peer.terminate()
        for peer in peers:
            try:
                peer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                peer.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _report_recorded_end(config: dict, plan: SearchPlan, storage: Storage) -> bool:
    """A trial the ledger records as pruned (Tune restarts one that its saved state still had running when
    the driver stopped) reports where it was stopped and ends there: it stays pruned, untrained further.
    The ledger is read from the search's storage, not from this node's disk."""
    from ray import tune

    from blockforge.search.records.store import storage_record
    from blockforge.train.events import Status

    record = storage_record(storage, config["cell"], config["number"])
    if record is None or record.status != Status.PRUNED or record.identity != config["identity"]:
        return False
    value = record.value if record.value is not None else plan.penalty
    tune.report({**record.metrics, OBJECTIVE: value, "step": record.steps, "diverged": False})
    return True


def run_trial(config: dict, plan: SearchPlan, search: str, absent: tuple[str, ...] = ()) -> None:
    """The Tune trainable: train config['overrides'] on the base recipe; report the objective as it goes.
    `search`: the search folder, a local path or a URI (blockforge.storage). `absent`: packages the driver found broken (a
    tracker's), absent here too, so nothing Ray Tune imports in this process meets them."""
    import time

    config = {**config, "_entered": time.time()}  # when this trial reached its process (attempts.jsonl: where its time went)
    from blockforge.errors import BlockforgeError, FolderInUseError
    from blockforge.search.records.store import Superseded
    from blockforge.search.stages.base import FAILURE
    from blockforge.tracking import absent as make_absent

    make_absent(absent)
    storage = search
    try:
        storage = Storage.open(search)  # inside: a node that cannot open the storage stops the search, it does not fail trials
        if _report_recorded_end(config, plan, storage):
            return
        _train(config, plan, storage)
    except Superseded:
        return  # this attempt outlived its driver, and a resumed search runs the trial again: it leaves the run to that one
    except WriteError as err:  # a full disk, a storage that cannot be reached or lost the trial's files: the search stops
        _stop_search_for(err, plan.penalty)
    except OSError as err:  # a write outside the run's own checked writes
        reason = write_failure(err)
        if reason is None:
            raise
        _stop_search_for(WriteError(f"{storage}/{trial_rel(config['cell'], config['identity'])}: cannot write the trial's files "
                                    f"({reason}); free space there"), plan.penalty)
    except FolderInUseError:
        raise  # another process trains its run folder: Tune's retry, then a failure a resume takes up again
    except BlockforgeError as err:  # its own reason to fail (its spec, its data): one sentence in the ledger, not retried
        from ray import tune

        tune.report({FAILURE: str(err), OBJECTIVE: plan.penalty})  # no step: neither ASHA nor the sampler takes it for a result


WRITE_ERROR = "write_error"  # a result key: the trial could not write, and the search stops (see driver.Interrupts)
WRITE_FIX = "write_fix"  # ...and what to do before resuming (free space, bring the storage back)
STOP_WAIT_S = 120.0  # how long a trial that could not write waits for the search to stop it


def _stop_search_for(err: WriteError, plan_penalty: float) -> None:
    """A trial that cannot write (a full disk) asks the search to stop, as a signal would: it reports the
    sentence (with the penalty as its objective, which Tune requires, and no step: neither ASHA nor the sampler
    takes it for a result), and waits to
    be stopped, so that it stays a running trial that --resume continues from its last checkpoint. If no
    stop comes, it fails."""
    import time

    from ray import tune

    if getattr(err, "fix", None):  # a storage: its sentence, and its own fix
        said, fix = str(err).removesuffix(f"; {err.fix}"), err.fix
    else:
        said = f"{err.folder}: cannot write {err.what} ({err.reason})" if hasattr(err, "folder") else str(err)
        fix = "free space"
    waited = 0.0
    while waited < STOP_WAIT_S:  # Tune stops a trial inside report(), where the trial waits for its next turn
        tune.report({WRITE_ERROR: said, WRITE_FIX: fix, OBJECTIVE: plan_penalty})
        time.sleep(1.0)
        waited += 1.0
    raise err


def _train(config: dict, plan: SearchPlan, storage: Storage) -> None:
    import ray
    import torch
    from ray import tune

    from blockforge.search.records.runs import damaged_result, last_evaluation, run_end
    from blockforge.search.records.store import trial_folder
    from blockforge.train.checkpoint import checkpoint_folders, keep_final_weights
    from blockforge.train.events import Status
    from blockforge.train.loop import Trainer

    resources = plan.resources_of(config["cell"])
    workers = resources.data_parallel
    torch.set_num_threads(max(1, int(resources.cpu) // workers))
    recipe = plan.recipe([tuple(pair) for pair in config["overrides"]], prepared=True)  # reads the set the driver prepared
    costs = _measured_costs(plan, recipe, storage)  # reported with every result: the searcher records them
    with trial_folder(storage, config["cell"], config["identity"]) as (run_dir, mirror):
        push = mirror.push if mirror is not None else (lambda: None)
        end = run_end(run_dir, plan.metric)
        if end is not None:  # finished before the driver was restarted: report what its own log says, do not retrain
            diverged = end.status == Status.DIVERGED
            value = plan.penalty if diverged or end.value is None else end.value
            tune.report({OBJECTIVE: value, "step": end.step, "diverged": diverged, **end.metrics, **costs, **stability_result(end.stability)})
            return
        if damaged_result(run_dir):  # cut short or edited: the run goes on from its newest checkpoint, which decides
            (run_dir / "result.json").unlink()
        if config.get("continues") and not checkpoint_folders(run_dir):  # a longer training: it starts where its source ended
            start_from(storage, config["continues"], run_dir)
        resume = bool(checkpoint_folders(run_dir))  # the newest intact one is taken, whatever latest.json says (a kill between the two)
        with data_parallel_peers(recipe, run_dir, workers, resume):
            trainer = Trainer(recipe, run_dir, resume=resume, progress=False, keep_checkpoints=plan.checkpoints_kept,
                              planned_memory=plan.memory_needs.get(config["cell"]))  # the driver's plan (none: planned here)
            with open(run_dir / "attempts.jsonl", "a") as f:  # which node ran it, from which step (retries append), and when
                f.write(json.dumps({"trial": config["number"], "node_id": ray.get_runtime_context().get_node_id(),
                                    "workers": workers, "start_step": trainer.state["step"], **_timing(config)}) + "\n")
            reported = False
            for event in trainer.iterate():
                metrics = {k: v for k, v in (event.metrics or {}).items() if isinstance(v, (int, float))}
                value = plan.penalty if event.diverged else metrics[plan.metric]
                if event.done and not (plan.continues_completed and not event.diverged) and plan.keep_checkpoints is None:
                    keep_final_weights(run_dir)  # nothing will continue it: its final weights, without optimizer state
                push()  # the storage holds what Tune is told (a stop may come inside report, and nothing after it runs)
                reported = True
                ended = stability_result(trainer.result.stability) if event.done and trainer.result is not None else {}
                tune.report({OBJECTIVE: value, "step": event.step, "diverged": event.diverged, **metrics, **costs, **ended})
            last = last_evaluation(run_dir, trainer.state["step"]) if not reported else None
            if last is not None and plan.metric in last:  # its newest checkpoint was its last step (its result file was lost)
                push()
                tune.report({OBJECTIVE: last[plan.metric], "step": trainer.state["step"], "diverged": False, **last, **costs})
    if mirror is not None:  # ended (not stopped inside report): the storage holds the run, this node need not
        shutil.rmtree(run_dir, ignore_errors=True)


def _timing(config: dict) -> dict:
    """When this attempt's process started, when the trial reached it and when its training was set up (unix seconds, with
    the process id): a process that trained trials before it is reused, one started for it is new."""
    import time

    try:
        import psutil  # (Ray's own dependency)

        started = round(psutil.Process().create_time(), 3)
    except ImportError:
        started = None
    return {"pid": os.getpid(), "process_started": started, "entered": round(config["_entered"], 3), "set_up": round(time.time(), 3)}


UNSTABLE = "unstable"  # a result key: why the finished run is unstable ('' when stable; train/stability.py)


def stability_result(stability) -> dict:
    """What a finished trial reports of its stability (train/stability.Stability): the reason it is unstable, its spikes and
    the largest rise of its loss level (the two numbers as train_ metrics, which its record keeps)."""
    if stability is None:
        return {}
    return {UNSTABLE: stability.unstable, "train_spikes": stability.spikes, "train_rise": stability.rise}


def start_from(storage: Storage, source: str, run_dir: Path) -> None:
    """Put the newest whole checkpoint of run folder `source` (relative to the search) and its curve into `run_dir`, so the
    run continues from there (search/checks/length_check.py says how the schedule goes on)."""
    from blockforge.errors import BlockforgeError
    from blockforge.io import atomic_write_json

    files = storage.listing(f"{source}/checkpoints")
    whole = sorted({name.split("/")[0] for name in files if name.endswith("/state.json")})
    if not whole:
        raise BlockforgeError(f"{storage}/{source}: has no whole checkpoint to continue from; its run was lost (resume the search to "
                              "train it again)")
    newest = whole[-1]
    for name in files:
        if name.startswith(f"{newest}/"):
            storage.download(f"{source}/checkpoints/{name}", run_dir / "checkpoints" / name)
    if storage.exists(f"{source}/metrics.jsonl"):
        storage.download(f"{source}/metrics.jsonl", run_dir / "metrics.jsonl")  # the curve so far; trimmed to the checkpoint on resume
    atomic_write_json(run_dir / "checkpoints" / "latest.json", {"step": int(newest.removeprefix("step-")), "path": newest})


def _measured_costs(plan: SearchPlan, recipe, storage: Storage) -> dict[str, float]:
    """The measured costs the search's objectives name (tokens/s on this trial's device), as `cost_<name>`; measured
    once per model and cached in the search folder's costs/."""
    from blockforge.search.costs import MEASURED, measured_costs

    wanted = [cost for cost, _ in plan.costs if cost in MEASURED]
    if not wanted:
        return {}
    import torch

    from blockforge.search.records.store import node_scratch
    from blockforge.storage import Mirror

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(storage.uri) / "costs" if storage.local else node_scratch(storage) / "costs"
    mirror = None if storage.local else Mirror(storage, "costs", folder)
    if mirror is not None:
        mirror.pull(remove=False)
    measured = measured_costs(recipe, folder, device)
    if mirror is not None:
        mirror.push()
    return {f"cost_{cost}": measured[cost] for cost in wanted}
