"""A training step never waits for the device: nothing in it reads a value back to the host (the loop reads losses and
gradient norms only at the steps it logs, after the step)."""

import threading
import traceback

import pytest
import torch
import yaml

from blockforge.spec import load_recipe
from blockforge.train.loop import Trainer
from tiny_data import tiny_recipe

# What brings a tensor's value to the host: on a GPU each waits for the device to finish everything queued before it.
HOST_READS = ("item", "tolist", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__")


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "documents"])  # documents: the paper's layout, padding masked
def test_a_training_step_reads_nothing_back_from_the_device(tmp_path, monkeypatch, pack):
    recipe = tiny_recipe(tmp_path, steps=5, log_every=100, eval_every=0, checkpoint_every=0, grad_norm_every=0)
    recipe["data"]["pack"] = pack
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    trainer = Trainer(load_recipe(tmp_path / "r.yaml"), tmp_path / "run", progress=False)
    stepping, reads = [], []

    def optimizer_counter(tensor) -> bool:  # torch keeps an optimizer's step counts on the host, by design
        return any(tensor is state.get("step") for state in trainer.optimizer.state.values())

    def watched(name, real):
        def read(tensor, *args, **kwargs):
            if stepping and threading.current_thread() is threading.main_thread() and not optimizer_counter(tensor):
                reads.append(f"Tensor.{name} in step {stepping[0]}:\n{''.join(traceback.format_stack(limit=6)[:-1])}")
            return real(tensor, *args, **kwargs)
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, watched(name, getattr(torch.Tensor, name)))
    real_step = Trainer._train_step

    def step(self, stream, n):
        stepping.append(n + 1)
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")  # also what the patches above cannot see (a copy, a sort, a mask)
        try:
            return real_step(self, stream, n)
        finally:
            if self.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            stepping.pop()

    monkeypatch.setattr(Trainer, "_train_step", step)
    result = trainer.run()
    assert result.status == "completed" and result.step == 5
    assert not reads, reads[0]
