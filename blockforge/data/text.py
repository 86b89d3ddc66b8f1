"""Token rows for the language model: how a recipe's text source becomes the dataset a run reads.

A row holds seq_len + 1 tokens (inputs row[:-1], targets row[1:]). With `data.pack`, documents, each
followed by the end-of-document id, are concatenated and cut into windows that overlap by one token,
so every token is a target exactly once. Without it each document is one row, truncated or padded
with `pad_id`; the loss must ignore targets equal to `pad_id` (the Mix-LN paper's C4 setup).

Every source but a raw stream is read through one reader, a prepared set (prepared.py): `data.prepared`
names one that `blockforge prepare` wrote, and a finite source (builtin, text, downloaded hf) without it is
prepared once into the node's cache, keyed by a hash of its documents, its tokenizer and the row layout, and
read from there. Rows are reshuffled every epoch (batching.py) and read by index, so a resume costs the same
at any position.

StreamingTextDataset (hf with `data.streaming`, no `data.prepared`) tokenizes while it reads, in the training
loop; a run says so once. Every epoch reshuffles the stream (shard order and a buffer) with a seed derived
from (seed, epoch). Resuming at batch k replays the stream from its start: unpacked, it skips k * batch_size
documents without tokenizing them; packed, it has to tokenize them to know where the windows fall.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from blockforge.data.batching import derived_seed, part_of
from blockforge.data.corpus import Corpus, hf_texts, load_corpus, open_hf_split, source_key, validation_score
from blockforge.data.prepared import SAMPLE_TOKENS, Layout, PreparedSet, PreparedTextDataset, check_matches, to_batch, unigram_log_probs
from blockforge.data.tokenizer import Tokenizer, build_tokenizer, check_token_ids
from blockforge.errors import DataError, warn
from blockforge.spec.data import DataConfig

STREAM_SHUFFLE_BUFFER = 10_000  # documents
# Streams have no end to count from: validation (when no limit is given) and the unigram counts read
# this many tokens (the Mix-LN paper evaluates on ~10M C4 validation tokens).
STREAM_SAMPLE_TOKENS = SAMPLE_TOKENS


def build_text_dataset(
    cfg: DataConfig, *, seq_len: int, vocab: int | None, seed: int, cache_dir: Path, run_dir: Path | None
) -> PreparedTextDataset | StreamingTextDataset:
    layout = Layout(pack=cfg.pack, context=seq_len)
    if cfg.prepared is not None:
        prepared = PreparedSet.open(cfg.prepared)
        check_matches(prepared.manifest, cfg, layout, vocab, cfg.prepared)
        dataset = PreparedTextDataset(prepared, seq_len=seq_len, vocab=vocab, seed=seed)
    elif cfg.source == "hf" and cfg.streaming:
        dataset = StreamingTextDataset(cfg, seq_len=seq_len, vocab=vocab, seed=seed, cache_dir=cache_dir)
        warn(f"data: streaming {cfg.dataset!r} and tokenizing it in the training loop, in series with every step, and a resume "
             "reads the stream again up to where it stopped; `blockforge prepare RECIPE --out PATH --tokens N` and "
             "data.prepared: PATH read rows by index instead")
    else:
        corpus = load_corpus(cfg, cache_dir)
        tokenizer = build_tokenizer(cfg.tokenizer, corpus.train, max_chars=cfg.bpe_train_chars, cache_dir=cache_dir, vocab=vocab)
        dataset = cached_set(cfg, corpus, tokenizer, layout=layout, vocab=vocab, seed=seed, cache_dir=cache_dir)
    if run_dir is not None:
        dataset.save_tokenizer(Path(run_dir) / "tokenizer")
    return dataset


def cached_set(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer, *, layout: Layout, vocab: int | None, seed: int,
               cache_dir: Path) -> PreparedTextDataset:
    """A finite source's rows, from its prepared set in the cache (prepared here first when it is not there)."""
    from blockforge.data.prepare import Request, prepare

    key = hashlib.sha256(f"{corpus.content_hash()}|{tokenizer.fingerprint}|{layout.to_plain()}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) / "prepared" / "local" / key
    request = Request(replace(cfg, prepared=None), layout, vocab)
    if not (folder / "manifest.json").is_file():
        # Another process of this node preparing the same set is waited for; its set is then this one's.
        prepare(request, folder, corpus=corpus, tokenizer=tokenizer, progress=False, wait_s=3600.0)
    prepared = PreparedSet.open(folder)
    key_name = source_key(cfg)
    empty = {"train": (f"{key_name}: the training split", "add text or lower model.context"),
             "val": (f"{key_name}: the validation split", "raise data.val_fraction or lower model.context")}
    return PreparedTextDataset(prepared, seq_len=layout.context, vocab=vocab, seed=seed, empty=empty)


# --- rows ---------------------------------------------------------------------------------------


def packed_rows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Windows tokens[i*seq_len : i*seq_len + seq_len + 1] as a (rows, seq_len + 1) view (no copy)."""
    if len(tokens) <= seq_len:
        return np.empty((0, seq_len + 1), dtype=tokens.dtype)
    return np.lib.stride_tricks.sliding_window_view(tokens, seq_len + 1)[::seq_len]


def stream_packed_rows(documents: Iterable[np.ndarray], seq_len: int) -> Iterator[np.ndarray]:
    """The rows packed_rows gives for the concatenated documents, produced while reading them."""
    buffer = None
    for ids in documents:
        buffer = ids if buffer is None else np.concatenate([buffer, ids])
        rows = packed_rows(buffer, seq_len)
        yield from rows
        buffer = buffer[len(rows) * seq_len :]


def padded_row(ids: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    """One document truncated or padded to seq_len + 1 tokens."""
    row = np.full(seq_len + 1, pad_id, dtype=ids.dtype)
    kept = ids[: seq_len + 1]
    row[: len(kept)] = kept
    return row


def unigram_perplexity(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int) -> float:
    """Perplexity on val_tokens of token frequencies counted on train_tokens, add-one smoothed over the vocabulary."""
    log_probs = unigram_log_probs(np.bincount(train_tokens, minlength=vocab_size))
    return float(np.exp(-log_probs[val_tokens].mean()))


# --- streaming ----------------------------------------------------------------------------------


def take_tokens(documents: Iterable[np.ndarray], max_tokens: int) -> Iterator[np.ndarray]:
    """Documents, in order, until max_tokens tokens have been given."""
    total = 0
    for ids in documents:
        if total >= max_tokens:
            return
        total += len(ids)
        yield ids


class StreamingTextDataset:
    """A `datasets` stream (such as C4), tokenized while it is read."""

    kind = "text"

    def __init__(self, cfg: DataConfig, *, seq_len: int, vocab: int | None, seed: int, cache_dir: Path):
        self.cfg = cfg
        self.seq_len = seq_len
        self.vocab = vocab
        self.seed = seed
        self._train = open_hf_split(cfg, cfg.split, streaming=True)
        self._val = self._train if cfg.val_split is None else open_hf_split(cfg, cfg.val_split, streaming=True)
        first_texts = self._texts(self._train, validation=False)  # a BPE trains on the start of the stream
        self.tokenizer = build_tokenizer(
            cfg.tokenizer, first_texts, max_chars=cfg.bpe_train_chars, cache_dir=cache_dir, vocab=vocab
        )
        self.pad_id = None if cfg.pack else self.tokenizer.pad_id
        if self.pad_id is not None:
            check_token_ids(self.pad_id, vocab, self.tokenizer.name, self.tokenizer.vocab_size)
        self._val_rows: list[np.ndarray] = []  # the fixed validation rows read so far
        self._more_val_rows = self._rows(self._val_documents())


    def save_tokenizer(self, directory: Path) -> None:
        self.tokenizer.save(directory)
    def _texts(self, stream, *, validation: bool) -> Iterator[str]:
        """Texts of a stream; without a validation split, those on `validation`'s side of the hash split."""
        texts = hf_texts(stream, self.cfg)
        if self.cfg.val_split is not None:
            return texts
        return (text for text in texts if (validation_score(text) < self.cfg.val_fraction) == validation)

    def _encode(self, texts: Iterable[str]) -> Iterator[np.ndarray]:
        for ids in self.tokenizer.encode_documents(texts):
            check_token_ids(int(ids.max()), self.vocab, self.tokenizer.name, self.tokenizer.vocab_size)
            yield ids

    def _rows(self, documents: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        if self.pad_id is None:
            return stream_packed_rows(documents, self.seq_len)
        return (padded_row(ids, self.seq_len, self.pad_id) for ids in documents)

    def _val_documents(self) -> Iterator[np.ndarray]:
        return take_tokens(self._encode(self._texts(self._val, validation=True)), STREAM_SAMPLE_TOKENS)

    def _training_texts(self) -> Iterator[str]:
        """Endless: epoch after epoch of the training stream, each shuffled with its own seed."""
        for epoch in itertools.count():
            shuffled = self._train.shuffle(seed=derived_seed(self.seed, epoch), buffer_size=STREAM_SHUFFLE_BUFFER)
            empty = True
            for text in self._texts(shuffled, validation=False):
                empty = False
                yield text
            if empty:
                raise DataError(
                    f"data.split: split {self.cfg.split!r} of {self.cfg.dataset!r} has no training documents; "
                    "check data.split and data.text_field"
                )

    def train_batches(self, batch_size: int, start: int = 0, part: tuple[int, int] | None = None) -> Iterator[torch.Tensor]:
        """Every rank reads and tokenizes the whole batch (a stream has no index) and keeps its share (`part`)."""
        skipped = start * batch_size
        share = part_of(batch_size, part)
        if self.pad_id is None:
            rows = itertools.islice(self._rows(self._encode(self._training_texts())), skipped, None)
        else:  # one row per document: skip documents before tokenizing
            rows = self._rows(self._encode(itertools.islice(self._training_texts(), skipped, None)))
        while True:
            yield to_batch(np.stack(list(itertools.islice(rows, batch_size))[share]))

    def val_batches(self, batch_size: int, limit: int | None = None) -> list[torch.Tensor]:
        """The first rows of the validation stream: the same rows on every call."""
        wanted = None if limit is None else batch_size * limit
        while wanted is None or len(self._val_rows) < wanted:
            row = next(self._more_val_rows, None)
            if row is None:
                break
            self._val_rows.append(row)
        rows = self._val_rows[:wanted]
        if not rows and self.cfg.val_split is None:
            raise DataError(
                f"data.val_fraction: no document of split {self.cfg.split!r} of {self.cfg.dataset!r} falls in the "
                f"{self.cfg.val_fraction} hash hold-out; raise data.val_fraction or name a data.val_split"
            )
        if not rows:
            raise DataError(
                f"data.val_split: split {self.cfg.val_split!r} of {self.cfg.dataset!r} has no text; choose a split with text"
            )
        return [to_batch(np.stack(rows[i : i + batch_size])) for i in range(0, len(rows), batch_size)]

    def unigram_perplexity(self) -> float:
        """Counts from the first STREAM_SAMPLE_TOKENS training tokens (in stream order), on the validation tokens."""
        val = np.concatenate(list(self._val_documents()))
        return float(np.exp(-self.unigram_log_probs()[val].mean()))

    def unigram_log_probs(self) -> np.ndarray:
        """The unigram model of the first STREAM_SAMPLE_TOKENS training tokens (in stream order), computed once."""
        if getattr(self, "_unigram", None) is None:
            train = np.concatenate(list(take_tokens(self._encode(self._texts(self._train, validation=False)), STREAM_SAMPLE_TOKENS)))
            self._unigram = unigram_log_probs(np.bincount(train, minlength=self.tokenizer.vocab_size))
        return self._unigram

    def describe(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "source": "hf",
            "dataset": cfg.dataset,
            "name": cfg.name,
            "split": cfg.split,
            "val_split": cfg.val_split,
            "streaming": True,
            "tokenizer": self.tokenizer.name,
            "vocab_size": self.tokenizer.vocab_size,
            "seq_len": self.seq_len,
            "pack": self.pad_id is None,
            "reader": "stream, tokenized in the training loop",
        }
