"""Data settings: the `data:` section of a recipe."""

from __future__ import annotations

from dataclasses import dataclass, field

from blockforge.errors import SpecError
from blockforge.spec.strict import bounded, choice

TEXT_SOURCES = ("builtin", "text", "hf")
IMAGE_SOURCES = ("digits", "fashion-mnist", "image-folder")
SOURCES = {"text": TEXT_SOURCES, "image": IMAGE_SOURCES}  # by a family's data_kind


@dataclass(kw_only=True)
class TokenizerConfig:
    hash_baseline = frozenset({"bpe", "hf"})  # fields always in a trial's identity (strict.canonical)

    bpe: int | None = None  # train a byte-level BPE of this vocabulary size on the training split
    hf: str | None = None  # a Hugging Face tokenizer name or local path (must be available offline)

    def check(self, path: str) -> None:
        if (self.bpe is None) == (self.hf is None):
            raise SpecError("give exactly one of bpe (a vocabulary size) and hf (a tokenizer name)", path=path)
        if self.bpe is not None and self.bpe < 260:
            raise SpecError(f"a byte-level BPE needs a vocabulary of at least 260, not {self.bpe}", path=f"{path}.bpe")


@dataclass(kw_only=True)
class DataConfig:
    # Fields always in a trial's identity; one added later enters only when set away from its default (strict.canonical).
    hash_baseline = frozenset({"source", "path", "dataset", "name", "split", "val_split", "text_field", "streaming", "tokenizer",
                               "val_fraction", "pack", "bpe_train_chars", "num_workers"})
    # Where the rows are read from, not what they are: a run on a prepared set trains on the rows the settings above name.
    hash_excluded = frozenset({"prepared"})

    source: str = choice(*TEXT_SOURCES, *IMAGE_SOURCES, default="builtin")
    # text: files or globs; hf: the data files its builder reads (e.g. dataset json); fashion-mnist / image-folder: a
    # folder; refused for the other sources, which read no path
    path: str | list[str] | None = None
    dataset: str | None = None  # hf: e.g. allenai/c4 (refused for the other sources)
    name: str | None = None  # hf: the configuration, e.g. en (refused for the other sources)
    split: str = "train"  # hf: the training split
    val_split: str | None = "validation"  # hf: the validation split (None: hold out from `split`)
    text_field: str = "text"
    streaming: bool = True  # hf: stream instead of downloading the whole set
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(bpe=8192))
    val_fraction: float = bounded(0.05, above=0, below=1)  # documents held out for validation when there is no validation split
    pack: bool = True  # pack documents into full sequences; false pads/truncates each (the paper's C4 setup)
    bpe_train_chars: int = 20_000_000  # text read to train a BPE tokenizer
    num_workers: int = 0
    # A prepared set (`blockforge prepare`) of this data, a folder or a URI: its rows are read by index, not tokenized here
    prepared: str | None = None

    # Keys only some sources read: set for another source, they would change nothing (refused, never ignored).
    read_by = {"path": ("text", "hf", "fashion-mnist", "image-folder"), "dataset": ("hf",), "name": ("hf",)}

    def check(self, path: str) -> None:
        for key, sources in self.read_by.items():
            if getattr(self, key) is not None and self.source not in sources:
                raise SpecError(f"is not read for data.source {self.source} (only for {', '.join(sources)}); remove it, or set the "
                                "data.source that reads it", path=f"{path}.{key}")
        if self.source == "text" and not self.path:
            raise SpecError("is required for source text (files or globs)", path=f"{path}.path")
        if self.source in ("fashion-mnist", "image-folder") and not self.path:
            raise SpecError(f"is required for source {self.source} (a folder)", path=f"{path}.path")
        if self.source == "hf" and not self.dataset:
            raise SpecError("is required for source hf (e.g. allenai/c4)", path=f"{path}.dataset")
        if self.prepared is not None and self.kind != "text":
            raise SpecError(f"holds token rows, and data.source {self.source} is images; leave data.prepared out", path=f"{path}.prepared")

    @property
    def kind(self) -> str:
        """'text' or 'image': the data_kind of the families this source fits."""
        return next(kind for kind, sources in SOURCES.items() if self.source in sources)
