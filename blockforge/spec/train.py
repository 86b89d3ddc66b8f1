"""Training settings: the `train:` section of a recipe."""

from __future__ import annotations

from dataclasses import dataclass, field

from blockforge.errors import SpecError
from blockforge.spec.strict import bounded, choice


@dataclass(kw_only=True)
class DivergenceConfig:
    """When a run counts as diverged: a non-finite loss at any step, or, after warmup, a loss above
    `max_loss` (default: twice the loss of the first step, i.e. far worse than the untrained model)."""

    hash_baseline = frozenset({"max_loss"})  # fields always in a trial's identity (strict.canonical)

    max_loss: float | None = None


@dataclass(kw_only=True)
class TrainConfig:
    # Fields always in a trial's identity; one added later enters only when set away from its default (strict.canonical).
    hash_baseline = frozenset({"steps", "batch_size", "micro_batch_size", "lr", "warmup", "schedule", "min_lr_ratio", "optimizer",
                               "weight_decay", "betas", "eps", "grad_clip", "seed", "eval_every", "eval_batches", "log_every",
                               "grad_norm_every", "checkpoint_every", "device", "precision", "parallel", "compile",
                               "activation_checkpointing", "tensorboard", "divergence"})

    steps: int = bounded(1000, above=0)
    batch_size: int = bounded(32, above=0)  # sequences (or images) per optimizer step
    micro_batch_size: int | None = bounded(None, above=0)  # per forward pass; gradients are accumulated to batch_size
    lr: float = bounded(1e-3, above=0)
    warmup: float = bounded(0.1, at_least=0, below=1, why="is a fraction of the steps and ")  # fraction of steps with a linear warmup
    schedule: str = choice("cosine", "linear", "constant", default="cosine")
    min_lr_ratio: float = bounded(0.1, at_least=0, at_most=1)  # the schedule ends at lr * min_lr_ratio
    optimizer: str = choice("adam", "adamw", default="adam")
    weight_decay: float = bounded(0.0, at_least=0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = bounded(1e-8, above=0)
    grad_clip: float = bounded(0.0, at_least=0)  # max global grad norm; 0 disables clipping
    seed: int = 0
    eval_every: int = bounded(0, at_least=0)  # steps between evaluations; 0 evaluates only at the end
    eval_batches: int = bounded(16, above=0)  # micro-batches per evaluation
    log_every: int = bounded(10, above=0)
    grad_norm_every: int = bounded(50, at_least=0)  # per-layer gradient norms in metrics.jsonl; 0 disables them
    checkpoint_every: int = bounded(100, at_least=0)  # 0 writes a checkpoint only at the end
    device: str = choice("auto", "cpu", "cuda", default="auto")
    precision: str = choice("auto", "fp32", "bf16", default="auto")  # auto: bf16 autocast on CUDA, fp32 on CPU
    parallel: str = choice("ddp", "fsdp", default="ddp")  # under torchrun: replicate (DDP) or shard (FSDP2) the model
    compile: bool = False
    activation_checkpointing: bool | str | list[int] = False  # true: every block; or the blocks, as in `at:`
    tensorboard: bool = False
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)

    def check(self, path: str) -> None:
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise SpecError(f"must be two numbers in [0, 1), not {self.betas}", path=f"{path}.betas")
        micro = self.micro_batch_size or self.batch_size
        if self.batch_size % micro:
            raise SpecError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {micro}; pick a divisor",
                path=f"{path}.micro_batch_size",
            )

    @property
    def micro_batch(self) -> int:
        return self.micro_batch_size or self.batch_size

    @property
    def warmup_steps(self) -> int:
        return int(self.warmup * self.steps)
