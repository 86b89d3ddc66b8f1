"""Prepared sets: a recipe's text tokenized once into memory-mappable shards, and the one reader of token rows.

A prepared set is a folder, local or in a storage named by a URI (blockforge.storage):

    manifest.json          what the set holds and how it was made; written last, so a folder without it is no set
    tokenizer/             the tokenizer that made the ids (a trained BPE is trained once, and kept here)
    train/000000.bin       token ids (uint16 where the vocabulary fits, else uint32): documents one after another,
                           each followed by the end-of-document id
    train/000000.idx       int64 offsets of the documents in that shard (documents + 1 of them, from 0)
    val/000000.bin, ...    the same for validation
    parts/, preparing.json what preparation keeps to resume by part (data/prepare.py)

Rows come from the shards by arithmetic, in one of two layouts (the manifest's `layout`):
- packed: the split's tokens, concatenated over its shards, cut into windows of context + 1 tokens that overlap
  by one (window i starts at token i * context), so every token is a target exactly once;
- documents: one row per document, truncated to context + 1 tokens (shards keep only those) and padded with the
  tokenizer's pad id, which the loss ignores (the Mix-LN paper's C4 setup).
These are the rows the in-memory sources always had (text.py), so a run on a set trains on the same batches.

Training reads row indices in an order drawn per epoch from (seed, epoch) (batching.py): the row at data position p
is found by arithmetic, so resuming at any position costs the same. A large set's epoch order is kept in the
node's cache once drawn, so a resumed run on that node does not draw it again.

A set in a storage is read from a copy in the node's cache (BLOCKFORGE_CACHE/storage/prepared/...): each node
takes down each file once, under a lock, checks it against the manifest's checksum and only then moves it into
place, so a half-taken-down shard is never read; every trial of the node then reads the one copy. Opening a set
checks its files' sizes and offsets against the manifest, and its manifest's counts against those sizes; each shard's
bytes are checked against their sha256 (and its ids against max_token_id) when a process first reads from it, in the
reading thread, so no byte is trained on unchecked however old an earlier check is.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from blockforge.data.batching import derived_seed, epoch_order, shuffled_batches
from blockforge.data.tokenizer import check_token_ids, ids_fingerprint
from blockforge.errors import DataError
from blockforge.io import atomic_write, atomic_write_json, read_mapping
from blockforge.spec.data import DataConfig
from blockforge.storage import Storage, cache_root, is_uri

if TYPE_CHECKING:
    import torch

FORMAT = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer"
PARTS = "parts"  # each part's record and its splits' token counts, as prepare.py wrote them
SPLITS = ("train", "val")
FILES = ("bin", "idx")  # per shard: the tokens and the document offsets
HASH_CHUNK = 16 * 2**20
SAMPLE_TOKENS = 10_000_000  # a stream's validation tokens (the Mix-LN paper evaluates on ~10M C4 validation tokens)
# Drawing the permutation of a set with this many rows takes long enough (about 0.15 s at 2^22 on one core) that it
# is kept in the node's cache once drawn.
SAVED_ORDER_ROWS = 2**22


# ---- what a set is -----------------------------------------------------------------------------------


# The data settings that decide a set's tokens, by source: what a manifest records and a recipe must match.
SOURCE_KEYS = {
    "builtin": (),
    "text": ("path",),
    "hf": ("dataset", "name", "path", "split", "val_split", "text_field", "streaming"),
}


def data_settings(cfg: DataConfig) -> dict[str, Any]:
    """`cfg`'s settings that decide which tokens a set holds (not `prepared`, not the image keys), by recipe key."""
    from blockforge.spec.strict import canonical

    settings: dict[str, Any] = {"source": cfg.source}
    for key in SOURCE_KEYS[cfg.source]:
        settings[key] = getattr(cfg, key)
    if cfg.source != "hf" or cfg.val_split is None:  # a hold-out by hash
        settings["val_fraction"] = cfg.val_fraction
    settings["tokenizer"] = {k: v for k, v in canonical(cfg.tokenizer).items() if v is not None}
    if cfg.tokenizer.bpe is not None:
        settings["bpe_train_chars"] = cfg.bpe_train_chars
    return settings


def unigram_log_probs(counts: np.ndarray) -> np.ndarray:
    """The unigram model of token `counts` (one per vocabulary id): log frequencies, add-one smoothed over the vocabulary."""
    counts = counts.astype(np.float64)
    return np.log(counts + 1.0) - np.log(counts.sum() + len(counts))


