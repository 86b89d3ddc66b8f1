"""The training loop: a recipe in, a run folder out (checkpoints, metrics.jsonl, spec.yaml, result.json).

`Trainer.iterate()` yields after every evaluation so a search trial can report and stop a run;
`Trainer.run()` drives it to the end. Same recipe, seed and machine give the same losses, and a run
resumed from its checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from blockforge.errors import BlockforgeError
from blockforge.io import atomic_write_json, atomic_write_text, writable_folder
from blockforge.nn.build import build_model
from blockforge.spec.recipe import Recipe
from blockforge.spec.resolve import resolve
from blockforge.spec.serialize import save_spec
from blockforge.spec.strict import to_plain
from blockforge.train.checkpoint import latest_checkpoint, load_training_state, load_weights, save_checkpoint
from blockforge.train.distributed import World, barrier, init_world, mean_across
from blockforge.train.optim import learning_rate, make_optimizer, set_learning_rate

EXIT_DIVERGED = 3


@dataclass
class TrainResult:
    status: str  # completed | diverged
    step: int
    metrics: dict = field(default_factory=dict)
    message: str = ""
    run_dir: Path | None = None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BlockforgeError("train.device: cuda was asked for but no CUDA device is visible; use train.device: auto or cpu")
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default (weights and optimizer stay float32), float32 on CPU."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def lm_loss(model: nn.Module, tokens: torch.Tensor, pad_id: int | None) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy of (B, T+1) tokens, and the number of predicted tokens."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)  # (B, T, vocab)
    ignore = pad_id if pad_id is not None else -100
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=ignore)
    count = int((targets != ignore).sum()) if pad_id is not None else targets.numel()
    return loss, count


def image_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of a batch of images, and the number classified correctly."""
    images, labels = batch
    logits = model(images)  # (B, classes)
    return F.cross_entropy(logits.float(), labels), (logits.argmax(-1) == labels).sum()


def to_device(batch, device: torch.device):
    if isinstance(batch, (tuple, list)):
        return type(batch)(t.to(device, non_blocking=True) for t in batch)
    return batch.to(device, non_blocking=True)


def _rows(batch, start: int, stop: int):
    if isinstance(batch, (tuple, list)):
        return type(batch)(t[start:stop] for t in batch)
    return batch[start:stop]


def layer_grad_norms(model: nn.Module, sharded_over: World | None = None) -> list[float]:
    """The L2 norm of the gradient over each block's parameters (FSDP: shards summed over `sharded_over`)."""
    squares = []
    for block in model.layers:
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in block.parameters() if p.grad is not None]
        squares.append(torch.stack(torch._foreach_norm(grads)).square().sum() if grads else torch.zeros(()))
    total = torch.stack(squares).float()
    if sharded_over is not None and sharded_over.size > 1:
        import torch.distributed as dist

        dist.all_reduce(total)
    return total.sqrt().tolist()


@torch.no_grad()
def evaluate(model: nn.Module, batches: list, kind: str, device: torch.device, precision: str, pad_id: int | None = None) -> dict:
    """Validation loss and perplexity (text) or accuracy (images) over `batches`, weighted per token/image."""
    was_training = model.training
    model.eval()
    total_loss, total_count, correct = 0.0, 0, 0
    with autocast(device, precision):
        for batch in batches:
            batch = to_device(batch, device)
            if kind == "text":
                loss, count = lm_loss(model, batch, pad_id)
            else:
                loss, right = image_loss(model, batch)
                count = batch[1].shape[0]
                correct += int(right)
            total_loss += float(loss) * count
            total_count += count
    model.train(was_training)
    if total_count == 0:
        raise BlockforgeError("the validation set is empty; give the data source more text or images")
    mean = total_loss / total_count
    if kind == "text":
        return {"val_loss": mean, "val_ppl": math.exp(min(mean, 700.0))}
    return {"val_loss": mean, "val_acc": correct / total_count}


def prepare_run_dir(path: Path, resume: bool) -> None:
    """Create the run folder; refuse to overwrite a finished or started run unless resuming."""
    writable_folder(path, "the run")
    if not resume and (latest_checkpoint(path) is not None or (path / "result.json").exists()):
        raise BlockforgeError(f"{path}: already holds a run; pass --resume to continue it, or choose another --out")


