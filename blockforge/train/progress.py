"""What a run shows while it trains: the progress bar, and the throughput its train records log (time spent evaluating
is not training throughput)."""

from __future__ import annotations

import time

from blockforge.train.events import Step


class Progress:
    def __init__(self, steps: int, done: int, *, unit: str, items_per_sample: int, enabled: bool):
        from tqdm.auto import tqdm

        self.unit = unit  # "tok" or "img" (Family.sample_unit)
        self.items_per_sample = items_per_sample
        self.bar = tqdm(total=steps, initial=done, disable=not enabled, unit="step", dynamic_ncols=True, leave=False)
        self.window_start, self.window_samples = time.perf_counter(), 0

    def count(self, samples: int) -> None:
        """Samples trained since the last train record."""
        self.window_samples += samples

    def restart_clock(self) -> None:
        """After an evaluation: its time is not counted."""
        self.window_start = time.perf_counter()

    def train_record(self, step: int, info: Step) -> dict:
        """The train record of `step` with the throughput since the last one (shown on the bar too)."""
        now = time.perf_counter()
        rate = self.window_samples * self.items_per_sample / max(now - self.window_start, 1e-9)
        self.window_start, self.window_samples = now, 0
        record = {"step": step, "event": "train", "loss": info.loss, "lr": info.lr, "grad_norm": info.grad_norm, f"{self.unit}_per_s": rate}
        if info.layer_grad_norms is not None:
            record["layer_grad_norms"] = info.layer_grad_norms
        self.bar.set_postfix(loss=f"{info.loss:.3f}", lr=f"{info.lr:.2e}", **{f"{self.unit}/s": f"{rate:,.0f}"}, refresh=False)
        return record

    def close(self) -> None:
        self.bar.close()
