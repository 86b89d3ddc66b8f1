"""Text documents for the language model: where they come from and how training and validation split.

Sources (`data.source`):
- builtin: the documentation the Python standard library carries (docstrings and pydoc topics),
  extracted once per Python version in a separate interpreter (stdlib_docs.py) and cached as JSON.
- text: local files or globs; documents are separated by blank lines.
- hf: any `datasets` dataset, by Hub name, local folder, or packaged builder (e.g. `json`) with
  `data.path` as its data files; downloaded or streamed. The Hub is probed first with a short timeout
  so that an offline machine gets one clear sentence instead of minutes of retries.

Validation never overlaps training. With a validation split (hf) the two splits are used as they are;
otherwise a document is held out when a hash of its text falls below `data.val_fraction`, so the split
does not move when documents are added or reordered, and identical documents land on the same side.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from blockforge.spec.data import DataConfig
from blockforge.errors import DataError
from blockforge.io import atomic_write_json

EXTRACTOR = Path(__file__).with_name("stdlib_docs.py")
EXTRACT_TIMEOUT_S = 300
HUB_PROBE_TIMEOUT_S = 5.0


@dataclass
class Corpus:
    """Documents held in memory, already split; `info` describes the source for logs and model cards."""

    train: list[str]
    val: list[str]
    info: dict[str, Any] = field(default_factory=dict)

    def content_hash(self) -> str:
        return text_hash([text_hash(self.train), text_hash(self.val)])


def text_hash(texts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))  # length-prefixed: ["ab"] and ["a", "b"] differ
        digest.update(data)
    return digest.hexdigest()


def validation_score(text: str) -> float:
    """A number in [0, 1) fixed by the text alone; documents scoring below val_fraction are held out."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_by_hash(documents: list[str], val_fraction: float, key: str) -> tuple[list[str], list[str]]:
    """(train, val) by validation_score; both sides get at least one document on tiny corpora."""
    distinct = len(set(documents))
    if distinct < 2:
        raise DataError(
            f"{key}: found {distinct} distinct document(s), but at least 2 are needed to hold one out "
            "for validation; add text (documents are separated by blank lines)"
        )
    scores = sorted({validation_score(doc) for doc in documents})
    held_out = sum(score < val_fraction for score in scores)
    threshold = scores[min(max(held_out, 1), len(scores) - 1) - 1]
    train = [doc for doc in documents if validation_score(doc) > threshold]
    val = [doc for doc in documents if validation_score(doc) <= threshold]
    return train, val


def source_key(cfg: DataConfig) -> str:
    """The recipe key to name when a text source's documents are the problem."""
    return {"builtin": "data.source", "text": "data.path", "hf": "data.dataset"}[cfg.source]


def load_corpus(cfg: DataConfig, cache_dir: Path) -> Corpus:
    """All documents of a builtin, text or (downloaded, not streamed) hf source, split."""
    if cfg.source == "builtin":
        documents, info = builtin_documents(cache_dir)
        return Corpus(*split_by_hash(documents, cfg.val_fraction, source_key(cfg)), info)
    if cfg.source == "text":
        files = expand_paths(cfg.path)
        documents = read_text_files(files)
        if not documents:
            raise DataError(f"data.path: there is no text in {describe_paths(files)}; point it at non-empty text files")
        return Corpus(*split_by_hash(documents, cfg.val_fraction, source_key(cfg)), {"source": "text", "files": len(files)})
    info = {"source": "hf", "dataset": cfg.dataset, "name": cfg.name, "split": cfg.split, "val_split": cfg.val_split}
    train = hf_split_texts(cfg, cfg.split)
    if cfg.val_split is None:
        return Corpus(*split_by_hash(train, cfg.val_fraction, "data.split"), info)
    return Corpus(train, hf_split_texts(cfg, cfg.val_split), info)


# --- builtin: the standard library's documentation ------------------------------------------------


def builtin_key() -> str:
    """What decides the builtin corpus: the Python it is extracted from and the extractor's own source."""
    python = ".".join(map(str, sys.version_info[:3]))
    extractor_hash = hashlib.sha256(EXTRACTOR.read_bytes()).hexdigest()[:12]
    return f"{sys.implementation.name}{python}-{extractor_hash}"


