"""The training loop: a recipe in, a run folder out (checkpoints, metrics.jsonl, spec.yaml, result.json).

`Trainer.iterate()` yields an `Evaluation` after every evaluation so a search trial can report and
stop a run; `Trainer.run()` drives it to the end; `callbacks` see every optimizer step. Same recipe,
seed and machine give the same losses, and a run resumed from its checkpoint continues exactly
where it stopped. A Trainer owns its run folder (run.lock) from start to end, and SIGTERM or a first
Ctrl-C ends it cleanly after the current step (status interrupted).

The step never waits for data or for the device when it need not: batches are read ahead in a thread (feed.py;
each process reads only its own rows of the global batch), and a step's loss and gradient norm stay on the
device until the loop logs them, so the host runs ahead of the accelerator. They are read (in one transfer) at
the first step, every logged step, evaluations and checkpoints, a stop, and at every step when callbacks are
given; the divergence rule then checks each step read, in order, and a run that diverged ends at the step that
did. The parts live beside it: runtime (device, precision), feed (batches made ahead), task (loss, evaluation,
per-layer gradient norms), runlog (metrics.jsonl), checkpoint, signals, events (statuses and events).
"""

from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import yaml

from blockforge.data import dataset_for
from blockforge.errors import BlockforgeError, warn
from blockforge.io import atomic_write_json, atomic_write_text, read_json, remove_leftover_temporaries, writable_folder
from blockforge.nn.build import build_model
from blockforge.spec.family import get_family
from blockforge.spec.recipe import Recipe
from blockforge.spec.serialize import save_spec
from blockforge.spec.strict import to_plain
from blockforge.train.checkpoint import KEEP, apply_weights, checkpoint_folders, restore_training_state, resume_checkpoint, save_checkpoint
from blockforge.train.distributed import Parallel, World, agree_on_stop, barrier, init_world, mean_across
from blockforge.train.events import Evaluation, Status, Step, TrainResult
from blockforge.train.feed import Feed
from blockforge.lock import RunLock
from blockforge.train.memory import check_fits
from blockforge.train.optim import learning_rate, make_optimizer, set_learning_rate
from blockforge.train.progress import Progress
from blockforge.train.runlog import RunLog
from blockforge.train.runtime import Runtime, pick_device
from blockforge.train.signals import StopRequest
from blockforge.train.stability import Monitor, count_baseline
from blockforge.train.task import evaluate, layer_grad_norms
from blockforge.tracking import flat

EXIT_DIVERGED = 3


@dataclass
class _Pending:
    """An optimizer step whose loss and gradient norm are still on the device (read when the loop logs them)."""

    step: int  # 1-based
    lr: float
    loss: torch.Tensor  # this process's mean over its micro-batches
    grad_norm: torch.Tensor
    samples: int
    layer_grad_norms: list[float] | None


def holds_run(path: Path) -> bool:
    """Whether `path` holds a started run: a checkpoint, or a result."""
    return bool(checkpoint_folders(path)) or (path / "checkpoints" / "latest.json").exists() or (path / "result.json").exists()


def prepare_run_dir(path: Path, resume: bool) -> None:
    """Refuse to overwrite a finished or started run unless resuming (the folder exists and is locked by now)."""
    if not resume and holds_run(path):
        raise BlockforgeError(f"{path}: already holds a run; pass --resume to continue it, or choose another --out")


def fresh_start(path: Path) -> str:
    """How to start again in a folder with nothing to resume (a run that ended before its first checkpoint)."""
    if (path / "result.json").exists():
        return "it ended before its first checkpoint (see result.json); delete the folder to start again, or choose another --out"
    return "start the run without --resume"


def forget_interruption(path: Path) -> None:
    """Remove the result.json of an interrupted run that goes on now: it would outlive a later kill."""
    result = path / "result.json"
    if result.exists():
        record = read_json(result, "delete it; the run's checkpoints are what resuming needs")
        if isinstance(record, dict) and record.get("status") == Status.INTERRUPTED:
            result.unlink()


