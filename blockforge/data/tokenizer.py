"""Tokenizers: a byte-level BPE trained on the training split, or a Hugging Face tokenizer used offline.

Both are held as a `transformers` tokenizer, so `save` writes the standard files (tokenizer.json,
tokenizer_config.json) and `load_tokenizer` or `transformers.AutoTokenizer` reads them back. Documents
are encoded without the tokenizer's own special tokens and each is followed by the end-of-document id.
Two rules for special-token text ("<|endoftext|>" written out in a string):
- a training document splits it like any other text, so the end-of-document id only ever marks a boundary
  between documents;
- a prompt (`Tokenizer.encode`) reads it as that special token, as transformers, vLLM and llama.cpp do
  for the exported tokenizer, so `blockforge generate` and a served export see the same ids.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

from blockforge.spec.data import TokenizerConfig
from blockforge.data.corpus import text_hash
from blockforge.errors import DataError, warn
from blockforge.io import atomic_write

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# A BPE learns no merge its training text holds fewer times than this: a token seen only once or twice
# (a number, a name, a whole rare phrase) cannot get an embedding trained, and validation text rarely
# contains it. A `bpe` larger than the text supports is capped there, and a warning says so.
MIN_MERGE_COUNT = 10
# The trainer counts pieces of at most this many bytes of a longer pre-token (a minified file, a base64 blob: a "word" of
# megabytes, on which each merge costs time in proportion to its length, for minutes). Text of words shorter than this
# trains the same BPE as without it, and encoding is not cut: only what the trainer counts.
LONGEST_TRAINED_WORD = 256
# Part of the BPE cache key: a change to how the BPE is built must not reuse old files.
BPE_RECIPE = (f"byte-level bpe, no prefix space, specials {EOS_TOKEN} {PAD_TOKEN}, merges seen {MIN_MERGE_COUNT}+ times, "
              f"trained on words cut at {LONGEST_TRAINED_WORD} bytes")
ENCODE_CHUNK = 256  # documents per call into the (multi-threaded) tokenizer


class Tokenizer:
    """A `transformers` tokenizer plus the ids the data pipeline relies on."""

    def __init__(self, hf, name: str):
        self.hf = hf
        self.name = name  # for logs and model cards: "bpe-4096", "t5-base", a folder
        self.eos_id = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
        if self.eos_id is None:
            raise DataError(
                f"data.tokenizer: tokenizer {name!r} has no end-of-text (eos or sep) token to separate documents; choose another"
            )
        # Without a pad token, unpacked rows are padded with eos (its targets are then masked as well).
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else self.eos_id

    @property
    def bos_id(self) -> int:
        """The id a sequence starts with: the tokenizer's bos, else the end-of-text id (every training document
        and every generation prompt starts after it)."""
        return self.hf.bos_token_id if self.hf.bos_token_id is not None else self.eos_id

    def special_ids(self) -> dict[str, int]:
        """bos, eos and pad as a transformers config names them."""
        return {"bos_token_id": self.bos_id, "eos_token_id": self.eos_id, "pad_token_id": self.pad_id}

    @property
    def vocab_size(self) -> int:
        return len(self.hf)  # includes added tokens (for t5-base: 32,100)

    @property
    def dtype(self) -> type:
        return np.uint16 if self.vocab_size <= 2**16 else np.uint32

    @property
    def fingerprint(self) -> str:
        """A hash of everything that decides the ids (part of token cache keys)."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        identity = backend.to_str() if backend is not None else f"{self.hf.name_or_path}|{self.vocab_size}"
        return ids_fingerprint(identity, self.eos_id, self.pad_id)

    def encode(self, text: str) -> list[int]:
        """A prompt's ids, special-token text read as the special token (as a served export reads it)."""
        return self.hf(text, add_special_tokens=False, split_special_tokens=False, verbose=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids))

    def encode_documents(self, texts: Iterable[str]) -> Iterator[np.ndarray]:
        """Each document's ids followed by the end-of-document id."""
        texts = iter(texts)
        while chunk := list(itertools.islice(texts, ENCODE_CHUNK)):
            for ids in self._encode_batch(chunk):
                yield np.array(ids + [self.eos_id], dtype=self.dtype)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Training documents' ids: special-token text split like any other text."""
        return self.hf(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer files into `directory`, each one atomically."""
        from blockforge.io import writes_into

        with tempfile.TemporaryDirectory() as tmp:
            with writes_into(tmp, "the tokenizer's files", "free space in the temporary folder (TMPDIR)"):
                self.hf.save_pretrained(tmp)
            for file in sorted(Path(tmp).iterdir()):
                atomic_write(Path(directory) / file.name, lambda out, file=file: shutil.copyfile(file, out))


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer that `Tokenizer.save` wrote into `directory` (a run or export folder)."""
    directory = Path(directory)
    if not (directory / "tokenizer_config.json").is_file():
        raise DataError(
            f"{directory}: no saved tokenizer here (tokenizer_config.json is missing); "
            "give the folder a run or an export wrote it to"
        )
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its note about a config of another model type, beside a transformers export
    try:
        # No remote code: a transformers export keeps its modeling file beside the tokenizer, which reading the tokenizer never needs.
        hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as err:
        raise DataError(f"{directory}: the saved tokenizer cannot be read ({type(err).__name__}: {err}); save it again") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return Tokenizer(hf, str(directory))


def build_tokenizer(
    cfg: TokenizerConfig, training_texts: Iterable[str], *, max_chars: int, cache_dir: Path, vocab: int | None
) -> Tokenizer:
    """The tokenizer `data.tokenizer` asks for; a BPE reads at most `max_chars` of `training_texts`."""
    if cfg.hf is not None:
        return load_hf_tokenizer(cfg.hf)
    if vocab is not None and cfg.bpe > vocab:
        raise DataError(
            f"data.tokenizer.bpe: a vocabulary of {cfg.bpe} tokens does not fit model.vocab {vocab}; "
            f"set data.tokenizer.bpe to at most {vocab} or raise model.vocab"
        )
    return bpe_tokenizer(take_chars(training_texts, max_chars), cfg.bpe, cache_dir)


def take_chars(texts: Iterable[str], max_chars: int) -> list[str]:
    """Whole texts, in order, while their total length stays within max_chars (at least one)."""
    taken, total = [], 0
    for text in texts:
        if taken and total + len(text) > max_chars:
            break
        taken.append(text)
        total += len(text)
    return taken


def bpe_tokenizer(texts: list[str], vocab_size: int, cache_dir: Path) -> Tokenizer:
    """A byte-level BPE trained on `texts`, cached by a hash of (texts, vocab_size, recipe)."""
    key = hashlib.sha256(f"{BPE_RECIPE}|{vocab_size}|{text_hash(texts)}".encode()).hexdigest()[:16]
    path = Path(cache_dir) / "tokenizers" / f"bpe{vocab_size}-{key}.json"
    if path.is_file():
        backend = tokenizers.Tokenizer.from_file(str(path))
    else:
        backend = train_bpe(texts, vocab_size)
        atomic_write(path, lambda tmp: backend.save(tmp))
    learned = backend.get_vocab_size()
    if learned < vocab_size:
        warn(f"data.tokenizer.bpe: the training text supports {learned} tokens (a merge must occur at least {MIN_MERGE_COUNT} times), "
             f"not {vocab_size}; using {learned}. Give more text, or set data.tokenizer.bpe (and model.vocab) to {learned}")
    return wrap_bpe(backend, f"bpe-{vocab_size}")


def train_bpe(texts: list[str], vocab_size: int) -> tokenizers.Tokenizer:
    """Byte-level BPE: every byte is a token, so any text encodes and decodes back exactly. The trainer counts each
    pre-token in pieces of at most LONGEST_TRAINED_WORD bytes; the tokenizer it gives pre-tokenizes without cutting."""
    backend = tokenizers.Tokenizer(models.BPE())
    # ByteLevel maps every byte to one character, so the pieces are bytes of the pre-token (`.` matches each of them)
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(add_prefix_space=False),
                                                     pre_tokenizers.Split(Regex(f".{{1,{LONGEST_TRAINED_WORD}}}"), "isolated")])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_MERGE_COUNT,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer, length=len(texts))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return backend


