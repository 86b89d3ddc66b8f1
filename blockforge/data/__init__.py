"""Training and validation data: text for the llama family, images for the vit family.

    from blockforge.data import dataset_for
    ds = dataset_for(recipe)                     # the recipe's data, sized for its model, seeded by train.seed
    for step, batch in enumerate(ds.train_batches(16, start=resumed_steps), resumed_steps): ...

Modules: corpus (text sources and the train/validation split), stdlib_docs (the builtin corpus
extractor, run as a script), tokenizer, text (token rows, packing, streaming), images, batching (the
resumable epoch order). Which builder a recipe uses is its family's (blockforge.spec.family); nothing
heavy (datasets, transformers, torchvision) is imported until a dataset is built.
"""

from __future__ import annotations

from pathlib import Path

from blockforge.spec.data import DataConfig, TokenizerConfig
from blockforge.spec.family import get_family

__all__ = ["DataConfig", "TokenizerConfig", "cache_dir", "dataset_for", "load_tokenizer"]


def cache_dir() -> Path:
    """Where corpora, tokenizers and token arrays are cached (BLOCKFORGE_CACHE, else ~/.cache/blockforge)."""
    from blockforge.storage import cache_root

    return cache_root()


def dataset_for(recipe, *, run_dir: Path | None = None, seed: int | None = None):
    """The dataset of `recipe` (its data section, sized for its resolved model), shuffled by train.seed.

    Text gives a TextDataset or StreamingTextDataset, images a TensorImageDataset or ImageFolderDataset;
    all have kind, train_batches(batch_size, start), val_batches(batch_size, limit) and describe().
    Text datasets also have tokenizer, pad_id (None when packing; otherwise the loss must ignore
    targets equal to it) and unigram_perplexity(); their tokenizer is saved into run_dir/tokenizer
    when run_dir is given. Caches (corpus, tokenizer, tokens) live under cache_dir().
    """
    from blockforge.errors import WriteError

    spec = recipe.spec
    seed = recipe.train.seed if seed is None else seed
    cache = cache_dir()
    try:
        return get_family(spec.family).dataset(recipe.data, spec, seed, cache, run_dir)
    except WriteError as err:
        folder = getattr(err, "folder", None)
        if folder is None or not folder.resolve().is_relative_to(cache.resolve()):
            raise
        raise WriteError(f"{folder}: cannot write {err.what} into the cache ({err.reason}); "
                         "free space there or set BLOCKFORGE_CACHE to a folder with room") from None


def load_tokenizer(directory: str | Path):
    """The tokenizer a text dataset saved (into run_dir/tokenizer, or an export folder)."""
    from blockforge.data.tokenizer import load_tokenizer as load

    return load(directory)