def divergence(recipe: Recipe, step: int, loss: float, first_loss: float) -> str | None:
    """A sentence if the run diverged at `step` (1-based): a loss that is not finite, or above the ceiling after warmup
    (train.divergence.max_loss, else twice the first loss); else None."""
    cfg = recipe.train
    advice = "try a lower train.lr or a longer train.warmup"
    if recipe.model.layers.mix_ln is not None and recipe.spec.post_ln_count():  # Mix-LN's alpha is a suspect only where it acts
        advice = "try a smaller alpha (fewer Post-LN layers), a lower train.lr or a longer train.warmup"
    if not math.isfinite(loss):
        return f"training diverged at step {step}: the loss became {loss}; {advice}"
    ceiling = cfg.divergence.max_loss or 2.0 * first_loss
    if step > cfg.warmup_steps and loss > ceiling:
        return f"training diverged at step {step}: the loss {loss:.3g} is above the ceiling {ceiling:.3g} after warmup; {advice}"
    return None


class Trainer:
    """One training run. `callbacks` are called as callback(trainer, Step) after every optimizer step."""

    def __init__(self, recipe: Recipe, run_dir: str | os.PathLike, *, resume: bool = False, progress: bool = True,
                 callbacks: list[Callable[["Trainer", Step], None]] | None = None, keep_checkpoints: int = KEEP,
                 planned_memory: int | None = None):
        self.recipe = recipe
        self.cfg = cfg = recipe.train
        self.spec = recipe.spec
        self.family = get_family(self.spec.family)
        self.callbacks = list(callbacks or [])
        self.keep_checkpoints = keep_checkpoints  # whole checkpoints kept, the newest first (a search's trials keep one)
        self.planned_memory = planned_memory  # bytes per process a caller planned already (a search's driver): not planned again
        self.result: TrainResult | None = None  # set when the run ends
        self.last_loss: float | None = None  # the training loss of the last step read from the device
        self.run_dir = Path(run_dir)
        self.world, self.device = world_and_device(cfg)
        self.runtime = Runtime(self.device, cfg.precision)
        self.accumulation = cfg.batch_size // (cfg.micro_batch * self.world.size)
        self.progress = progress and self.world.is_main
        if resume and not checkpoint_folders(self.run_dir):  # before anything is written
            raise BlockforgeError(f"{self.run_dir}: has no checkpoint to resume from; {fresh_start(self.run_dir)}")
        self.lock = RunLock(self.run_dir)
        weakref.finalize(self, self.lock.release)  # a Trainer dropped before its end lets go of the folder
        try:
            self._set_up(resume)
        except BaseException:
            self.lock.release()
            raise

    def _set_up(self, resume: bool) -> None:
        cfg, device = self.cfg, self.device
        # Memory the machine does not have is one sentence now, not an allocator's traceback later.
        check_fits(self.recipe, device, processes=self.world.size if device.type == "cpu" else 1, sharded=self.world.size > 1 and cfg.parallel == "fsdp",
                   planned=self.planned_memory)
        if self.world.is_main:
            writable_folder(self.run_dir, "the run")
            self.lock.acquire()
            prepare_run_dir(self.run_dir, resume)
            for folder in (self.run_dir, self.run_dir / "checkpoints"):  # what a killed run left half-written
                remove_leftover_temporaries(folder)
        barrier(self.world)

        self.data = dataset_for(self.recipe, run_dir=self.run_dir if self.world.is_main else None)
        self.pad_id = getattr(self.data, "pad_id", None)
        self.model = build_model(self.spec, device=device, seed=cfg.seed)
        self.state = fresh_state()
        checkpoint = None
        if resume:  # the newest intact checkpoint; full weights go in before any sharding
            checkpoint = resume_checkpoint(self.run_dir, self.model, self.spec, say=warn if self.world.is_main else lambda line: None)
            apply_weights(self.model, checkpoint.weights)
        speed_up(self.model, cfg, self.spec.depth)
        self.sharded = self.world.size > 1 and cfg.parallel == "fsdp"
        self.parallel = Parallel(self.model, self.world, device, sharded=self.sharded, bf16=self.runtime.bf16)
        self.train_model = self.parallel.module  # what the loss is computed with
        self.optimizer = make_optimizer(self.model, self.spec, cfg, device)
        if checkpoint is not None:
            self.state.update(restore_training_state(checkpoint, self.model, self.optimizer, sharded=self.sharded))
        if not isinstance(self.state.get("stability"), dict):
            self.state["stability"] = {}  # a checkpoint from before the monitor: it watches from here
        self.stability = Monitor(cfg.warmup_steps, self.state["stability"])  # every step's loss, in order (train/stability.py)
        self.val_batches = self.data.val_batches(cfg.micro_batch, cfg.eval_batches)
        self.val_baseline = scored_baseline(self.recipe, self.family, self.data, self.val_batches, self.pad_id)
        self.log = RunLog(self.run_dir, tensorboard=cfg.tensorboard, enabled=self.world.is_main, tracking=self.recipe.tracking,
                          config=flat({"model": to_plain(self.recipe.model), "train": to_plain(self.recipe.train), "data": to_plain(self.recipe.data)}))
        self.data_info: dict[str, Any] = {}  # the data's description; filled on the main rank
        if self.world.is_main:
            self.data_info = write_run_files(self.run_dir, self.recipe, self.data)
            self.log.trim(self.state["step"])
            if checkpoint is not None:
                forget_interruption(self.run_dir)
                self.log.write({"step": self.state["step"], "event": "resumed", "checkpoint": checkpoint.folder.name})

    # ---- the loop -----------------------------------------------------------------------------

    def _train_step(self, stream: Iterator, step: int) -> _Pending:
        """One optimizer step over `accumulation` micro-batches (`step` 0-based). Nothing here waits for the device."""
        cfg = self.cfg
        lr = learning_rate(step, cfg)
        set_learning_rate(self.optimizer, lr)
        total = torch.zeros((), device=self.device)
        samples = 0
        for micro in range(self.accumulation):
            batch = next(stream)  # this process's rows of the global micro-batch, already on the device
            self.state["data_position"] += 1
            with self.parallel.gradient_sync(micro == self.accumulation - 1), self.runtime.autocast():
                loss = self.family.loss(self.train_model, batch, self.pad_id)[0]
                (loss / self.accumulation).backward()
            total += loss.detach() / self.accumulation
            samples += (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0] * self.world.size
        want_layers = cfg.grad_norm_every and (step + 1) % cfg.grad_norm_every == 0
        layers = layer_grad_norms(self.model, self.world if self.sharded else None) if want_layers else None
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return _Pending(step + 1, lr, total, grad_norm.detach(), samples, layers)

    def _must_read(self, step: int) -> bool:
        """Whether step `step`'s numbers are read now: every step for callbacks, else the first (the divergence ceiling
        is relative to its loss), the logged ones and the last."""
        cfg = self.cfg
        return bool(self.callbacks) or step == 1 or step % cfg.log_every == 0 or step == cfg.steps or bool(
            cfg.grad_norm_every and step % cfg.grad_norm_every == 0)

    def _catch_up(self, pending: list[_Pending], progress: Progress) -> Evaluation | None:
        """Read the pending steps, in order: callbacks, the divergence rule, train records; the diverged Evaluation, if one
        diverged (the run ends at that step)."""
        if not pending:
            return None
        steps, done = read_steps(pending, self.world), len(pending)
        pending.clear()
        for info in steps:
            progress.count(info.samples)
            if self.state["first_loss"] is None:
                self.state["first_loss"] = info.loss
            self.last_loss = info.loss
            self.stability.update(info.step, info.loss)
            for callback in self.callbacks:
                callback(self, info)
            problem = divergence(self.recipe, info.step, info.loss, self.state["first_loss"])
            if problem is not None:
                return self._diverged(info.step, info.loss, problem)
            if info.step % self.cfg.log_every == 0 or info.layer_grad_norms is not None or info.step == self.cfg.steps:
                self.log.write(progress.train_record(info.step, info))
        progress.bar.update(done)
        return None

    def _checkpoint(self) -> Path | None:
        folder = None
        if self.world.is_main or self.sharded:  # sharded weights are gathered by every rank
            folder = save_checkpoint(self.run_dir, self.model, self.optimizer, self.state, keep=self.keep_checkpoints, sharded=self.sharded,
                                     write=self.world.is_main)
        barrier(self.world)
        return folder

    def _finish(self, result: TrainResult) -> TrainResult:
        if result.status in (Status.COMPLETED, Status.DIVERGED):  # how stable it was (train/stability.py), said where the run ends
            result.stability = judge_run(self.stability, result, self.val_baseline)
        if self.world.is_main:
            if result.stability is not None:
                self.log.write({"step": result.step, "event": "stability", **result.stability.record()})
            write_result(self.run_dir, result, self.state)
            self.log.close({"status": str(result.status), "step": result.step, **result.metrics},
                           failed=result.status in (Status.FAILED, Status.INTERRUPTED))
        return result

    def _interrupt(self, step: int, signum: int, checkpointed: bool) -> None:
        """End the run after `step` on a stop signal: a checkpoint (unless this step wrote one) and result.json."""
        import signal

        if not checkpointed:
            self._checkpoint()
        name = signal.Signals(signum).name
        self.log.write({"step": step, "event": "interrupted", "signal": name})
        message = f"interrupted by {name} after step {step}; the checkpoint of step {step} is written"
        self.result = self._finish(TrainResult(Status.INTERRUPTED, step, self.state["metrics"], message, self.run_dir, signal=signum))

    def close(self) -> None:
        """Let go of the run folder (done when a run ends; for a Trainer that will not be iterated)."""
        self.lock.release()

    def iterate(self) -> Iterator[Evaluation]:
        """Train; yield an Evaluation after every evaluation (and on divergence); finally set self.result."""
        if self.world.is_main:
            self.lock.acquire()  # again, if an earlier iterate() ended
        try:
            with StopRequest() as stop:
                yield from self._iterate(stop)
        finally:
            self.lock.release()

    def _iterate(self, stop: StopRequest) -> Iterator[Evaluation]:
        cfg = self.cfg
        self.model.train()
        batches = self.data.train_batches(cfg.micro_batch * self.world.size, start=self.state["data_position"],
                                          part=(self.world.rank, self.world.size))
        stream = Feed(batches, self.device)  # made ahead in a thread, while the steps compute
        progress = Progress(cfg.steps, self.state["step"], unit=self.family.sample_unit, items_per_sample=self.family.samples_to_items(self.spec),
                            enabled=self.progress)
        pending: list[_Pending] = []  # steps whose numbers are still on the device
        try:
            for step in range(self.state["step"] + 1, cfg.steps + 1):
                pending.append(self._take_step(stream, step))
                evaluate_now = step == cfg.steps or bool(cfg.eval_every and step % cfg.eval_every == 0)
                checkpoint_now = step == cfg.steps or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                if self._must_read(step) or evaluate_now or checkpoint_now:
                    if (diverged := self._catch_up(pending, progress)) is not None:
                        yield diverged
                        return
                metrics = None
                if evaluate_now:
                    metrics = self._evaluate(step, self.last_loss)
                    progress.restart_clock()
                folder = self._checkpoint() if checkpoint_now else None
                if step == cfg.steps:
                    self.result = self._finish(TrainResult(Status.COMPLETED, step, metrics, f"finished {step} steps", self.run_dir))
                if evaluate_now:
                    yield Evaluation(step, metrics, folder, done=step == cfg.steps)
                signum = agree_on_stop(stop.signum, self.world, self.device)  # every rank stops after the same step
                if signum and step < cfg.steps:
                    if (diverged := self._catch_up(pending, progress)) is not None:
                        yield diverged
                        return
                    progress.close()
                    self._interrupt(step, signum, checkpoint_now)
                    return
        finally:
            stream.close()
            progress.close()
        if self.state["step"] >= cfg.steps and self.result is None:
            self.result = TrainResult(Status.COMPLETED, self.state["step"], self.state["metrics"], "already finished", self.run_dir)

    def _take_step(self, stream: Iterator, step: int) -> _Pending:
        """Optimizer step `step` (1-based), timed, and the run's state after it."""
        started = time.perf_counter()
        pending = self._train_step(stream, step - 1)
        self.state["elapsed"] += time.perf_counter() - started
        self.state["step"] = step
        self.state["samples"] += pending.samples
        return pending

    def _diverged(self, step: int, loss: float, problem: str) -> Evaluation:
        """End the run at `step`, whose loss diverged: logged, result.json written; the last Evaluation it yields."""
        self.log.write({"step": step, "event": "diverged", "loss": loss})
        self.result = self._finish(TrainResult(Status.DIVERGED, step, {"loss": loss}, problem, self.run_dir))
        return Evaluation(step, {"loss": loss}, done=True, diverged=True)

    def _evaluate(self, step: int, loss: float) -> dict:
        """The validation metrics after `step` (with its train loss), kept in the state and logged; its time counted."""
        started = time.perf_counter()
        metrics = evaluate(self.model, self.val_batches, self.runtime, self.pad_id)
        self.state["eval_s"] += time.perf_counter() - started  # (a checkpoint from before has none: fresh_state's 0 counts anew)
        metrics["train_loss"] = loss
        if self.val_baseline is not None:
            metrics["val_baseline"] = self.val_baseline
        self.state["metrics"] = metrics
        self.log.write({"step": step, "event": "eval", **metrics})
        return metrics

    def run(self) -> TrainResult:
        for _ in self.iterate():
            pass
        return self.result


