"""Export tests start from a model folder written here (seeded weights with norms away from 1, a small BPE), so they take seconds."""

import json

import pytest
import torch

import blockforge
from blockforge.data.images import preprocess
from blockforge.data.tokenizer import train_bpe, wrap_bpe
from blockforge.spec.serialize import save_spec
from blockforge.train.checkpoint import save_weights
from tiny_data import write_corpus

VOCAB = 300


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Loading an export never reaches the Hugging Face hub."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="session")
def bpe(tmp_path_factory):
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", documents=60)
    return wrap_bpe(train_bpe(corpus.read_text().split("\n\n"), VOCAB), f"bpe-{VOCAB}")


def perturb(model) -> None:
    """Norm weights, layer scales and DyT alphas away from their init, biases away from 0: a tensor a
    conversion leaves behind then shows in the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".alpha"):
                p.uniform_(0.3, 1.0)
            elif name.endswith(("norm.weight", "layer_scale")):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)


def assert_padding_changes_nothing(model, tokenizer, texts: list[str], tol: float, same_length: bool = False) -> None:
    """Each row of a padded batch (left and right padding) gives the logits its text gives alone; the first
    text is the shorter one, so only its row is padded."""
    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            together = model(**batch).logits
            for row, text in enumerate(texts):
                alone = model(**tokenizer(text, return_tensors="pt")).logits[0]
                real = batch.attention_mask[row].bool()
                assert (~real).any() == (row == 0)
                if same_length:
                    assert int(real.sum()) == len(alone)
                torch.testing.assert_close(together[row, real], alone, rtol=0, atol=tol)


@pytest.fixture
def model_folder(tmp_path, bpe):
    """model_folder(spec, name, tokenizer=True) -> a folder blockforge.load and export_run read, as a run's export."""

    def make(spec, name: str = "model", tokenizer: bool = True, data: bool = True):
        model = blockforge.build_model(spec, seed=0)
        perturb(model)
        folder = tmp_path / name
        folder.mkdir()
        save_weights(model, folder / "model.safetensors")
        save_spec(model.spec, folder / "spec.yaml")
        if tokenizer:
            bpe.save(folder / "tokenizer")
        if data and model.spec.family == "vit":  # as a run records its images' normalization
            channels = model.spec.channels
            (folder / "data.json").write_text(json.dumps({"preprocess": preprocess([0.5] * channels, [0.25] * channels, crop_pct=1.0)}))
        return folder

    return make
