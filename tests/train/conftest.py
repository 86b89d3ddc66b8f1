"""A tiny text recipe on a generated local corpus, so training tests take seconds."""

import random
from pathlib import Path

import pytest
import yaml

WORDS = (
    "the model layer norm weight gradient loss step train data token batch value returns list string "
    "object file path error number name key argument default optional called when each new given used "
    "for with of to in is are be it this that not or and from as on may must read write open close"
).split()


def write_corpus(path: Path, documents: int = 300, seed: int = 0) -> Path:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(documents):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(rng.randint(2, 5))]
        paragraphs.append(f"Section {i}. " + " ".join(sentences))
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def tiny_recipe(tmp_path: Path, **train) -> dict:
    corpus = write_corpus(tmp_path / "corpus.txt")
    settings = dict(steps=30, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=1, eval_every=10,
                    eval_batches=2, checkpoint_every=5, grad_norm_every=5)
    settings.update(train)
    return {
        "model": {"family": "llama", "width": 32, "depth": 2, "heads": 2, "ffn": 64, "vocab": 300, "context": 32,
                  "layers": {"mix_ln": {"alpha": 0.5}}},
        "train": settings,
        "data": {"source": "text", "path": str(corpus), "tokenizer": {"bpe": 300}},
    }


@pytest.fixture
def recipe_file(tmp_path: Path):
    """A function: recipe_file(**train_overrides) -> path of a tiny recipe YAML."""

    def make(name: str = "tiny.yaml", **train) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(tiny_recipe(tmp_path, **train)))
        return path

    return make


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BLOCKFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "blockforge-cache"))