def world_and_device(cfg) -> tuple[World, torch.device]:
    """This process's place in the run (its rank among the data-parallel processes) and its device; a batch the processes
    cannot share evenly is one sentence."""
    device = pick_device(cfg.device)
    world = init_world(device.type)
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
    if cfg.micro_batch * world.size > cfg.batch_size or cfg.batch_size % (cfg.micro_batch * world.size):
        raise BlockforgeError(f"train.batch_size {cfg.batch_size} must be a multiple of micro_batch_size {cfg.micro_batch} x {world.size} processes")
    return world, device


def speed_up(model, cfg, depth: int) -> None:
    """Activation checkpointing and torch.compile, as train.activation_checkpointing and train.compile ask."""
    from blockforge.spec.resolve import select_layers
    from blockforge.train.speed import compile_blocks

    chosen = cfg.activation_checkpointing
    if chosen is not False:
        model.set_grad_checkpointing(True if chosen is True else select_layers(chosen, depth, "train.activation_checkpointing"))
    if cfg.compile:
        compile_blocks(model)


def read_steps(pending: list[_Pending], world: World) -> list[Step]:
    """The steps' losses (averaged over processes) and gradient norms, read from the device in one transfer."""
    losses = mean_across(torch.stack([p.loss for p in pending]), world)
    norms = torch.stack([p.grad_norm.to(losses.device, losses.dtype) for p in pending])
    values = torch.stack([losses, norms]).tolist()
    return [Step(p.step, loss, p.lr, norm, p.samples, p.layer_grad_norms) for p, loss, norm in zip(pending, *values)]