def wrap_bpe(backend: tokenizers.Tokenizer, name: str) -> Tokenizer:
    from transformers import PreTrainedTokenizerFast

    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN), name)


def load_hf_tokenizer(name: str) -> Tokenizer:
    """A Hugging Face tokenizer from a local folder or the local HF cache; never downloads (fails fast)."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception:
        raise DataError(
            f"data.tokenizer.hf: tokenizer {name!r} is not available offline (neither a local folder nor in the "
            f"Hugging Face cache); download it once with `hf download {name}` or use data.tokenizer: {{bpe: N}}"
        ) from None
    return Tokenizer(hf, name)


def ids_fingerprint(identity: str, eos_id: int | None, pad_id: int | None) -> str:
    """A hash of everything that decides a tokenizer's ids: its backend's serialization (or its name and size) and its
    end and pad ids (Tokenizer.fingerprint; a prepared set's manifest keeps it)."""
    return hashlib.sha256(f"{identity}|eos {eos_id}|pad {pad_id}".encode()).hexdigest()


def check_token_ids(max_id: int, vocab: int | None, name: str, vocab_size: int) -> None:
    """Every id that occurs must index the model's embedding; unused ids beyond it do not matter. `name` and `vocab_size`:
    the tokenizer's that made the ids."""
    if vocab is not None and max_id >= vocab:
        raise DataError(
            f"data.tokenizer: {name} produced token id {max_id} (vocabulary {vocab_size}) "
            f"but model.vocab is {vocab}; raise model.vocab to at least {max_id + 1} or choose a smaller tokenizer"
        )
