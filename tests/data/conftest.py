"""Fixtures for the data tests: a tiny generated text corpus, a private `datasets` cache, build helpers."""

import json
import random
from pathlib import Path

import pytest

from blockforge.data import DataConfig, TokenizerConfig

WORDS = (
    "the a module function class returns value list string object file path error number name key "
    "argument default optional called when if each new given used by for with of to in is are be "
    "it this that not or and from as on an may must raise read write open close data text line "
    "time thread process socket buffer encoding result option field record table index count"
).split()


def make_documents(n: int, seed: int = 0) -> list[str]:
    """n distinct pseudo-English paragraphs (a few sentences each)."""
    rng = random.Random(seed)
    documents = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(rng.randint(1, 4))]
        documents.append(f"Paragraph {i}. " + " ".join(s.capitalize() + "." for s in sentences))
    return documents


@pytest.fixture(scope="session")
def builtin(tmp_path_factory):
    """The builtin corpus extracted once per test session into a private cache: (cache_dir, documents)."""
    cache_dir = tmp_path_factory.mktemp("builtin-cache")
    from blockforge.data.corpus import builtin_documents

    documents, _ = builtin_documents(cache_dir)
    return cache_dir, documents


@pytest.fixture
def documents() -> list[str]:
    return make_documents(80)


@pytest.fixture
def text_file(tmp_path: Path, documents: list[str]) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(documents) + "\n")
    return path


@pytest.fixture
def jsonl_file(tmp_path: Path, documents: list[str]) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": doc, "id": i}) + "\n" for i, doc in enumerate(documents)))
    return path


@pytest.fixture(autouse=True)
def hf_cache(tmp_path: Path, monkeypatch):
    """`datasets` writes its builds and lock files into a temporary folder, not the user's cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def text_config():
    """DataConfig with test defaults: a 300-token BPE and a 20% hash hold-out."""

    def make(**settings) -> DataConfig:
        settings.setdefault("tokenizer", TokenizerConfig(bpe=300))
        settings.setdefault("val_fraction", 0.2)
        return DataConfig(**settings)

    return make


@pytest.fixture
def build_text(cache_dir: Path):
    default_cache_dir = cache_dir

    def build(cfg: DataConfig, *, seq_len=16, vocab=512, seed=0, run_dir=None, cache_dir=default_cache_dir):
        from blockforge.data.text import build_text_dataset

        return build_text_dataset(cfg, seq_len=seq_len, vocab=vocab, seed=seed, cache_dir=cache_dir, run_dir=run_dir)

    return build


@pytest.fixture
def build_images(cache_dir: Path):
    def build(cfg: DataConfig, *, image_size: int, channels: int, classes: int, seed: int = 0):
        from blockforge.data.images import build_image_dataset

        return build_image_dataset(cfg, image_size=image_size, channels=channels, classes=classes, seed=seed)

    return build


def _equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and bool((a == b).all())


@pytest.fixture
def same_batches():
    """Whether two lists of batches (tensors or tuples of tensors) are identical."""
    return _equal