@dataclass(frozen=True)
class Layout:
    """How a set's tokens become rows of context + 1 tokens (see the module's docstring)."""

    pack: bool
    context: int

    @property
    def name(self) -> str:
        return "packed" if self.pack else "documents"

    def to_plain(self) -> dict[str, Any]:
        return {"pack": self.pack, "context": self.context}

    def rows(self, tokens: int, documents: int) -> int:
        """Rows of a split holding `tokens` tokens in `documents` documents."""
        if self.pack:
            return (tokens - 1) // self.context if tokens > self.context else 0
        return documents

    def rows_for(self, tokens: int) -> int:
        """Rows that give `tokens` training tokens (each row gives `context` targets)."""
        return -(-tokens // self.context)


def set_key(cfg: DataConfig, layout: Layout) -> str:
    """What names the rows a recipe trains on, whatever budget a set of them was prepared to: its data settings and
    layout (a search finds the set of each trial by it)."""
    from blockforge.spec.strict import stable_hash

    return stable_hash({"data": data_settings(cfg), "layout": layout.to_plain(), "format": FORMAT})


def recipe_layout(recipe) -> Layout:
    return Layout(pack=recipe.data.pack, context=recipe.spec.context)


# ---- the manifest ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardInfo:
    name: str  # "train/000000": its files are name.bin and name.idx
    documents: int  # documents the set uses (a stream's last shard may hold more)
    tokens: int  # tokens of those documents, as stored
    files: dict[str, dict[str, Any]]  # "bin"/"idx" -> {"bytes", "sha256"}

    def file(self, kind: str) -> str:
        return f"{self.name}.{kind}"


@dataclass(frozen=True)
class SplitInfo:
    shards: tuple[ShardInfo, ...]
    documents: int
    tokens: int  # as stored (documents rows keep context + 1 tokens of each)
    source_tokens: int  # before truncation

    def rows(self, layout: Layout) -> int:
        return layout.rows(self.tokens, self.documents)


@dataclass(frozen=True)
class Manifest:
    """What a prepared set holds: read from manifest.json, checked as it is read."""

    fingerprint: str
    key: str  # set_key: the data settings and layout, without the budget
    data: dict[str, Any]
    layout: Layout
    tokenizer: dict[str, Any]  # name, fingerprint, vocab_size, eos_id, pad_id
    dtype: str
    max_token_id: int
    requested_tokens: int | None  # a stream's training tokens asked for; None: a finite source, prepared whole
    splits: dict[str, SplitInfo]
    unigram_val_ppl: float | None
    info: dict[str, Any]
    raw: dict[str, Any]

    def files(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every shard file (relative path, {"bytes", "sha256"})."""
        for split in self.splits.values():
            for shard in split.shards:
                for kind in FILES:
                    yield shard.file(kind), shard.files[kind]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @staticmethod
    def parse(data: Any, where: str) -> "Manifest":
        """A manifest from its JSON data, or one sentence naming the file when it is not one."""
        path = f"{where}/{MANIFEST}"

        def bad(why: str) -> ManifestError:
            return ManifestError(path, f"is not the manifest of a prepared set ({why})", "prepare the set again with `blockforge prepare`")

        if not isinstance(data, dict) or data.get("kind") != "blockforge prepared set":
            raise bad("it does not say it is one")
        if data.get("format") != FORMAT:
            raise bad(f"format {data.get('format')!r}, and this blockforge reads format {FORMAT}")
        try:
            layout = Layout(pack=bool(data["layout"]["pack"]), context=int(data["layout"]["context"]))
            splits = {}
            for name in SPLITS:
                split = data["splits"][name]
                shards = tuple(ShardInfo(str(s["name"]), int(s["documents"]), int(s["tokens"]),
                                         {kind: {"bytes": int(s["files"][kind]["bytes"]), "sha256": str(s["files"][kind]["sha256"])}
                                          for kind in FILES})
                               for s in split["shards"])
                splits[name] = SplitInfo(shards, int(split["documents"]), int(split["tokens"]), int(split["source_tokens"]))
            tokenizer = dict(data["tokenizer"])
            for key in ("name", "fingerprint", "vocab_size", "eos_id", "pad_id"):
                tokenizer[key]  # noqa: B018 - present, or KeyError below
            dtype = str(data["dtype"])
            if dtype not in ("uint16", "uint32"):
                raise ValueError(f"dtype {dtype!r}")
            manifest = Manifest(
                fingerprint=str(data["fingerprint"]), key=str(data["key"]), data=dict(data["data"]), layout=layout,
                tokenizer=tokenizer, dtype=dtype, max_token_id=int(data["max_token_id"]),
                requested_tokens=None if data.get("requested_tokens") is None else int(data["requested_tokens"]),
                splits=splits, unigram_val_ppl=data.get("unigram_val_ppl"), info=dict(data.get("info") or {}), raw=data,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise bad(f"{type(err).__name__}: {err}") from None
        problem = source_problem(data.get("source"))
        if problem is not None:
            raise bad(problem)
        for name, split in manifest.splits.items():
            if sum(s.documents for s in split.shards) != split.documents or sum(s.tokens for s in split.shards) != split.tokens:
                raise bad(f"the {name} split's shards do not add up to its counts")
            for shard in split.shards:
                if not re.fullmatch(rf"{name}/\d{{6,}}", shard.name):
                    raise bad(f"shard {shard.name!r} is not a shard of its split's folder ({name}/NNNNNN)")
        manifest._check_order(path)
        manifest._check_counts(path)
        return manifest

    def _check_order(self, path: str) -> None:
        """Each split lists its shards once each, in the order they were written (by number): a shard listed twice would
        be trained on twice, and shards listed in another order give other rows."""
        for name, split in self.splits.items():
            seen: set[str] = set()
            for i, shard in enumerate(split.shards):
                if shard.name in seen:
                    raise _edited(path, f"splits.{name}.shards[{i}] lists {shard.name} again")
                before = split.shards[i - 1].name if i else None
                if before is not None and int(shard.name.split("/")[1]) < int(before.split("/")[1]):
                    raise _edited(path, f"splits.{name}.shards[{i}] lists {shard.name} after {before}, out of the order they were written in")
                seen.add(shard.name)

    def _check_counts(self, path: str) -> None:
        """Each shard's counts against the sizes its files are recorded with: a shard's files hold exactly its counts (a
        stream's last shard of a split, cut at a document, at least them), so no edited count or dtype reads past a
        file's end or leaves part of one unread."""
        for name, split in self.splits.items():
            for i, shard in enumerate(split.shards):
                key = f"splits.{name}.shards[{i}]"
                if shard.documents < 1 or shard.tokens < shard.documents:  # every document holds at least its end id
                    raise _edited(path, f"{key}: {shard.documents:,} documents of {shard.tokens:,} tokens")
                cut = self.requested_tokens is not None and i == len(split.shards) - 1
                for field, count, kind, width in (("tokens", shard.tokens, "bin", self.np_dtype.itemsize),
                                                  ("documents", shard.documents + 1, "idx", 8)):
                    size = shard.files[kind]["bytes"]
                    held, rest = divmod(size, width)
                    if rest or held < count or (held > count and not cut):
                        raise _edited(path, f"{key}.{field} is {getattr(shard, field):,}, but {shard.file(kind)} is recorded with "
                                            f"{size:,} bytes: {held:,} {f'{self.dtype} ids' if kind == 'bin' else 'int64 offsets'}")


class ManifestError(DataError):
    """A manifest.json that is not one, or that its own shards contradict: `path` and `reason` say which and why (for a caller
    whose fix is another, such as `prepare` finding it in the folder it prepares into)."""

    def __init__(self, path: str, reason: str, fix: str):
        super().__init__(f"data.prepared: {path} {reason}; {fix}")
        self.path, self.reason = path, reason


def _edited(path: str, what: str) -> ManifestError:
    return ManifestError(path, f"does not agree with its own shards ({what})", "the manifest was changed or damaged: prepare the set again")


def source_problem(recorded: Any) -> str | None:
    """What is wrong with the record of a set's source (data/prepare.py `source_record`) as a manifest or a preparation in
    progress keeps it: its key path and why; None for a record of the right shape, or none (an earlier blockforge wrote none)."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or not set(recorded) <= {"builtin", "files"}:
        return "source: is not a record of the builtin corpus or of files"
    if "builtin" in recorded and not isinstance(recorded["builtin"], str):
        return "source.builtin: is not text"
    files = recorded.get("files", [])
    if not isinstance(files, list):
        return "source.files: is not a list"
    paths = set()
    for i, entry in enumerate(files):
        key = f"source.files[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"path", "bytes", "sha256"}:
            return f"{key}: is not a file's path, bytes and sha256"
        if not isinstance(entry["path"], str) or entry["path"] in paths:
            return f"{key}.path: is not text, or names a file named before"
        if isinstance(entry["bytes"], bool) or not isinstance(entry["bytes"], int) or entry["bytes"] < 0:
            return f"{key}.bytes: is not a whole number of bytes"
        if not isinstance(entry["sha256"], str) or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
            return f"{key}.sha256: is not a sha256 in hex"
        paths.add(entry["path"])
    return None


def read_manifest(folder: Path, where: str) -> Manifest:
    path = folder / MANIFEST
    if not path.is_file():
        raise missing_set(where)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise DataError(f"data.prepared: {where}/{MANIFEST} is not the manifest of a prepared set (it does not read as JSON: "
                        f"{type(err).__name__}); prepare the set again with `blockforge prepare`") from None
    return Manifest.parse(data, where)


def missing_set(where: str) -> DataError:
    return DataError(f"data.prepared: {where} holds no prepared set (there is no {MANIFEST}); prepare one with "
                     f"`blockforge prepare RECIPE --out {where}`, or fix the path")


# ---- checking a set against a recipe -----------------------------------------------------------------


def check_matches(manifest: Manifest, cfg: DataConfig, layout: Layout, vocab: int | None, where: str) -> None:
    """Refuse, naming the first key that differs, a set made from other data, another tokenizer, context or layout."""
    wanted = data_settings(cfg)
    for key in dict.fromkeys([*wanted, *manifest.data]):
        ours, theirs = wanted.get(key), manifest.data.get(key)
        if _plain(ours) != _plain(theirs):
            raise DataError(f"data.prepared: {where} was prepared with data.{key} = {_show(theirs)}, but the recipe has "
                            f"{_show(ours)}; prepare a set for this recipe (blockforge prepare RECIPE --out PATH), or set "
                            f"data.{key} to {_show(theirs)}")
    if manifest.layout.context != layout.context:
        raise DataError(f"data.prepared: {where} holds rows for model.context {manifest.layout.context}, but the recipe has "
                        f"{layout.context}; prepare a set for this context, or set model.context: {manifest.layout.context}")
    if manifest.layout.pack != layout.pack:
        raise DataError(f"data.prepared: {where} holds {manifest.layout.name} rows (data.pack {str(manifest.layout.pack).lower()}), "
                        f"but the recipe has data.pack {str(layout.pack).lower()}; prepare a set with this layout, or set "
                        f"data.pack: {str(manifest.layout.pack).lower()}")
    if vocab is not None and manifest.max_token_id >= vocab:
        raise DataError(f"data.prepared: {where} holds token id {manifest.max_token_id} ({manifest.tokenizer['name']}, vocabulary "
                        f"{manifest.tokenizer['vocab_size']}), but model.vocab is {vocab}; raise model.vocab to at least "
                        f"{manifest.max_token_id + 1} or prepare the set with a smaller tokenizer")


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _show(value: Any) -> str:
    return "not set" if value is None else json.dumps(value, default=str)


# ---- files: their sizes when a set is opened, their bytes when a shard is first read ------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_files(folder: Path, manifest: Manifest, where: str) -> None:
    """Every shard file is there at the size its manifest records, and each shard's offsets run from 0 to its token count:
    a stat and two numbers a shard, when a set is opened. The bytes themselves are checked when first read (ShardCheck)."""
    for name, split in manifest.splits.items():
        for i, shard in enumerate(split.shards):
            for kind in FILES:
                rel = shard.file(kind)
                try:
                    size = (folder / rel).stat().st_size
                except OSError:
                    size = None
                _check_size(where, rel, size, shard.files[kind]["bytes"])
            first, last = _offsets_at(folder / shard.file("idx"), (0, shard.documents))
            if first != 0 or last != shard.tokens:
                raise DataError(f"data.prepared: {where}/{MANIFEST}: splits.{name}.shards[{i}] holds {shard.documents:,} documents of "
                                f"{shard.tokens:,} tokens, but {shard.file('idx')} puts them at tokens {first:,} to {last:,}; the "
                                "manifest or the index was changed: prepare the set again")


def _check_size(where: str, rel: str, size: int | None, expected: int) -> None:
    """A shard file of `size` bytes (None: missing) against the size its manifest records."""
    if size is None:
        raise DataError(f"data.prepared: {where}/{rel} is missing; the set is incomplete: prepare it again (an interrupted "
                        "`blockforge prepare` resumes)")
    if size != expected:
        raise DataError(f"data.prepared: {where}/{rel} holds {size:,} bytes, not the {expected:,} its manifest gives (cut short "
                        "or replaced); prepare the set again")


def _offsets_at(path: Path, positions: tuple[int, ...]) -> list[int]:
    """The int64 offsets at `positions` of an index file, read without mapping it."""
    with open(path, "rb") as f:
        found = []
        for position in positions:
            f.seek(position * 8)
            found.append(int(np.frombuffer(f.read(8), dtype=np.int64)[0]))
        return found


class ShardCheck:
    """Each shard's files against the manifest's checksums, and its ids against its `max_token_id`, the first time this
    process reads from the shard: in the thread that reads (the loop's feed, ahead of the step), before any of its rows
    is given out. A file's size and time say nothing of a flipped bit (bit rot keeps both), so nothing is trusted from
    an earlier check; the cost (sha256 at about 1.7 GB/s a core, once per shard and run) is in docs/concepts/data.md.
    A node's copy of a set in a storage that fails is removed, so the next run takes it down again."""

    def __init__(self, folder: Path, manifest: Manifest, where: str, node_copy: bool):
        self.folder, self.manifest, self.where, self.node_copy = folder, manifest, where, node_copy
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, shard: ShardInfo) -> None:
        if shard.name in self._checked:
            return
        with self._lock:
            if shard.name not in self._checked:
                self._check(shard)
                self._checked.add(shard.name)

    def _check(self, shard: ShardInfo) -> None:
        digest, largest = _digest(self.folder / shard.file("bin"), self.manifest.np_dtype, shard.tokens)
        for kind, found in (("bin", digest), ("idx", sha256_file(self.folder / shard.file("idx")))):
            if found != shard.files[kind]["sha256"]:
                raise self._damaged(shard.file(kind))
        if largest > self.manifest.max_token_id:
            raise DataError(f"data.prepared: {self.where}/{MANIFEST}: max_token_id is {self.manifest.max_token_id:,}, but "
                            f"{shard.file('bin')} holds id {largest:,}; the manifest was changed: prepare the set again")

    def _damaged(self, rel: str) -> DataError:
        if self.node_copy:
            (self.folder / rel).unlink(missing_ok=True)
            return DataError(f"data.prepared: {self.folder / rel}, this node's copy of {self.where}/{rel}, fails its checksum "
                             "(damaged on this disk); it is removed, and the next run takes it down again")
        return DataError(f"data.prepared: {self.where}/{rel} fails its checksum (its bytes are not those the manifest records: "
                         "damaged or changed); prepare the set again")


def _digest(path: Path, dtype: np.dtype, count: int) -> tuple[str, int]:
    """The sha256 of the file at `path` and the largest of its first `count` ids, in one read."""
    digest, largest, seen = hashlib.sha256(), -1, 0
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):  # HASH_CHUNK is a whole number of ids
            digest.update(chunk)
            used = min(len(chunk) // dtype.itemsize, count - seen)
            if used > 0:
                largest = max(largest, int(np.frombuffer(chunk, dtype=dtype, count=used).max()))
            seen += len(chunk) // dtype.itemsize
    return digest.hexdigest(), largest


# ---- a set in a storage: the node's copy -------------------------------------------------------------

FETCHED = "fetched.jsonl"  # in a node's copy: one line per file taken down (what, how large, how long)
FETCH_WAIT_S = 6 * 3600.0  # how long a process waits for another one of its node to take a set down


def remote_manifest(storage: Storage) -> tuple[Manifest, bytes]:
    """The manifest of the set in `storage`, read there (nothing is taken down), and its bytes."""
    where = str(storage)
    with storage.failing_as("read the prepared set", "check data.prepared, the storage and its credentials"):
        data = storage.read_bytes(MANIFEST)
    if data is None:
        raise missing_set(where)
    try:
        parsed = json.loads(data)
    except ValueError:
        raise DataError(f"data.prepared: {where}/{MANIFEST} is not the manifest of a prepared set (it does not read as JSON); "
                        "prepare the set again with `blockforge prepare`") from None
    return Manifest.parse(parsed, where), data


def check_set(where: str) -> Manifest:
    """The manifest of the set at `where` (a folder or a URI), its files there at the sizes it records (a local set's
    offsets too): what a search checks of a set before Ray starts. Nothing is taken down or hashed."""
    if not is_uri(where):
        folder = Path(where).expanduser()
        manifest = read_manifest(folder, where)
        check_files(folder, manifest, where)
        return manifest
    storage = Storage.open(where)
    manifest = remote_manifest(storage)[0]
    with storage.failing_as("list the prepared set", "check data.prepared, the storage and its credentials"):
        listing = storage.listing()
    for rel, expected in manifest.files():
        _check_size(where, rel, listing.get(rel, (None,))[0], expected["bytes"])
    return manifest


def node_copy(storage: Storage) -> Path:
    """This node's copy of the set in `storage`: each file taken down where it is missing or not the one checked when it
    was taken down (under a lock, so the trials of one node take each file down once), checked against the manifest's
    checksum before it is moved into place. Its readers check the bytes again when they first read them (ShardCheck)."""
    from blockforge.lock import RunLock

    where = str(storage)
    local = storage.working_copy("prepared")
    local.mkdir(parents=True, exist_ok=True)
    manifest, remote_bytes = remote_manifest(storage)
    lock = RunLock(local, "fetch.lock", "taking a prepared set down into it").acquire(wait_s=FETCH_WAIT_S)
    try:
        here, stamp = local / MANIFEST, local / ".checked.json"
        checked = read_mapping(stamp)
        wanted = [(rel, expected) for rel, expected in manifest.files() if not _same(local / rel, checked.get(rel), expected)]
        if here.is_file() and here.read_bytes() == remote_bytes and not wanted:
            check_files(local, manifest, where)
            return local
        here.unlink(missing_ok=True)  # the copy is not a set until every file is in place again
        for name, (size, mtime) in sorted(storage.listing(TOKENIZER).items()):
            storage.download(f"{TOKENIZER}/{name}", local / TOKENIZER / name, mtime)
        for name, (size, mtime) in sorted(storage.listing(PARTS).items()):
            if name.endswith((".json", ".train.counts.npy")):  # the training split's counts (unigram_log_probs), a few kB
                storage.download(f"{PARTS}/{name}", local / PARTS / name, mtime)
        _check_room(local, sum(expected["bytes"] for _, expected in wanted), where)
        for rel, expected in wanted:
            started = time.perf_counter()
            target = local / rel
            staged = target.with_name(f".{target.name}.fetch")
            try:
                storage.download(rel, staged)
            except FileNotFoundError:
                raise DataError(f"data.prepared: {where}/{rel} is missing; the set is incomplete: prepare it again") from None
            if staged.stat().st_size != expected["bytes"] or sha256_file(staged) != expected["sha256"]:
                staged.unlink(missing_ok=True)
                raise DataError(f"data.prepared: {where}/{rel} fails its checksum against the set's manifest (damaged or "
                                "changed in the storage); prepare the set again")
            os.replace(staged, target)
            stat = target.stat()
            checked[rel] = [stat.st_size, stat.st_mtime_ns, expected["sha256"]]
            atomic_write_json(stamp, checked)  # after each file: a copy cut short keeps what it checked
            with open(local / FETCHED, "a") as log:
                log.write(json.dumps({"file": rel, "bytes": expected["bytes"], "seconds": round(time.perf_counter() - started, 3),
                                      "pid": os.getpid(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        check_files(local, manifest, where)
        atomic_write(here, lambda tmp: Path(tmp).write_bytes(remote_bytes))
        return local
    finally:
        lock.release()


def _same(path: Path, seen: list | None, expected: dict) -> bool:
    """Whether the file at `path` is the one a stamp checked: the same size, time and expected checksum."""
    try:
        stat = path.stat()
    except OSError:
        return False
    return seen == [stat.st_size, stat.st_mtime_ns, expected["sha256"]] and stat.st_size == expected["bytes"]


def _check_room(local: Path, needed: int, where: str) -> None:
    import shutil

    free = shutil.disk_usage(local).free
    if needed > free:
        raise DataError(f"data.prepared: taking {where} down needs {needed / 2**30:.1f} GiB in {local}, which has {free / 2**30:.1f} "
                        "GiB free; free space there or set BLOCKFORGE_CACHE to a disk with room")


# ---- reading rows ------------------------------------------------------------------------------------


class SplitRows:
    """The rows of one split of a set, read by index from its memory-mapped shards; each shard checked (`check`) before
    its first row is read. Rows are gathered shard by shard in the shards' dtype, then copied once into int64 rows in
    the order asked (a few numpy calls a shard: a batch spans as many shards as it has rows, at most)."""

    def __init__(self, folder: Path, split: SplitInfo, layout: Layout, dtype: np.dtype, pad_id: int | None,
                 check: Callable[[ShardInfo], None]):
        self.layout, self.pad_id, self.check, self.dtype = layout, pad_id, check, dtype
        self.width = layout.context + 1
        self.shards = split.shards
        # Plain arrays over the maps: numpy's memmap subclass adds its own work to every operation on it.
        self.tokens = [np.asarray(_memmap(folder / s.file("bin"), dtype, s.tokens)) for s in split.shards]
        self.offsets = [np.asarray(_memmap(folder / s.file("idx"), np.dtype(np.int64), s.documents + 1)) for s in split.shards]
        self.token_starts = np.cumsum([0] + [s.tokens for s in split.shards])
        self.doc_starts = np.cumsum([0] + [s.documents for s in split.shards])
        self.total_tokens = int(self.token_starts[-1])
        self.n_rows = layout.rows(self.total_tokens, int(self.doc_starts[-1]))
        self._span = np.arange(self.width, dtype=np.int64)

    def __len__(self) -> int:
        return self.n_rows

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """Rows `indices` as an int64 (len(indices), context + 1) array."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), self.width), dtype=np.int64)
        if len(indices) == 0:
            return out
        positions = indices * self.layout.context if self.layout.pack else indices
        order, runs = self._runs(self.token_starts if self.layout.pack else self.doc_starts, positions)
        values = np.empty(out.shape, dtype=self.dtype)
        (self._packed if self.layout.pack else self._documents)(positions[order], runs, values)
        out[order] = values  # the one copy into the rows, in the order asked
        return out

    @staticmethod
    def _runs(firsts: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray | slice, list[tuple[int, int, int]]]:
        """The order that sorts `positions` (global) by shard (a slice where they lie in one shard) and, in that order, each
        shard's run of them: (shard, start, stop)."""
        shard_of = np.searchsorted(firsts, positions, side="right") - 1
        if (shard_of == shard_of[0]).all():
            return slice(None), [(int(shard_of[0]), 0, len(positions))]
        order = np.argsort(shard_of, kind="stable")
        ordered = shard_of[order]
        bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
        return order, [(int(ordered[start]), start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]

    def _shard(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard `shard`'s tokens and offsets, checked."""
        self.check(self.shards[shard])
        return self.tokens[shard], self.offsets[shard]

    def _packed(self, starts: np.ndarray, runs: list[tuple[int, int, int]], values: np.ndarray) -> None:
        """Windows from global token positions `starts` (sorted by shard) into `values`."""
        for shard, first, stop in runs:
            tokens = self._shard(shard)[0]
            local = starts[first:stop] - self.token_starts[shard]
            inside = local + self.width <= len(tokens)
            if inside.all():
                values[first:stop] = tokens[local[:, None] + self._span]
                continue
            rows = np.arange(first, stop)
            values[rows[inside]] = tokens[local[inside, None] + self._span]
            for row in rows[~inside]:  # a window across the end of its shard
                values[row] = self._across(int(starts[row]))

    def _across(self, start: int) -> np.ndarray:
        parts, need, at = [], self.width, start
        while need:
            shard = int(np.searchsorted(self.token_starts, at, side="right") - 1)
            local = at - int(self.token_starts[shard])
            piece = self._shard(shard)[0][local : local + need]
            parts.append(piece)
            need -= len(piece)
            at += len(piece)
        return np.concatenate(parts)

    def _documents(self, indices: np.ndarray, runs: list[tuple[int, int, int]], values: np.ndarray) -> None:
        """One document a row, from global document indices (sorted by shard) into `values`: its stored tokens (at most
        context + 1), then pad ids."""
        begin, end = np.empty(len(indices), dtype=np.int64), np.empty(len(indices), dtype=np.int64)
        for shard, first, stop in runs:
            offsets = self._shard(shard)[1]
            local = indices[first:stop] - self.doc_starts[shard]
            begin[first:stop], end[first:stop] = offsets[local], offsets[local + 1]
        positions = begin[:, None] + self._span
        np.minimum(positions, (end - 1)[:, None], out=positions)  # a short document's row stays inside it: padded below
        for shard, first, stop in runs:
            values[first:stop] = self.tokens[shard][positions[first:stop]]
        values[self._span >= (end - begin)[:, None]] = self.pad_id

    def documents(self) -> Iterator[np.ndarray]:
        """Every document's stored tokens, in order."""
        for shard in range(len(self.shards)):
            tokens, offsets = self._shard(shard)
            for begin, end in zip(offsets[:-1], offsets[1:]):
                yield np.asarray(tokens[begin:end])


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


class EpochOrders:
    """The order of a split's rows in each epoch, drawn from (seed, epoch) as batching.epoch_order draws it. A large
    set's order is kept in the node's cache once drawn (int32 where the rows fit), so a run resumed at any position of
    any epoch reads it instead of drawing it again."""

    def __init__(self, n: int, seed: int, folder: Path | None):
        self.n, self.seed, self.folder = n, seed, folder

    def __call__(self, epoch: int) -> np.ndarray:
        if self.folder is None or self.n < SAVED_ORDER_ROWS:
            return epoch_order(self.n, self.seed, epoch)
        path = self.folder / f"order-{self.n}-{derived_seed(self.seed, epoch)}.npy"
        try:
            order = np.load(path, mmap_mode="r")
            if order.shape == (self.n,):
                return order
        except (OSError, ValueError):
            pass
        order = epoch_order(self.n, self.seed, epoch)
        order = order.astype(np.int32) if self.n < 2**31 else order

        def write(tmp: str) -> None:
            buffer = io.BytesIO()  # np.save into a file writes with tofile, which may not say when a write falls short
            np.save(buffer, order)
            Path(tmp).write_bytes(buffer.getvalue())

        try:
            atomic_write(path, write)
        except OSError:
            pass  # a cache that cannot be written: the order is drawn again next time
        return order


class PreparedSet:
    """A prepared set opened for reading: its manifest, its files as large as the manifest says and its tokenizer (local,
    or the node's copy of a URI's); each shard's bytes are checked when first read (ShardCheck)."""

    def __init__(self, folder: Path, manifest: Manifest, where: str, node_copy: bool = False):
        self.folder, self.manifest, self.where = folder, manifest, where
        self.check = ShardCheck(folder, manifest, where, node_copy)

    @classmethod
    def open(cls, where: str | os.PathLike) -> "PreparedSet":
        where = str(where)
        if is_uri(where):
            folder = node_copy(Storage.open(where))
            return cls(folder, read_manifest(folder, where), where, node_copy=True)
        folder = Path(where).expanduser()
        if folder.exists() and not folder.is_dir():
            raise DataError(f"data.prepared: {where} is a file, not a prepared set's folder; give the folder `blockforge prepare` wrote")
        manifest = read_manifest(folder, where)
        check_files(folder, manifest, where)
        return cls(folder, manifest, where)

    def tokenizer(self):
        from blockforge.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(self.folder / TOKENIZER)
        tokenizer.name = self.manifest.tokenizer["name"]  # "bpe-8192", "t5-base": what logs, records and exports name it
        if tokenizer.fingerprint != self.manifest.tokenizer["fingerprint"]:
            raise DataError(f"data.prepared: {self.where}/{TOKENIZER} is not the tokenizer the set's ids were made with (its "
                            "fingerprint differs from the manifest's); prepare the set again")
        return tokenizer

    def tokenizer_is_the_sets(self) -> bool:
        """Whether the set's tokenizer files are the tokenizer its ids were made with, checked without loading them into
        `transformers` (training a set's rows never needs them): the fingerprint of tokenizer.json read by `tokenizers`,
        with the manifest's end and pad ids. False where that cannot tell (another kind of saved tokenizer): then
        `tokenizer()` decides."""
        import tokenizers

        try:
            backend = tokenizers.Tokenizer.from_file(str(self.folder / TOKENIZER / "tokenizer.json")).to_str()
        except Exception:  # missing, or not one tokenizers reads: the full load decides
            return False
        ids = self.manifest.tokenizer
        return ids_fingerprint(backend, ids["eos_id"], ids["pad_id"]) == ids["fingerprint"]

    def save_tokenizer(self, directory: Path) -> None:
        """The set's tokenizer files into `directory` (a run folder's tokenizer/), as they are, once checked to be the set's."""
        if not self.tokenizer_is_the_sets():
            self.tokenizer().save(directory)  # loaded and checked by its fingerprint, or refused
            return
        for file in sorted((self.folder / TOKENIZER).iterdir()):
            if file.is_file():
                atomic_write(Path(directory) / file.name, lambda out, file=file: shutil.copyfile(file, out))

    def split(self, name: str, pad_id: int | None) -> SplitRows:
        return SplitRows(self.folder, self.manifest.splits[name], self.manifest.layout, self.manifest.np_dtype, pad_id, self.check)


def training_counts(folder: Path, manifest: Manifest) -> np.ndarray | None:
    """The token counts of the training split's shards, summed from the records of the parts that wrote them (each part
    counts the ids it stored); None when a shard's part record or counts file is missing or does not read."""
    wanted = {shard.name for shard in manifest.splits["train"].shards}
    total, found = None, set()
    for record_file in sorted((folder / PARTS).glob("*.json")):
        try:
            output = json.loads(record_file.read_text(encoding="utf-8"))["outputs"]["train"]
            if output["shard"] not in wanted or output["shard"] in found:
                continue
            counts = np.load(folder / output["counts"], allow_pickle=False)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            return None
        found.add(output["shard"])
        if total is not None and len(total) != len(counts):
            return None
        total = counts.astype(np.int64) if total is None else total + counts
    return total if found == wanted else None


def to_batch(rows: np.ndarray) -> torch.Tensor:
    import torch  # here: checking a set (before a search starts Ray) needs no torch

    return torch.from_numpy(rows if rows.dtype == np.int64 else rows.astype(np.int64))


class PreparedTextDataset:
    """Token rows read by index from a prepared set: the one reader of every text source that is not a raw stream.

    `train_batches(batch_size, start, part)` gives the rows of data positions start * batch_size ... in the epoch order
    of `seed`; with part=(rank, ranks) only that rank's share of each batch is read."""

    kind = "text"

    def __init__(self, prepared: PreparedSet, *, seq_len: int, vocab: int | None, seed: int, empty: dict[str, tuple[str, str]] | None = None):
        manifest = prepared.manifest
        self.prepared, self.manifest = prepared, manifest
        self._tokenizer = None  # loaded when asked for: training reads ids only, and their tokenizer's ids are in the manifest
        self.seq_len, self.seed = seq_len, seed
        self.pad_id = None if manifest.layout.pack else manifest.tokenizer["pad_id"]
        check_token_ids(manifest.max_token_id, vocab, manifest.tokenizer["name"], manifest.tokenizer["vocab_size"])
        self.train = prepared.split("train", self.pad_id)
        self.val = prepared.split("val", self.pad_id)
        for name, rows in (("train", self.train), ("val", self.val)):
            if len(rows) == 0:
                what, fix = (empty or {}).get(name) or (f"data.prepared: {prepared.where}: the {'training' if name == 'train' else 'validation'} split",
                                                         "prepare more text or lower model.context")
                raise DataError(f"{what} has {rows.total_tokens} tokens, fewer than one row of model.context + 1 = {seq_len + 1}; {fix}")
        self.orders = EpochOrders(len(self.train), seed, cache_root() / "prepared" / "orders")

    @property
    def tokenizer(self):
        """The set's tokenizer (loaded, and checked against the manifest, on first use)."""
        if self._tokenizer is None:
            self._tokenizer = self.prepared.tokenizer()
        return self._tokenizer

    def save_tokenizer(self, directory: Path) -> None:
        if self._tokenizer is not None:
            self._tokenizer.save(directory)
        else:
            self.prepared.save_tokenizer(directory)

    def train_batches(self, batch_size: int, start: int = 0, part: tuple[int, int] | None = None) -> Iterator[torch.Tensor]:
        for _, indices in shuffled_batches(len(self.train), batch_size, self.seed, start, part=part, order=self.orders):
            yield to_batch(self.train.rows(indices))

    def val_batches(self, batch_size: int, limit: int | None = None) -> list[torch.Tensor]:
        starts = range(0, len(self.val), batch_size)[:limit]
        return [to_batch(self.val.rows(np.arange(i, min(i + batch_size, len(self.val))))) for i in starts]

    def unigram_perplexity(self) -> float | None:
        return self.manifest.unigram_val_ppl

    def unigram_log_probs(self) -> np.ndarray | None:
        """The unigram model of the training split (the counts its parts recorded as they were prepared), or None where
        the set does not hold them (a copy taken down without its parts' records)."""
        counts = training_counts(self.prepared.folder, self.manifest)
        if counts is None:
            return None

        return unigram_log_probs(counts)

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        info = {
            **m.info,
            "tokens": {name: m.splits[name].source_tokens for name in SPLITS},
            "rows": {"train": len(self.train), "val": len(self.val)},
            "tokenizer": m.tokenizer["name"],
            "vocab_size": m.tokenizer["vocab_size"],
            "seq_len": self.seq_len,
            "pack": self.pad_id is None,
            "prepared": self.prepared.where,
            "prepared_fingerprint": m.fingerprint,
        }
        if m.unigram_val_ppl is not None:
            info["unigram_val_ppl"] = round(m.unigram_val_ppl, 2)
        return info
