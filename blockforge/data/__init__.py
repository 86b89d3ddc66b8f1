"""Training and validation data: text for the llama family, images for the vit family.

    from blockforge.data import build_dataset
    ds = build_dataset(recipe.data, family="llama", seq_len=256, vocab=32000, image_size=None,
                       channels=None, classes=None, seed=0, cache_dir=Path(".cache/blockforge"))
    for step, batch in enumerate(ds.train_batches(16, start=resumed_steps), resumed_steps): ...

Modules: corpus (text sources and the train/validation split), stdlib_docs (the builtin corpus
extractor, run as a script), tokenizer, text (token rows, packing, streaming), images, batching (the
resumable epoch order). The recipe loader imports this package for DataConfig, so nothing heavy
(datasets, transformers, torchvision) is imported until a dataset is built.
"""

from __future__ import annotations

from pathlib import Path

from blockforge.data.config import IMAGE_SOURCES, TEXT_SOURCES, DataConfig, TokenizerConfig
from blockforge.errors import DataError

__all__ = ["DataConfig", "TokenizerConfig", "build_dataset", "load_tokenizer"]


def build_dataset(
    data_cfg: DataConfig,
    *,
    family: str,
    seq_len: int | None,
    vocab: int | None,
    image_size: int | None,
    channels: int | None,
    classes: int | None,
    seed: int,
    cache_dir: Path,
    run_dir: Path | None = None,
):
    """The dataset `data_cfg` describes, checked against the model's sizes.

    Text (family llama) gives a TextDataset or StreamingTextDataset, images (family vit) a
    TensorImageDataset or ImageFolderDataset; all have kind, train_batches(batch_size, start),
    val_batches(batch_size, limit) and describe(). Text datasets also have tokenizer, pad_id (None
    when packing; otherwise the loss must ignore targets equal to it) and unigram_perplexity(); their
    tokenizer is saved into run_dir/tokenizer when run_dir is given. Caches (corpus, tokenizer,
    tokens) live under cache_dir.
    """
    if family not in ("llama", "vit"):
        raise DataError(f"model.family: no data for family '{family}'; choose one of: llama, vit")
    text = family == "llama"
    sources = TEXT_SOURCES if text else IMAGE_SOURCES
    if data_cfg.source not in sources:
        raise DataError(
            f"data.source: '{data_cfg.source}' does not fit model.family {family}; choose one of: {', '.join(sources)}"
        )
    if text:
        sizes = {"model.context": seq_len}
    else:
        sizes = {"model.image_size": image_size, "model.channels": channels, "model.classes": classes}
    for key, value in sizes.items():
        if value is None:
            raise DataError(f"{key}: is needed to prepare {family} data; set it in the model section")
    cache_dir = Path(cache_dir).expanduser()
    if text:
        from blockforge.data.text import build_text_dataset

        return build_text_dataset(data_cfg, seq_len=seq_len, vocab=vocab, seed=seed, cache_dir=cache_dir, run_dir=run_dir)
    from blockforge.data.images import build_image_dataset

    return build_image_dataset(data_cfg, image_size=image_size, channels=channels, classes=classes, seed=seed)


def load_tokenizer(directory: str | Path):
    """The tokenizer a text dataset saved (into run_dir/tokenizer, or an export folder)."""
    from blockforge.data.tokenizer import load_tokenizer as load

    return load(directory)
