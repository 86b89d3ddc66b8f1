"""A generated text corpus and the tiny llama the tests share: as a ModelSpec (tiny_llama) and as a recipe on the
corpus (tiny_recipe, write_recipe)."""

import json
import random
from pathlib import Path

import yaml

WORDS = (
    "the model layer norm weight gradient loss step train data token batch value returns list string "
    "object file path error number name key argument default optional called when each new given used "
    "for with of to in is are be it this that not or and from as on may must read write open close"
).split()


def write_corpus(path: Path, documents: int = 300, seed: int = 0) -> Path:
    """`documents` pseudo-English paragraphs separated by blank lines."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(documents):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(rng.randint(2, 5))]
        paragraphs.append(f"Section {i}. " + " ".join(sentences))
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


# The tiny llama of the tests: 32 wide, 2 heads, a 300-token vocabulary.
TINY_LLAMA = {"family": "llama", "width": 32, "depth": 4, "heads": 2, "ffn": 64, "vocab": 300, "context": 32}


def tiny_llama(**changes):
    """The tiny llama as a ModelSpec, with `changes` (depth=2, vocab=10, layers=LayerRules(...), ...)."""
    from blockforge.spec import ModelSpec

    return ModelSpec(**{**TINY_LLAMA, **changes})


def tiny_recipe(folder: Path, *, alpha: float = 0.5, depth: int = 2, **train) -> dict:
    """A 32-wide llama with Mix-LN `alpha`, a BPE of 300 on a corpus written into `folder`; `train` overrides."""
    corpus = write_corpus(folder / "corpus.txt")
    settings = dict(steps=30, batch_size=4, micro_batch_size=2, lr=3e-3, warmup=0.1, log_every=1, eval_every=10,
                    eval_batches=2, checkpoint_every=5, grad_norm_every=5)
    settings.update(train)
    return {
        "model": {**TINY_LLAMA, "depth": depth, "layers": {"mix_ln": {"alpha": alpha}}},
        "train": settings,
        "data": {"source": "text", "path": str(corpus), "tokenizer": {"bpe": 300}},
    }


def write_recipe(folder: Path, name: str = "tiny.yaml", **kwargs) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(tiny_recipe(folder, **kwargs)))
    return path


def losses(run: Path) -> dict[int, float]:
    """A run folder's training loss per logged step (metrics.jsonl), each step logged once."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in lines if r["event"] == "train"]
    steps = [r["step"] for r in train_lines]
    assert len(steps) == len(set(steps)), "a step was logged twice"
    return {r["step"]: r["loss"] for r in train_lines}