def builtin_documents(cache_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """The stdlib documentation corpus, extracted on first use and then read from the cache.

    The cache is keyed by the Python version and by the extractor's own source, so a change to the
    extraction rules is picked up without clearing anything.
    """
    python = ".".join(map(str, sys.version_info[:3]))
    path = Path(cache_dir) / "builtin" / f"stdlib-docs-{builtin_key()}.json"
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        documents, seconds = extract_stdlib_documents()
        cached = {"python": python, "extraction_s": round(seconds, 2), "documents": documents}
        atomic_write_json(path, cached)
    info = {"source": "builtin", "python": cached["python"], "extraction_s": cached["extraction_s"]}
    return cached["documents"], info


def extract_stdlib_documents() -> tuple[list[str], float]:
    """Run the extractor in a fresh interpreter (no cache); returns the documents and the seconds taken.

    -I keeps the user's environment variables and this package's folder off sys.path, -S keeps
    site-packages out (only the real stdlib is read), -B writes no bytecode into the stdlib folder.
    Output is captured: modules that print or warn on import never reach the user's terminal.
    """
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "documents.json"
        try:
            result = subprocess.run(
                [sys.executable, "-I", "-S", "-B", str(EXTRACTOR), str(out)],
                cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=EXTRACT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise DataError(
                f"data.source: extracting the builtin corpus took over {EXTRACT_TIMEOUT_S} s and was stopped; "
                "use data.source: text with local files instead"
            ) from None
        if result.returncode != 0 or not out.exists():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise DataError(f"data.source: extracting the builtin corpus failed ({last}); use data.source: text instead")
        documents = json.loads(out.read_text(encoding="utf-8"))
    return documents, time.perf_counter() - started


# --- text: local files --------------------------------------------------------------------------


def describe_paths(path: str | list[str] | None) -> str:
    return ", ".join(repr(p) for p in ([path] if isinstance(path, str) else path or []))


def expand_paths(path: str | list[str] | None) -> list[str]:
    """Files named by a path, a glob or a list of them (relative to the working directory), in order."""
    files: list[str] = []
    for pattern in [path] if isinstance(path, str) else path or []:
        if glob.has_magic(pattern):
            matches = sorted(m for m in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(m))
            if not matches:
                raise DataError(f"data.path: the glob {pattern!r} matches no files (relative to {os.getcwd()}); fix the pattern")
            files += matches
        elif os.path.isfile(os.path.expanduser(pattern)):
            files.append(os.path.expanduser(pattern))
        else:
            raise DataError(f"data.path: {pattern!r} is not a file (relative to {os.getcwd()}); check the path")
    if not files:
        raise DataError("data.path: no files given; name text files or globs")
    return list(dict.fromkeys(files))  # a file named twice (say by two globs) is read once


def read_text_files(files: list[str]) -> list[str]:
    """Blank-line separated documents of UTF-8 text files, read with the `datasets` text builder."""
    import datasets

    stream = datasets.load_dataset("text", data_files=files, sample_by="paragraph", split="train", streaming=True)
    try:
        return [doc for example in stream if (doc := example["text"].strip())]
    except (UnicodeDecodeError, OSError) as err:
        raise DataError(
            f"data.path: cannot read {describe_paths(files)} as UTF-8 text ({type(err).__name__}); give text files"
        ) from None


# --- hf: `datasets` datasets ------------------------------------------------------------------


def split_key(cfg: DataConfig, split: str) -> str:
    return "data.split" if split == cfg.split else "data.val_split"


def is_hub_dataset(cfg: DataConfig) -> bool:
    """Whether data.dataset names a Hub repository (not a packaged builder such as json, not a local folder)."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return cfg.dataset not in _PACKAGED_DATASETS_MODULES and not os.path.exists(cfg.dataset)


def check_hub_reachable(dataset: str) -> None:
    """Fail in seconds when the Hub cannot be reached (`datasets` alone retries for ~25 s, then fails)."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        return  # offline mode: `datasets` reads its cache and fails fast by itself
    if urllib.request.getproxies().get("https"):
        return  # only the proxy knows whether the Hub is reachable
    endpoint = urllib.parse.urlsplit(datasets.config.HF_ENDPOINT)
    try:
        port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError:
        raise DataError(
            f"data.dataset: cannot reach the Hugging Face Hub to load {dataset!r} (offline?); download it first "
            "(then set HF_HUB_OFFLINE=1 to use the cached copy) or point data.source: text at local files"
        ) from None


def open_hf_split(cfg: DataConfig, split: str, *, streaming: bool):
    """One split of data.dataset as a `datasets` Dataset, or an IterableDataset when streaming."""
    import datasets

    key = split_key(cfg, split)
    data_files = expand_paths(cfg.path) if cfg.path else None
    if is_hub_dataset(cfg):
        check_hub_reachable(cfg.dataset)
    try:
        return datasets.load_dataset(cfg.dataset, cfg.name, split=split, data_files=data_files, streaming=streaming)
    except ConnectionError:
        raise DataError(
            f"data.dataset: cannot reach the Hugging Face Hub to load {cfg.dataset!r} and it is not in the local cache; "
            "download it first or point data.source: text at local files"
        ) from None
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(
            f"data.dataset: {cfg.dataset!r} is neither a local folder, a `datasets` builder nor a Hub dataset; check the name"
        ) from None
    except Exception as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(
            f"{key if 'split' in message.lower() else 'data.dataset'}: cannot load split {split!r} of {cfg.dataset!r} "
            f"({message}); check data.dataset, data.name and {key}"
        ) from None


def hf_split_texts(cfg: DataConfig, split: str) -> list[str]:
    """The texts of a whole (downloaded) split."""
    texts = list(hf_texts(open_hf_split(cfg, split, streaming=False), cfg))
    if not texts:
        key = split_key(cfg, split)
        raise DataError(
            f"{key}: split {split!r} of {cfg.dataset!r} has no text in column {cfg.text_field!r}; check {key} and data.text_field"
        )
    return texts


def hf_texts(examples: Iterable[dict], cfg: DataConfig) -> Iterator[str]:
    """The stripped, non-empty `data.text_field` of each example; a file that cannot be parsed is a DataError."""
    try:
        for example in examples:
            if cfg.text_field not in example:
                raise DataError(
                    f"data.text_field: {cfg.dataset!r} has no column {cfg.text_field!r}; choose one of: {', '.join(example)}"
                )
            text = example[cfg.text_field]
            if text is not None and not isinstance(text, str):
                raise DataError(
                    f"data.text_field: column {cfg.text_field!r} of {cfg.dataset!r} holds {type(text).__name__}, not text"
                )
            if text and (text := text.strip()):
                yield text
    except DataError:
        raise
    except Exception as err:  # parse errors of local files, a connection lost while streaming
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(
            f"data.dataset: reading {cfg.dataset!r} failed ({type(err).__name__}: {message}); check its files or connection"
        ) from None
