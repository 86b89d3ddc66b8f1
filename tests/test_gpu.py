"""What runs on a CUDA GPU: conversions and exports of a model that lives there, and training in bf16 autocast.

Skipped where there is no GPU (as on CI); `bash benchmarks/gpu_check.sh` runs them on one, with the throughput benchmark.
"""

import os
import signal

import pytest
import torch
import yaml

import blockforge
from blockforge.spec import load_recipe
from blockforge.train.loop import Trainer, train
from tiny_data import losses, tiny_llama, write_recipe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))


def test_a_model_on_the_gpu_converts_to_transformers_and_stays_where_it_is():
    torch.manual_seed(0)
    model = blockforge.build_model(tiny_llama()).eval()
    ids = tokens(model.spec.vocab)
    with torch.no_grad():
        expected = model(ids)
    model.cuda()
    hf = blockforge.to_hf_llama(model)
    with torch.no_grad():
        got = hf(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(p.is_cuda for p in model.parameters())


def test_a_bf16_model_on_the_gpu_saves_the_weights_it_holds(tmp_path):
    torch.manual_seed(0)
    model = blockforge.build_model(tiny_llama()).to("cuda", torch.bfloat16)
    blockforge.save(model, tmp_path / "saved")
    loaded = blockforge.load(tmp_path / "saved").eval()
    reference = blockforge.build_model(tiny_llama()).eval()
    reference.load_state_dict({name: tensor.float().cpu() for name, tensor in model.state_dict().items()})
    ids = tokens(model.spec.vocab)
    with torch.no_grad():
        assert torch.equal(loaded(ids), reference(ids))
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in model.parameters())


def test_training_on_the_gpu_learns_in_bf16_and_a_preempted_run_resumes_exactly(tmp_path):
    path = write_recipe(tmp_path, steps=40, eval_every=20, checkpoint_every=20, device="cuda")
    recipe = yaml.safe_load(path.read_text())
    recipe["data"] = {"source": "builtin", "tokenizer": {"bpe": 300}}  # the built-in corpus needs no `datasets` on the GPU machine
    path.write_text(yaml.safe_dump(recipe))
    straight = train(load_recipe(path), tmp_path / "straight", progress=False)
    assert straight.status == "completed"

    def preempt(trainer, step):
        if step.step == 13:
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = Trainer(load_recipe(path), tmp_path / "resumed", progress=False, callbacks=[preempt]).run()
    assert stopped.status == "interrupted" and stopped.step == 13
    resumed = train(load_recipe(path), tmp_path / "resumed", resume=True, progress=False)
    curve, again = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert curve[40] < curve[1] - 0.5, curve  # it learns
    assert again == curve and resumed.metrics["val_loss"] == straight.metrics["val_loss"]