class Trainer:
    def __init__(self, recipe: Recipe, run_dir: str | os.PathLike, *, resume: bool = False, progress: bool = True):
        from blockforge.data import build_dataset

        self.recipe = recipe
        self.cfg = cfg = recipe.train
        self.result: TrainResult | None = None  # set when the run ends
        self.run_dir = Path(run_dir)
        self.device = pick_device(cfg.device)
        self.world: World = init_world(self.device.type)
        if self.world.size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", self.world.local_rank)
        if cfg.micro_batch * self.world.size > cfg.batch_size or cfg.batch_size % (cfg.micro_batch * self.world.size):
            raise BlockforgeError(
                f"train.batch_size {cfg.batch_size} must be a multiple of micro_batch_size {cfg.micro_batch} x {self.world.size} processes"
            )
        self.accumulation = cfg.batch_size // (cfg.micro_batch * self.world.size)
        self.progress = progress and self.world.is_main
        if self.world.is_main:
            prepare_run_dir(self.run_dir, resume)
        barrier(self.world)

        self.spec = resolve(recipe.model)
        torch.manual_seed(cfg.seed)
        self.data = build_dataset(
            recipe.data, family=self.spec.family, seq_len=self.spec.context, vocab=self.spec.vocab,
            image_size=self.spec.image_size, channels=self.spec.channels, classes=self.spec.classes,
            seed=cfg.seed, cache_dir=cache_dir(), run_dir=self.run_dir if self.world.is_main else None,
        )
        self.pad_id = getattr(self.data, "pad_id", None)
        self.model = build_model(self.spec, device=self.device, seed=cfg.seed)
        self.state = {"step": 0, "data_position": 0, "first_loss": None, "samples": 0, "elapsed": 0.0, "metrics": {}}
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if checkpoint is not None:  # full weights go in before any sharding
            load_weights(self.model, checkpoint / "model.safetensors")
        self._speed_up(cfg)
        self.sharded = self.world.size > 1 and cfg.parallel == "fsdp"
        self.train_model = self._parallelize(self.model)
        self.optimizer = make_optimizer(self.model, self.spec, cfg, self.device)
        if checkpoint is not None:
            self.state.update(load_training_state(checkpoint, self.model, self.optimizer, sharded=self.sharded))
        self.val_batches = self.data.val_batches(cfg.micro_batch, cfg.eval_batches)
        self._tensorboard = self._open_tensorboard() if cfg.tensorboard and self.world.is_main else None
        self.data_info: dict[str, Any] = {}  # the data's description; filled on the main rank
        if self.world.is_main:
            self._write_run_files()
            self._trim_metrics(self.state["step"])
            if checkpoint is not None:
                self._log({"step": self.state["step"], "event": "resumed", "checkpoint": checkpoint.name})

    # ---- set-up helpers -----------------------------------------------------------------------

    def _speed_up(self, cfg) -> None:
        from blockforge.spec.resolve import select_layers
        from blockforge.train.speed import checkpoint_activations, compile_blocks

        chosen = cfg.activation_checkpointing
        if chosen is not False:
            layers = list(range(self.spec.depth)) if chosen is True else select_layers(chosen, self.spec.depth, "train.activation_checkpointing")
            checkpoint_activations(self.model, layers)
        if cfg.compile:
            self.compiled_signatures = compile_blocks(self.model)

    def _parallelize(self, model: nn.Module) -> nn.Module:
        """DDP (a wrapper), or FSDP2 (each block, then the root, sharded in place); the model to call."""
        if self.world.size == 1:
            return model
        if self.sharded:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            bf16 = self.cfg.precision == "bf16" or (self.cfg.precision == "auto" and self.device.type == "cuda")
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
            for block in model.layers:
                fully_shard(block, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def _gradient_sync(self, sync: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
        if self.sharded:
            self.model.set_requires_gradient_sync(sync)
            return nullcontext()
        if self.world.size == 1 or sync:
            return nullcontext()
        return self.train_model.no_sync()

    def _write_run_files(self) -> None:
        atomic_write_text(self.run_dir / "recipe.yaml", yaml.safe_dump(to_plain(self.recipe), sort_keys=False))
        save_spec(self.spec, self.run_dir / "spec.yaml")
        self.data_info = self.data.describe()
        atomic_write_json(self.run_dir / "data.json", self.data_info)

    def _trim_metrics(self, step: int) -> None:
        """Drop metric lines past the checkpoint being resumed, so the log reads as one clean run."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def _open_tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise BlockforgeError("train.tensorboard: true needs the tensorboard package; pip install tensorboard") from None
        return SummaryWriter(str(self.run_dir / "tensorboard"))

    def _log(self, record: dict) -> None:
        if not self.world.is_main:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(key, value, record["step"])

    # ---- the loop -----------------------------------------------------------------------------

    def _train_step(self, stream: Iterator, step: int) -> tuple[float, float, int, list[float] | None]:
        """One optimizer step over `accumulation` micro-batches; returns (loss, grad norm, samples, layer norms)."""
        cfg = self.cfg
        lr = learning_rate(step, cfg)
        set_learning_rate(self.optimizer, lr)
        total = torch.zeros((), device=self.device)
        samples = 0
        rank, size = self.world.rank, self.world.size
        for micro in range(self.accumulation):
            batch = next(stream)
            self.state["data_position"] += 1
            batch = to_device(_rows(batch, rank * cfg.micro_batch, (rank + 1) * cfg.micro_batch), self.device)
            with self._gradient_sync(micro == self.accumulation - 1), autocast(self.device, cfg.precision):
                if self.data.kind == "text":
                    loss, _ = lm_loss(self.train_model, batch, self.pad_id)
                else:
                    loss, _ = image_loss(self.train_model, batch)
                (loss / self.accumulation).backward()
            total += loss.detach() / self.accumulation
            samples += (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0] * size
        want_layers = cfg.grad_norm_every and (step + 1) % cfg.grad_norm_every == 0
        layers = layer_grad_norms(self.model, self.world if self.sharded else None) if want_layers else None
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(mean_across(total, self.world)), grad_norm, samples, layers

    def _divergence(self, step: int, loss: float) -> str | None:
        """A sentence if the run diverged at `step` (1-based), else None."""
        advice = "try a smaller alpha (fewer Post-LN layers), a lower train.lr or a longer train.warmup"
        if not math.isfinite(loss):
            return f"training diverged at step {step}: the loss became {loss}; {advice}"
        ceiling = self.cfg.divergence.max_loss or 2.0 * self.state["first_loss"]
        if step > self.cfg.warmup_steps and loss > ceiling:
            return f"training diverged at step {step}: the loss {loss:.3g} is above the ceiling {ceiling:.3g} after warmup; {advice}"
        return None

    def _checkpoint(self) -> Path | None:
        folder = None
        if self.world.is_main or self.sharded:  # sharded weights are gathered by every rank
            folder = save_checkpoint(self.run_dir, self.model, self.optimizer, self.state, sharded=self.sharded, write=self.world.is_main)
        barrier(self.world)
        return folder

    def _finish(self, result: TrainResult) -> TrainResult:
        if self.world.is_main:
            atomic_write_json(self.run_dir / "result.json", {
                "status": result.status, "step": result.step, "metrics": result.metrics, "message": result.message,
                "elapsed": self.state["elapsed"],
            })
            if self._tensorboard is not None:
                self._tensorboard.close()
        return result

    def iterate(self) -> Iterator[dict]:
        """Train; after every evaluation yield {'step', 'metrics', 'checkpoint', 'done'}; finally set self.result."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        self.model.train()
        stream = self.data.train_batches(cfg.micro_batch * self.world.size, start=self.state["data_position"])
        unit = "tok" if self.data.kind == "text" else "img"
        bar = tqdm(total=cfg.steps, initial=self.state["step"], disable=not self.progress, unit="step", dynamic_ncols=True, leave=False)
        window_start, window_samples = time.perf_counter(), 0
        try:
            for step in range(self.state["step"] + 1, cfg.steps + 1):
                started = time.perf_counter()
                loss, grad_norm, samples, layers = self._train_step(stream, step - 1)
                self.state["elapsed"] += time.perf_counter() - started
                self.state["step"] = step
                self.state["samples"] += samples
                window_samples += samples
                if self.state["first_loss"] is None:
                    self.state["first_loss"] = loss
                problem = self._divergence(step, loss)
                if problem is not None:
                    self._log({"step": step, "event": "diverged", "loss": loss})
                    self.result = self._finish(TrainResult("diverged", step, {"loss": loss}, problem, self.run_dir))
                    yield {"step": step, "metrics": {"loss": loss}, "checkpoint": None, "done": True, "diverged": True}
                    return
                if step % cfg.log_every == 0 or layers is not None or step == cfg.steps:
                    now = time.perf_counter()
                    per_sample = self.spec.context if self.data.kind == "text" else 1
                    rate = window_samples * per_sample / max(now - window_start, 1e-9)
                    window_start, window_samples = now, 0
                    record = {"step": step, "event": "train", "loss": loss, "lr": learning_rate(step - 1, cfg), "grad_norm": grad_norm, f"{unit}_per_s": rate}
                    if layers is not None:
                        record["layer_grad_norms"] = layers
                    self._log(record)
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{record['lr']:.2e}", **{f"{unit}/s": f"{rate:,.0f}"}, refresh=False)
                bar.update(1)
                evaluate_now = step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0)
                checkpoint_now = step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                metrics = None
                if evaluate_now:
                    metrics = evaluate(self.model, self.val_batches, self.data.kind, self.device, cfg.precision, self.pad_id)
                    metrics["train_loss"] = loss
                    self.state["metrics"] = metrics
                    self._log({"step": step, "event": "eval", **metrics})
                    window_start = time.perf_counter()  # evaluation time is not training throughput
                folder = self._checkpoint() if checkpoint_now else None
                if step == cfg.steps:
                    self.result = self._finish(TrainResult("completed", step, metrics, f"finished {step} steps", self.run_dir))
                if evaluate_now:
                    yield {"step": step, "metrics": metrics, "checkpoint": folder, "done": step == cfg.steps, "diverged": False}
        finally:
            bar.close()
        if self.state["step"] >= cfg.steps and self.result is None:
            self.result = TrainResult("completed", self.state["step"], self.state["metrics"], "already finished", self.run_dir)

    def run(self) -> TrainResult:
        for _ in self.iterate():
            pass
        return self.result


def cache_dir() -> Path:
    """Where corpora, tokenizers and token arrays are cached (BLOCKFORGE_CACHE, else ~/.cache/blockforge)."""
    return Path(os.environ.get("BLOCKFORGE_CACHE", Path.home() / ".cache" / "blockforge"))


def train(recipe: Recipe, run_dir: str | os.PathLike, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train `recipe` into `run_dir` (resuming from its last checkpoint with resume=True)."""
    return Trainer(recipe, run_dir, resume=resume, progress=progress).run()