def write_run_files(run_dir: Path, recipe: Recipe, data) -> dict:
    """recipe.yaml, spec.yaml and data.json (the data's description, returned) into a run folder."""
    atomic_write_text(run_dir / "recipe.yaml", yaml.safe_dump(to_plain(recipe), sort_keys=False))
    save_spec(recipe.spec, run_dir / "spec.yaml")
    info = data.describe()
    atomic_write_json(run_dir / "data.json", info)
    return info


def fresh_state() -> dict:
    """A run's state before its first step (a checkpoint keeps it, and a resumed run starts from the checkpoint's)."""
    return {"step": 0, "data_position": 0, "first_loss": None, "samples": 0, "elapsed": 0.0, "eval_s": 0.0, "metrics": {}, "stability": {}}


def scored_baseline(recipe: Recipe, family, data, batches: list, pad_id: int | None) -> float | None:
    """The loss of a count model on exactly what evaluation scores (`batches`): what a run learnt is measured from it."""
    classes = recipe.model.classes if family.data_kind == "image" else None
    return count_baseline(batches, None if classes else getattr(data, "unigram_log_probs", lambda: None)(), pad_id, classes)


def write_result(run_dir: Path, result: TrainResult, state: dict) -> None:
    """result.json: how the run ended, its metrics, its training-step and evaluation seconds and its stability."""
    atomic_write_json(run_dir / "result.json", {
        "status": str(result.status), "step": result.step, "metrics": result.metrics, "message": result.message,
        "elapsed": state["elapsed"], "eval_s": state["eval_s"], **({"stability": result.stability.record()} if result.stability else {}),
    })


def judge_run(monitor: Monitor, result: TrainResult, baseline: float | None):
    """A run that completed or diverged, judged by train/stability.py's rule; what it learnt is measured against `baseline`
    (a count model's loss on the tokens its validation loss is measured on)."""
    diverged = result.message if result.status == Status.DIVERGED else None
    return monitor.judge(diverged=diverged, final_loss=(result.metrics or {}).get("val_loss"), baseline=baseline)


def train(recipe: Recipe, run_dir: str | os.PathLike, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train `recipe` into `run_dir` (resuming from its last checkpoint with resume=True)."""
    return Trainer(recipe, run_dir, resume=resume, progress=progress).run()
