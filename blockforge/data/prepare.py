"""Preparation: a recipe's text tokenized once, in parts that run in parallel, into a prepared set (prepared.py).

The work is cut into parts. A finite source (builtin, text, a downloaded hf set) is loaded whole and cut into
chunks of documents; a stream (hf with `data.streaming`) into its own shards (its files), taken in their order.
One worker tokenizes a part, in this process or as a Ray task anywhere on a cluster, writes its shard files into
the set's folder, then a record of them (parts/NAME.json): an interrupted preparation resumes by part. When every
part it needs is done, the manifest is written, last: only then is the folder a set.

A stream has no end, so a request says how many training tokens to take (tokens of rows: each row gives context
targets). Its parts are taken in order until they hold that many; the last one is cut at a document. The set fixes
that order (the stream's files in order, documents in file order), which is not the order of a shuffled stream. A
stream that ends first is one sentence saying how much it held. A finite source is prepared whole (it repeats in
epochs as it trains). Validation: a finite source's whole hold-out; a stream's first VAL_TOKENS tokens (its
validation split, or the hash hold-out of what was read for training).

One preparation writes a folder at a time: a local folder holds an flock (prepare.lock), a storage a lease
(prepare.lease) renewed while the work goes on and checked before the manifest is written.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import math
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from blockforge.data.prepared import (FORMAT, MANIFEST, PARTS, SAMPLE_TOKENS as VAL_TOKENS, TOKENIZER, Layout, Manifest, ManifestError,
                                      data_settings, recipe_layout, set_key, sha256_file, source_problem)
from blockforge.errors import BlockforgeError, DataError, FolderInUseError, warn
from blockforge.io import writes_into
from blockforge.spec.data import DataConfig
from blockforge.storage import Lease, Storage, StorageError, cache_root

PART_CHARS = 256 * 2**20  # text per part of a finite source (~60M tokens)
ENCODE_DOCUMENTS = 256  # documents per call into the tokenizer
STARTED = "preparing.json"  # what a preparation in progress is for (a resumed one must be for the same)
LOCK = "prepare.lock"
LEASE = "prepare.lease"


# ---- what to prepare ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A set to prepare: a recipe's data settings, the row layout, and for a stream how many training tokens."""

    data: DataConfig
    layout: Layout
    vocab: int | None = None  # model.vocab: every id must fit it
    tokens: int | None = None  # a stream's training tokens (of rows); None for a finite source

    @property
    def streamed(self) -> bool:
        return self.data.source == "hf" and self.data.streaming

    @property
    def key(self) -> str:
        return set_key(self.data, self.layout)

    @property
    def fingerprint(self) -> str:
        from blockforge.spec.strict import stable_hash

        return stable_hash({"key": self.key, "tokens": self.tokens})

    def needed_units(self) -> int:
        """What the training split must hold: tokens (packed) or documents (one row each) for `tokens` training tokens."""
        rows = self.layout.rows_for(self.tokens)
        return rows * self.layout.context + 1 if self.layout.pack else rows


def request_for(recipe, tokens: int | None = None) -> Request:
    """The request for `recipe`'s data; `tokens` (a stream's budget) is refused for a finite source and needed for a stream."""
    data = replace(recipe.data, prepared=None)
    request = Request(data, recipe_layout(recipe), recipe.spec.vocab, tokens)
    if data.kind != "text":
        raise BlockforgeError(f"data.source: {data.source} is images; only text is prepared (image sets are read as they are)")
    if request.streamed and tokens is None:
        raise BlockforgeError("--tokens: the recipe streams data.dataset, and a stream has no end; say how many training tokens "
                              "to take (--tokens N), or prepare a search file, whose plan says it")
    if not request.streamed and tokens is not None:
        raise BlockforgeError(f"--tokens: data.source {data.source} is finite and is prepared whole (it repeats in epochs as it "
                              "trains); leave --tokens out")
    if tokens is not None and tokens < 1:
        raise BlockforgeError(f"--tokens must be at least 1, not {tokens}")
    return request


# ---- what a set is made from ------------------------------------------------------------------------


def source_record(cfg: DataConfig) -> dict[str, Any]:
    """What a source's documents come from beyond its settings, kept in the manifest to tell a changed source from the one
    the set was made from: each local file (text files, an hf builder's data files) by its size and sha256 (read at
    about 1.7 GB/s), the builtin corpus by the Python and extractor it comes from. A Hub dataset has no files here and
    is known by its settings alone. A file named that cannot be read here is recorded by its path and what is wrong with
    it (`error`): such a record is compared, never kept (`recordable`)."""
    from blockforge.data.corpus import builtin_key

    if cfg.source == "builtin":
        return {"builtin": builtin_key()}
    if cfg.source == "text" or cfg.path:
        return {"files": [_file_record(path) for path in _named_files(cfg.path)]}
    return {}


def _named_files(path: str | list[str] | None) -> list[str]:
    """The files data.path names (corpus.expand_paths), a plain path that is not a file here among them, in order."""
    import glob

    files: list[str] = []
    for pattern in [path] if isinstance(path, str) else path or []:
        if glob.has_magic(pattern):
            files += sorted(m for m in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(m))
        else:
            files.append(os.path.expanduser(pattern))
    return list(dict.fromkeys(files))


def _file_record(path: str) -> dict[str, Any]:
    if not os.path.lexists(path):
        return {"path": path, "error": "was deleted or moved (restore it, or take it out of data.path)"}
    try:
        return {"path": path, "bytes": os.path.getsize(path), "sha256": sha256_file(Path(path))}
    except OSError as err:
        reason = err.strerror or type(err).__name__
        return {"path": path, "error": f"became unreadable ({reason}: make it readable, or take it out of data.path)"}


def recordable(source: dict[str, Any] | None) -> dict[str, Any] | None:
    """`source` as a set keeps it: None where a file of it cannot be read here (nothing to compare a later source with)."""
    if source is None or any("error" in entry for entry in source.get("files", [])):
        return None
    return source


def source_change(recorded: Any, now: dict[str, Any] | None) -> str | None:
    """How a source changed between two of its records, in words naming each file that changed, went or cannot be read;
    None where it did not, or where the two cannot be compared (`now` None or none of its files here: the set is then all
    there is of them; `recorded` not a record: an earlier blockforge wrote none)."""
    if now is None or not isinstance(recorded, dict) or recorded == now or absent_here(recorded, now):
        return None
    if "builtin" in now or "builtin" in recorded:
        return f"the builtin corpus changed (extracted by {recorded.get('builtin')} then, by {now.get('builtin')} now)"
    before = {entry["path"]: entry for entry in recorded.get("files", [])}
    changes = []
    for entry in now.get("files", []):
        old = before.pop(entry["path"], None)
        if "error" in entry:
            changes.append(f"{entry['path']} {entry['error']}")
        elif old is None:
            changes.append(f"{entry['path']} was added to the source")
        elif old != entry:
            changes.append(f"{entry['path']} changed ({old['bytes']:,} bytes then, {entry['bytes']:,} now)")
    changes += [f"{path} was removed from the source" for path in before]
    if not changes:
        return "the order of the source's files changed"
    return ", ".join(changes[:-1]) + (" and " if len(changes) > 1 else "") + changes[-1]


def absent_here(recorded: Any, now: dict[str, Any] | None) -> bool:
    """Whether none of the files a set was made from can be read here (another machine): the set is all there is of them."""
    files = now.get("files") if now else None
    return isinstance(recorded, dict) and bool(recorded.get("files")) and files is not None and all("error" in e for e in files)


def _source_now(request: Request) -> dict[str, Any] | None:
    """The request's source record (a file that cannot be read here recorded as such), or None where it cannot be made."""
    try:
        return source_record(request.data)
    except (DataError, OSError):
        return None


# ---- where the work runs -----------------------------------------------------------------------------


class _Ran:
    """A part run in this process: its record, or the error it raised (raised where it is waited for)."""

    def __init__(self, fn: Callable, args: tuple):
        self.value, self.error = None, None
        try:
            self.value = fn(*args)
        except Exception as err:
            self.error = err


class InProcess:
    """Parts run one after another in this process (the tokenizer itself uses the machine's cores)."""

    slots = 1

    def submit(self, fn: Callable, *args) -> _Ran:
        return _Ran(fn, args)

    def wait(self, handles: list[_Ran]) -> tuple[_Ran, Any]:
        handle = handles[0]
        if handle.error is not None:
            raise handle.error
        return handle, handle.value

    def cancel(self, handles: list) -> None:
        pass


class RayWorkers:
    """Parts run as Ray tasks on the connected cluster (one CPU each), as many at once as `slots`."""

    def __init__(self, slots: int | None = None):
        import ray

        self.ray = ray
        self.slots = slots or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote: dict[Callable, Any] = {}

    def submit(self, fn: Callable, *args) -> Any:
        if fn not in self._remote:
            # A node lost mid-part: the part runs again. Ray starts its workers 15 nice levels down (RAY_worker_niceness):
            # a part would yield its core to anything else the node runs, the caller included.
            self._remote[fn] = self.ray.remote(num_cpus=1, max_retries=2, runtime_env={"env_vars": {"RAY_worker_niceness": "0"}})(fn)
        return self._remote[fn].remote(*args)

    def wait(self, handles: list) -> tuple[Any, Any]:
        done, _ = self.ray.wait(handles, num_returns=1)
        try:
            return done[0], self.ray.get(done[0])
        except self.ray.exceptions.RayTaskError as err:
            cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else None
            if isinstance(cause, BlockforgeError):
                raise cause from None
            raise

    def cancel(self, handles: list) -> None:
        for handle in handles:
            with contextlib.suppress(Exception):
                self.ray.cancel(handle, force=True)


class _Stoppable:
    """Workers whose waits check `should_stop` every second (a signal to the driver stops the preparation between parts)."""

    def __init__(self, workers, should_stop: Callable[[], None]):
        self.workers, self.should_stop = workers, should_stop
        self.slots = workers.slots

    def submit(self, fn: Callable, *args) -> Any:
        self.should_stop()
        return self.workers.submit(fn, *args)

    def wait(self, handles: list) -> tuple[Any, Any]:
        if isinstance(self.workers, RayWorkers):
            while not self.workers.ray.wait(handles, num_returns=1, timeout=1.0)[0]:
                self.should_stop()
        return self.workers.wait(handles)

    def cancel(self, handles: list) -> None:
        self.workers.cancel(handles)


# ---- one part: tokenize, write the shards, then the record ---------------------------------------------


@dataclass(frozen=True)
class Part:
    """One unit of work: a chunk of a finite source's documents (kind 'train'/'val'), or one shard of a stream
    ('stream': the training stream, whose hash hold-out also gives validation; 'valstream': the validation split)."""

    kind: str
    index: int
    split: str | None = None  # a stream's dataset split
    shard: int = 0
    shards: int = 1

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index:06d}"

    @property
    def outputs(self) -> tuple[str, ...]:
        return {"train": ("train",), "val": ("val",), "stream": ("train", "val"), "valstream": ("val",)}[self.kind]


@dataclass(frozen=True)
class Job:
    """What every part of one preparation shares (sent to each worker)."""

    out: str  # the set's storage (a local folder or a URI)
    data: DataConfig
    layout: Layout
    tokenizer_files: dict[str, bytes]
    tokenizer_fingerprint: str
    caps: dict[str, int] = field(default_factory=dict)  # output split -> units a part writes at most (streams)
    hold_out: bool = False  # a stream's validation is its hash hold-out
    one_core: bool = False  # a task of a cluster: the tokenizer keeps to its one core (the parts give the parallelism)


_TOKENIZERS: dict[str, Any] = {}  # fingerprint -> Tokenizer, per worker process


def _job_tokenizer(job: Job):
    if job.tokenizer_fingerprint not in _TOKENIZERS:
        from blockforge.data.tokenizer import load_tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            for name, data in job.tokenizer_files.items():
                (Path(tmp) / name).write_bytes(data)
            _TOKENIZERS[job.tokenizer_fingerprint] = load_tokenizer(tmp)
    return _TOKENIZERS[job.tokenizer_fingerprint]


class ShardWriter:
    """One output shard of a part: ids appended a chunk of documents at a time into a staging file, offsets and counts
    kept (one bincount and one write a chunk: no per-document work but a length)."""

    def __init__(self, staging: Path, name: str, dtype: np.dtype, layout: Layout, vocab_size: int, cap: int | None, by_documents: bool):
        self.name, self.dtype, self.layout, self.cap, self.by_documents = name, dtype, layout, cap, by_documents
        self.path = staging / f"{name.replace('/', '-')}.bin"
        self.file = open(self.path, "wb")
        self.offsets = [0]
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.source_tokens, self.max_id = 0, -1
        self.kept = None if layout.pack else layout.context + 1  # a document row keeps context + 1 tokens

    @property
    def units(self) -> int:
        """What the cap counts: documents (a training split of document rows), else tokens as stored."""
        return len(self.offsets) - 1 if self.by_documents else self.offsets[-1]

    @property
    def room(self) -> int | None:
        """Units until the cap (None: no cap)."""
        return None if self.cap is None else self.cap - self.units

    @property
    def full(self) -> bool:
        return self.cap is not None and self.units >= self.cap

    def units_of(self, ids: np.ndarray) -> int:
        """The units one document's `ids` add."""
        if self.by_documents:
            return 1
        return len(ids) if self.kept is None else min(len(ids), self.kept)

    def add(self, documents: list[np.ndarray]) -> None:
        """Append `documents` (each one's ids), in order."""
        if not documents:
            return
        ids = np.concatenate(documents)
        self.counts += np.bincount(ids, minlength=len(self.counts))[: len(self.counts)]
        self.source_tokens += len(ids)
        self.max_id = max(self.max_id, int(ids.max()))
        lengths = np.fromiter(map(len, documents), dtype=np.int64, count=len(documents))
        if self.kept is not None and lengths.max() > self.kept:
            lengths = np.minimum(lengths, self.kept)
            ids = np.concatenate([document[: self.kept] for document in documents])
        self.file.write(ids.astype(self.dtype, copy=False).tobytes())  # a failed write raises (numpy's tofile may not say)
        self.offsets.extend((self.offsets[-1] + np.cumsum(lengths)).tolist())

    def close(self) -> dict[str, Any]:
        self.file.close()
        index = self.path.with_suffix(".idx")
        with open(index, "wb") as f:
            f.write(np.asarray(self.offsets, dtype=np.int64).tobytes())
        for path, expected in ((self.path, self.offsets[-1] * self.dtype.itemsize), (index, len(self.offsets) * 8)):
            if path.stat().st_size != expected:  # a write the system cut short without saying so
                raise OSError(errno.EFBIG, f"{path.name} holds {path.stat().st_size} bytes of the {expected} written")
        files = {kind: {"bytes": path.stat().st_size, "sha256": sha256_file(path)} for kind, path in (("bin", self.path), ("idx", index))}
        return {"shard": self.name, "documents": len(self.offsets) - 1, "tokens": self.offsets[-1], "source_tokens": self.source_tokens,
                "max_id": self.max_id, "files": files}


def run_part(part: Part, job: Job, texts: list[str] | None = None) -> dict[str, Any]:
    """Tokenize one part and put its shard files, counts and record into the set's folder; returns the record."""
    started, cpu = time.perf_counter(), time.process_time()
    storage = Storage.open(job.out)
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    if job.one_core:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    staging = _staging(storage)
    try:
        tokenizer = _job_tokenizer(job)
        place, room = (storage.uri, "free space there") if storage.local else (staging.parent, "free space there or set BLOCKFORGE_CACHE to a disk with room")
        with writes_into(place, f"part {part.name} of the prepared set", f"{room}; the preparation continues where it stopped"):
            writers = {split: ShardWriter(staging, f"{split}/{part.index:06d}", np.dtype(_dtype(tokenizer.vocab_size)), job.layout,
                                          tokenizer.vocab_size, job.caps.get(split), by_documents(split, job.layout))
                       for split in part.outputs}
            ended = _fill(part, job, tokenizer, writers, texts)
            outputs = {split: writer.close() for split, writer in writers.items()}
        record = {"part": part.name, "ended": ended, "caps": job.caps, "outputs": {}, "seconds": round(time.perf_counter() - started, 3),
                  "cpu_seconds": round(time.process_time() - cpu, 3), "host": socket.gethostname(), "nice": os.nice(0)}
        for split, output in outputs.items():
            if output["documents"] == 0:
                continue  # nothing of this split in the part (a shard without held-out documents)
            for kind in ("bin", "idx"):
                put_file(storage, staging / f"{output['shard'].replace('/', '-')}.{kind}", f"{output['shard']}.{kind}")
            counts = f"{PARTS}/{part.name}.{split}.counts.npy"
            buffer = io.BytesIO()
            np.save(buffer, writers[split].counts)
            storage.write_bytes(counts, buffer.getvalue())
            record["outputs"][split] = {**output, "counts": counts}
        storage.write_bytes(f"{PARTS}/{part.name}.json", json.dumps(record).encode())  # last: the part is done
        return record
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def by_documents(split: str, layout: Layout) -> bool:
    """Whether a split's budget counts documents (training rows of one document each) rather than tokens."""
    return split == "train" and not layout.pack


def _dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def _staging(storage: Storage) -> Path:
    """A private folder to write a part's files before they are put in place: inside a local set (renamed into place)
    or in this node's cache (put up to a storage)."""
    base = Path(storage.uri) if storage.local else cache_root() / "scratch" / "prepare"
    path = base / f".staging-{uuid.uuid4().hex[:12]}"
    with writes_into(base, "a staging folder of the prepared set", "free space there"):
        path.mkdir(parents=True)
    return path


def put_file(storage: Storage, local: Path, rel: str) -> None:
    """Put a whole file into the storage: renamed into a local set, put up whole to a remote one (an object appears
    only once complete), never half there."""
    if storage.local:
        target = Path(storage.path(rel))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(local, target)
        except OSError:  # another filesystem
            from blockforge.io import atomic_write

            atomic_write(target, lambda tmp: shutil.copyfile(local, tmp))
        return
    storage.upload(local, rel)


def _fill(part: Part, job: Job, tokenizer, writers: dict[str, ShardWriter], texts: list[str] | None) -> bool:
    """Encode the part's documents, in order, into their writers until the part ends or its training side is full (a
    stream's validation then holds the held-out documents read up to the last training document kept); True if the
    part was read to its end."""
    from blockforge.data.corpus import validation_score

    if texts is None:
        texts = _stream_texts(part, job)
    split_of = (lambda text: "val" if validation_score(text) < job.data.val_fraction else "train") if job.hold_out and part.kind == "stream" \
        else (lambda text: part.outputs[0])
    main = writers[part.outputs[0]]
    documents = iter(texts)
    while chunk := list(itertools.islice(documents, _chunk_size(main))):
        chunk = [(text, split) for text in chunk if not writers[split := split_of(text)].full]  # a full side encodes no more
        taken: dict[str, list[np.ndarray]] = {split: [] for split in writers}
        room = main.room
        for (_, split), ids in zip(chunk, tokenizer.encode_documents(text for text, _ in chunk)):
            taken[split].append(ids)
            if room is not None and writers[split] is main:
                room -= main.units_of(ids)
                if room <= 0:  # the training side decides when a stream's part has given enough
                    break
        for split, added in taken.items():
            writers[split].add(added)
        if main.full:
            return False
    return True


def _chunk_size(main: ShardWriter) -> int:
    """Documents to encode next: ENCODE_DOCUMENTS, or fewer where the training side needs fewer to be full (by its mean
    document so far), so the last part of a stream encodes little more than it keeps."""
    room = main.room
    if room is None:
        return ENCODE_DOCUMENTS
    documents = len(main.offsets) - 1
    if not main.by_documents and not documents:
        return ENCODE_DOCUMENTS
    per_document = 1.0 if main.by_documents else main.units / documents
    return max(1, min(ENCODE_DOCUMENTS, math.ceil(room / per_document)))


def _stream_texts(part: Part, job: Job) -> Iterator[str]:
    from blockforge.data.corpus import hf_texts, open_hf_split

    stream = open_hf_split(job.data, part.split, streaming=True)
    if part.shards > 1:
        stream = stream.shard(num_shards=part.shards, index=part.shard)
    return hf_texts(stream, job.data)


# ---- one preparation at a time ------------------------------------------------------------------------


@contextlib.contextmanager
def owning(storage: Storage, wait_s: float = 0.0) -> Iterator[Callable[[], None]]:
    """Hold the set's folder for one preparation; yields a check to make before publishing."""
    if storage.local:
        from blockforge.lock import RunLock

        folder = Path(storage.uri)
        with writes_into(folder, "the prepared set", "choose another --out"):
            folder.mkdir(parents=True, exist_ok=True)
        lock = RunLock(folder, LOCK, "preparing a data set in it").acquire(wait_s=wait_s)
        try:
            yield lambda: None
        finally:
            lock.release()
        return
    lease = Lease(storage, LEASE, "preparing a data set in it")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lease.take()
            break
        except FolderInUseError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(2.0)
    try:
        yield lease.check
    except StorageError:
        lease.release(reachable=False)
        raise
    except BaseException:
        lease.release()
        raise
    else:
        lease.release()


# ---- the whole preparation ------------------------------------------------------------------------------


@dataclass
class Outcome:
    manifest: Manifest
    reused: bool  # the folder held this set already
    parts_done: int = 0  # parts that ran now
    parts_resumed: int = 0  # parts an earlier, interrupted preparation had finished
    seconds: float = 0.0


def prepare(request: Request, out: str | os.PathLike, *, workers: InProcess | RayWorkers | None = None, progress: bool = True,
            corpus=None, tokenizer=None, wait_s: float = 0.0, say: Callable[[str], None] | None = None,
            should_stop: Callable[[], None] | None = None) -> Outcome:
    """Prepare `request` into `out` (a local folder or a URI): every part not yet done, then the manifest.

    `corpus` and `tokenizer` (a finite source already loaded, its tokenizer already built) save loading them again.
    `wait_s`: how long to wait for another preparation of the same folder (the node's token cache) instead of refusing.
    `should_stop()` is called between parts and may raise to stop (a signal): the parts done are kept."""
    started = time.perf_counter()
    storage = Storage.open(out)
    workers = workers or InProcess()
    source = _source_now(request)
    done = _existing(storage, request, source)  # read before anything is written: a set that is there is only read
    if done is not None:
        return Outcome(done, reused=True)
    with owning(storage, wait_s) as still_ours:
        done = _existing(storage, request, source)  # another preparation finished it while this one waited
        if done is not None:
            return Outcome(done, reused=True)
        if not storage.local:
            storage.check()
        _start(storage, request, source)
        tokenizer, files = _tokenizer(storage, request, corpus, tokenizer, say)
        _TOKENIZERS.setdefault(tokenizer.fingerprint, tokenizer)  # parts run in this process need not load it again
        job = Job(str(storage), request.data, request.layout, files, tokenizer.fingerprint,
                  hold_out=request.streamed and request.data.val_split is None, one_core=isinstance(workers, RayWorkers))
        records = _records(storage)
        resumed = len(records)
        workers = _Stoppable(workers, should_stop) if should_stop is not None else workers
        if request.streamed:
            used, info = _run_stream(storage, request, job, workers, records, progress)
        else:
            corpus = corpus if corpus is not None else _load_corpus(request.data)
            used, info = _run_finite(corpus, job, workers, records, progress)
        manifest = {**_assemble(storage, request, tokenizer, used, info), "source": recordable(source)}
        still_ours()
        storage.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())  # last: from now on the folder is a set
        _clean(storage, used)
        return Outcome(Manifest.parse(manifest, str(storage)), reused=False, parts_done=len(records) - resumed,
                       parts_resumed=resumed, seconds=time.perf_counter() - started)


def set_prepared(storage: Storage, request: Request) -> bool:
    """Whether `storage` holds `request`'s set already (another set there, or this one made from a source that changed
    since, is refused, as prepare refuses it)."""
    return _existing(storage, request, _source_now(request)) is not None


def _existing(storage: Storage, request: Request, source: dict | None) -> Manifest | None:
    """The set the folder holds, if it is this request's and made from `source` (the source as it is now; None: not
    readable here); a set of anything else is refused."""
    data = storage.read_bytes(MANIFEST)
    if data is None:
        return None
    try:
        manifest = Manifest.parse(json.loads(data), str(storage))
    except ValueError:
        raise BlockforgeError(f"{storage}/{MANIFEST}: is not the manifest of a prepared set (it does not read as JSON); choose "
                              "another --out, or remove the folder to prepare into it") from None
    except ManifestError as err:
        raise BlockforgeError(f"{err.path}: {err.reason}; choose another --out, or remove the folder to prepare into it") from None
    if manifest.fingerprint != request.fingerprint:
        raise BlockforgeError(f"{storage}: holds a prepared set of other data or another budget (fingerprint {manifest.fingerprint}, "
                              f"this one is {request.fingerprint}); choose another --out")
    recorded = manifest.raw.get("source")
    if source and not isinstance(recorded, dict):
        warn(f"{storage}: its manifest does not record the source it was made from (an earlier blockforge wrote it, or its files "
             "could not be read then), so a change to the source since cannot be seen; it is used as it is")
    elif absent_here(recorded, source):
        warn(f"{storage}: none of the files its set was made from can be read here ({source['files'][0]['path']} "
             f"{source['files'][0]['error'].split(' (')[0]}), so a change to them cannot be seen; it is used as it was made")
    change = source_change(recorded, source)
    if change is not None:
        raise BlockforgeError(f"{storage}: holds this data's set as prepared before {change}; choose another --out, or remove the "
                              "folder to prepare it again from the source as it is now")
    return manifest


def _start(storage: Storage, request: Request, source: dict | None) -> None:
    """Record what this folder is being prepared for and from, or check that an interrupted preparation there was for the
    same, from the same source."""
    said = storage.read_bytes(STARTED)
    if said is not None:
        try:
            started = json.loads(said)
            fingerprint, recorded = started["fingerprint"], started.get("source")
            problem = source_problem(recorded)
        except (ValueError, TypeError, KeyError, AttributeError):
            problem = "it does not read as the record of a preparation"
        if problem is not None:
            raise BlockforgeError(f"{storage}/{STARTED}: is damaged ({problem}), so the parts there cannot be told to be this "
                                  "data's; remove the folder to start over there, or choose another --out") from None
        if fingerprint != request.fingerprint:
            raise BlockforgeError(f"{storage}: holds an unfinished preparation of other data or another budget; choose another "
                                  f"--out, or remove the folder to start over there")
        change = source_change(recorded, source)
        if change is not None:
            raise BlockforgeError(f"{storage}: holds an unfinished preparation of this data begun before {change}; remove the "
                                  "folder to start over there, or choose another --out")
        return
    others = [name for name in storage.listing() if name not in (LOCK, LEASE) and not name.startswith(".staging-")]
    if others:
        raise BlockforgeError(f"{storage}: is not empty and holds no prepared set (it has {others[0]}); give an empty or new --out")
    storage.write_bytes(STARTED, json.dumps({
        "fingerprint": request.fingerprint, "data": data_settings(request.data), "layout": request.layout.to_plain(),
        "tokens": request.tokens, "source": recordable(source), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=1).encode())


def _load_corpus(data: DataConfig):
    from blockforge.data.corpus import load_corpus

    return load_corpus(data, cache_root())


def _tokenizer(storage: Storage, request: Request, corpus, tokenizer, say) -> tuple[Any, dict[str, bytes]]:
    """The set's tokenizer and its files: the one an earlier attempt saved into the folder, else the one given or built
    (a BPE trained once, on the start of the training text), saved there now."""
    from blockforge.data.tokenizer import build_tokenizer, load_tokenizer

    started = json.loads(storage.read_bytes(STARTED))
    saved = {name: storage.read_bytes(f"{TOKENIZER}/{name}") for name in storage.listing(TOKENIZER)}
    if saved and started.get("tokenizer_fingerprint"):
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in saved.items():
                (Path(tmp) / name).write_bytes(data)
            loaded = load_tokenizer(tmp)
        if loaded.fingerprint == started["tokenizer_fingerprint"]:
            loaded.name = started.get("tokenizer_name", loaded.name)
            return loaded, saved
    cfg = request.data
    if tokenizer is None:
        if cfg.tokenizer.bpe is not None and say is not None:
            say(f"training the BPE tokenizer ({cfg.tokenizer.bpe} tokens) on the first {cfg.bpe_train_chars:,} characters of the training text")
        if request.streamed:
            texts = _stream_training_texts(cfg)
        else:
            corpus = corpus if corpus is not None else _load_corpus(cfg)
            texts = corpus.train
        tokenizer = build_tokenizer(cfg.tokenizer, texts, max_chars=cfg.bpe_train_chars, cache_dir=cache_root(), vocab=request.vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        files = {path.name: path.read_bytes() for path in sorted(Path(tmp).iterdir())}
    storage.delete(TOKENIZER)
    for name, data in files.items():
        storage.write_bytes(f"{TOKENIZER}/{name}", data)
    storage.write_bytes(STARTED, json.dumps({**started, "tokenizer_name": tokenizer.name,
                                             "tokenizer_fingerprint": tokenizer.fingerprint}, indent=1).encode())
    return tokenizer, files


def _stream_training_texts(cfg: DataConfig) -> Iterator[str]:
    """The training stream's texts in its own order, its hash hold-out left out (what a BPE trains on)."""
    from blockforge.data.corpus import hf_texts, open_hf_split, validation_score

    texts = hf_texts(open_hf_split(cfg, cfg.split, streaming=True), cfg)
    if cfg.val_split is not None:
        return texts
    return (text for text in texts if validation_score(text) >= cfg.val_fraction)


def _records(storage: Storage) -> dict[str, dict]:
    """The records of parts done, whose shard files are all there at their size."""
    listing = storage.listing()
    records = {}
    for name in listing:
        if not (name.startswith(f"{PARTS}/") and name.endswith(".json")):
            continue
        try:
            record = json.loads(storage.read_bytes(name))
            whole = all(listing.get(f"{o['shard']}.{kind}", (None,))[0] == o["files"][kind]["bytes"]
                        for o in record["outputs"].values() for kind in ("bin", "idx"))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a record this preparation can use: its part runs again
        if whole:
            records[record["part"]] = record
    return records


def _progress(total: int, unit: str, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    # On a terminal only (disable=None): a log or a pipe gets the one-line outcome, not the bar's redraws.
    return tqdm(total=total, unit=unit, unit_scale=True, disable=None if enabled else True, desc=desc, dynamic_ncols=True, leave=False)


def _run_finite(corpus, job: Job, workers, records: dict, progress: bool) -> tuple[dict[str, list[dict]], dict]:
    """Every part of a finite source (its documents in chunks), run where not done."""
    parts: list[tuple[Part, list[str]]] = []
    for split, texts in (("train", corpus.train), ("val", corpus.val)):
        for index, chunk in enumerate(_chunks(texts, PART_CHARS)):
            parts.append((Part(split, index), chunk))
    todo = [(part, texts) for part, texts in parts if part.name not in records]
    bar = _progress(len(parts), "part", progress, "preparing")
    bar.update(len(parts) - len(todo))
    pending: dict[Any, Part] = {}
    try:
        while todo or pending:
            while todo and len(pending) < workers.slots:
                part, texts = todo.pop(0)
                pending[workers.submit(run_part, part, job, _shared(workers, texts))] = part
            handle, record = workers.wait(list(pending))
            records[pending.pop(handle).name] = record
            bar.update(1)
    except BaseException:
        workers.cancel(list(pending))
        raise
    finally:
        bar.close()
    used = {split: [records[p.name] for p, _ in parts if p.kind == split] for split in ("train", "val")}
    info = {**corpus.info, "documents": {"train": len(corpus.train), "val": len(corpus.val)}, "corpus": corpus.content_hash()}
    return used, info


def _shared(workers, texts: list[str]):
    """The texts as a part receives them: in the object store for tasks (sent once, read where the task runs)."""
    workers = getattr(workers, "workers", workers)
    if isinstance(workers, RayWorkers):
        return workers.ray.put(texts)
    return texts


def _chunks(texts: list[str], chars: int) -> Iterator[list[str]]:
    chunk, size = [], 0
    for text in texts:
        if chunk and size + len(text) > chars:
            yield chunk
            chunk, size = [], 0
        chunk.append(text)
        size += len(text)
    if chunk:
        yield chunk


def _run_stream(storage: Storage, request: Request, job: Job, workers, records: dict, progress: bool) -> tuple[dict[str, list[dict]], dict]:
    """A stream's parts in order until the training split holds what the request needs (and validation VAL_TOKENS)."""
    from blockforge.data.corpus import open_hf_split

    cfg = request.data
    train_shards = open_hf_split(cfg, cfg.split, streaming=True).num_shards
    needed = request.needed_units()
    unit = "tok" if request.layout.pack else "doc"
    job = replace(job, caps={"train": needed, "val": VAL_TOKENS})
    used = {}
    if cfg.val_split is not None:
        val_shards = open_hf_split(cfg, cfg.val_split, streaming=True).num_shards
        parts = [Part("valstream", i, cfg.val_split, i, val_shards) for i in range(val_shards)]
        used["val"] = _ordered(parts, "val", VAL_TOKENS, job, workers, records, progress, "tok", enough_if_ended=True)
    parts = [Part("stream", i, cfg.split, i, train_shards) for i in range(train_shards)]
    used["train"] = _ordered(parts, "train", needed, job, workers, records, progress, unit, enough_if_ended=False, request=request)
    if cfg.val_split is None:
        used["val"] = [r for r in used["train"] if "val" in r["outputs"]]
    info = {"source": "hf", "dataset": cfg.dataset, "name": cfg.name, "split": cfg.split, "val_split": cfg.val_split, "streaming": True,
            "order": "the stream's shards in order, documents in their order (not a shuffled stream's order)"}
    return used, info


def _ordered(parts: list[Part], split: str, needed: int, job: Job, workers, records: dict, progress: bool, unit: str, *,
             enough_if_ended: bool, request: Request | None = None) -> list[dict]:
    """Run `parts` in order, up to workers.slots at once, until the finished ones, in order, hold `needed` units of
    `split`; returns the records of those parts. A part is started only while the parts done and running may fall
    short (judged by the parts done so far), and parts running once enough is held are stopped."""
    def prefix() -> tuple[int, list[dict]]:
        held, taken = 0, []
        for part in parts:
            record = records.get(part.name)
            if record is None or held >= needed:
                break
            taken.append(record)
            held += _held(record, split, job.layout)
        return held, taken

    bar = _progress(needed, unit, progress, f"preparing {split}")
    pending: dict[Any, Part] = {}
    upcoming = [part for part in parts if part.name not in records]
    try:
        while True:
            held, taken = prefix()
            bar.n = min(held, needed)
            bar.refresh()
            if held >= needed or len(taken) == len(parts):
                break
            done = [_held(records[p.name], split, job.layout) for p in parts if p.name in records]
            mean = sum(done) / len(done) if done else 0.0
            while upcoming and len(pending) < workers.slots and (not pending or not done or sum(done) + len(pending) * mean < needed):
                part = upcoming.pop(0)
                pending[workers.submit(run_part, part, _capped(job, part, parts, records))] = part
            if not pending:
                break
            handle, record = workers.wait(list(pending))
            records[pending.pop(handle).name] = record
    finally:
        workers.cancel(list(pending))
        bar.close()
    held, taken = prefix()
    if held >= needed and _rerun_last(parts[len(taken) - 1], parts, job, workers, records):
        held, taken = prefix()
    if held < needed and not enough_if_ended:
        tokens = sum(r["outputs"]["train"]["tokens"] for r in taken if "train" in r["outputs"])
        rows = job.layout.rows(tokens, sum(r["outputs"]["train"]["documents"] for r in taken if "train" in r["outputs"]))
        cfg = job.data
        raise DataError(f"data.dataset: the stream {cfg.dataset!r} (split {cfg.split!r}) ended after {tokens:,} tokens, "
                        f"{rows:,} rows of model.context {job.layout.context} ({rows * job.layout.context:,} training tokens), fewer "
                        f"than the {request.tokens:,} asked for; ask for at most {rows * job.layout.context:,} (--tokens), or give "
                        "a larger source")
    return taken


def _held(record: dict, split: str, layout: Layout) -> int:
    """The units of `split` a part's record holds: documents (training rows of one document each), else tokens."""
    output = record["outputs"].get(split)
    return 0 if output is None else output["documents"] if by_documents(split, layout) else output["tokens"]


def _capped(job: Job, part: Part, parts: list[Part], records: dict) -> Job:
    """`job` for `part`, each cap lowered by what the parts before it that are done hold: the part encodes only what may
    still be needed (exactly that when every part before it is done, as with one worker), never less, so which documents
    the set holds does not depend on which parts ran at once."""
    before = [records[p.name] for p in parts[: parts.index(part)] if p.name in records]
    return replace(job, caps={split: max(0, cap - sum(_held(r, split, job.layout) for r in before)) for split, cap in job.caps.items()})


def _rerun_last(last: Part, parts: list[Part], job: Job, workers, records: dict) -> bool:
    """Run the last part a set uses again if it ran with caps above what the set needs of it (it started before the parts
    ahead of it ended): what it holds beyond the last document used (validation read further, the counts of more
    documents) would then depend on which parts ran at once. True if it ran again."""
    exact = _capped(job, last, parts, records)  # every part before it is done
    if records[last.name].get("caps") == exact.caps:
        return False
    records[last.name] = workers.wait([workers.submit(run_part, last, exact)])[1]
    return True


def _cut(storage: Storage, output: dict, wanted: int, documents_count: bool) -> tuple[int, int]:
    """(documents, tokens) of a shard's first documents that hold `wanted` documents (documents_count) or tokens, ending
    at a document."""
    offsets = np.frombuffer(storage.read_bytes(f"{output['shard']}.idx"), dtype=np.int64)
    if documents_count:
        documents = min(wanted, output["documents"])
    else:
        documents = max(1, min(int(np.searchsorted(offsets, wanted, side="left")), output["documents"]))
    return documents, int(offsets[documents])


def _assemble(storage: Storage, request: Request, tokenizer, used: dict[str, list[dict]], info: dict) -> dict:
    """The manifest of the parts used: each split's shards in order (a stream's last one cut at a document)."""
    layout = request.layout
    budgets = {"train": request.needed_units() if request.streamed else None, "val": VAL_TOKENS if request.streamed else None}
    splits, counts, max_id = {}, {}, -1
    for split in ("train", "val"):
        shards, left = [], budgets[split]
        total_counts = None
        for record in used[split]:
            output = record["outputs"].get(split)
            if output is None or (left is not None and left <= 0):
                continue
            documents, tokens = output["documents"], output["tokens"]
            count_documents = by_documents(split, layout)
            units = documents if count_documents else tokens
            if left is not None and units > left:
                documents, tokens = _cut(storage, output, left, count_documents)
                units = documents if count_documents else tokens
            if left is not None:
                left -= units
            shards.append({"name": output["shard"], "documents": documents, "tokens": tokens, "files": output["files"]})
            part_counts = np.load(io.BytesIO(storage.read_bytes(output["counts"])))
            total_counts = part_counts if total_counts is None else total_counts + part_counts
            max_id = max(max_id, output["max_id"])
        exact = not request.streamed
        splits[split] = {
            "shards": shards,
            "documents": sum(s["documents"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "source_tokens": sum(r["outputs"][split]["source_tokens"] for r in used[split] if split in r["outputs"]) if exact
            else sum(s["tokens"] for s in shards),
        }
        counts[split] = total_counts
    if request.vocab is not None and max_id >= request.vocab:
        raise DataError(f"data.tokenizer: {tokenizer.name} produced token id {max_id} (vocabulary {tokenizer.vocab_size}) but "
                        f"model.vocab is {request.vocab}; raise model.vocab to at least {max_id + 1} or choose a smaller tokenizer "
                        "(the parts prepared so far are kept)")
    unigram = None
    if counts["train"] is not None and counts["val"] is not None and counts["val"].sum() > 0:
        unigram = unigram_from_counts(counts["train"], counts["val"])
    from blockforge import __version__

    return {
        "kind": "blockforge prepared set", "format": FORMAT, "fingerprint": request.fingerprint, "key": request.key,
        "data": data_settings(request.data), "layout": layout.to_plain(),
        "tokenizer": {"name": tokenizer.name, "fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                      "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id},
        "dtype": _dtype(tokenizer.vocab_size), "max_token_id": max_id, "requested_tokens": request.tokens,
        "splits": splits, "unigram_val_ppl": unigram, "info": info,
        "unigram_counts": "every part used, whole" if request.streamed else "the whole training split",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "blockforge": __version__,
    }


def unigram_from_counts(train: np.ndarray, val: np.ndarray) -> float:
    """text.unigram_perplexity from token counts: add-one smoothed training frequencies, perplexity on validation."""
    vocab = len(train)
    log_probs = np.log(train.astype(np.float64) + 1.0) - np.log(train.sum() + vocab)
    return float(np.exp(-(val.astype(np.float64) @ log_probs) / val.sum()))


def _clean(storage: Storage, used: dict[str, list[dict]]) -> None:
    """Remove the shard files of parts the set does not use (a stream's parts beyond the last one needed)."""
    keep = {f"{r['outputs'][s]['shard']}.{kind}" for s, records in used.items() for r in records if s in r["outputs"] for kind in ("bin", "idx")}
    for name in storage.listing():
        top = name.split("/", 1)[0]
        if top in ("train", "val") and name not in keep:
            with contextlib.suppress(BlockforgeError):
                storage.delete(name)


# ---- before preparing: how much work ------------------------------------------------------------------------

SAMPLE_CHARS = 2_000_000  # text tokenized to measure the tokenizer's rate
ASSUMED_RATE = 700_000.0  # tokens/s per core: blockforge's BPE (8192) on C4-like English text, measured on one core


@dataclass(frozen=True)
class Rate:
    """What preparing a request costs, from a sample of its source: the tokenizer's rate on one core and document sizes."""

    tokens_per_s: float
    document_tokens: float | None  # a whole document's tokens, on average (None: not measured)
    source_tokens: float | None  # a finite source: about how many tokens it holds (its characters at the sample's ratio)
    note: str  # how the figures were obtained

    def work(self, request: Request) -> float:
        """The tokens preparing `request` encodes: a stream's training documents (whole, before a document row is cut to
        its context) and validation; a finite source's every document."""
        if not request.streamed:
            return self.source_tokens or 0.0
        rows = request.layout.rows_for(request.tokens)
        if request.layout.pack:
            return rows * request.layout.context + VAL_TOKENS
        # Every document is tokenized whole and cut to its row: unmeasured, a document at least fills its row.
        return rows * max(self.document_tokens or 0.0, request.layout.context + 1) + VAL_TOKENS


def measure_rate(request: Request, sample_chars: int = SAMPLE_CHARS) -> Rate:
    """Tokenize the start of the request's training text on one core (process CPU time) and say how fast it went; where
    the source or its tokenizer cannot be read here, an assumed rate, said so."""
    from blockforge.data.tokenizer import bpe_tokenizer, load_hf_tokenizer, take_chars

    cfg = request.data
    try:
        if request.streamed:
            texts, total_chars = take_chars(_stream_training_texts(cfg), sample_chars), None
        else:
            corpus = _load_corpus(cfg)
            texts, total_chars = take_chars(corpus.train, sample_chars), sum(map(len, corpus.train)) + sum(map(len, corpus.val))
        if cfg.tokenizer.hf is not None:
            tokenizer = load_hf_tokenizer(cfg.tokenizer.hf)
        else:
            tokenizer = bpe_tokenizer(texts, cfg.tokenizer.bpe, cache_root())
    except DataError as err:
        return Rate(ASSUMED_RATE, None, None, f"assumed, not measured: {str(err).split(';')[0]}")
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core
    try:
        started = time.process_time()
        tokens = sum(len(ids) for ids in tokenizer.encode_documents(texts))
        seconds = max(time.process_time() - started, 1e-6)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    chars = sum(map(len, texts))
    source = None if total_chars is None else total_chars * tokens / max(chars, 1)
    return Rate(tokens / seconds, tokens / max(len(texts), 1), source,
                f"measured here: {tokenizer.name} on the first {chars:,} characters of the source, one core")


def part_count(request: Request) -> int:
    """How many parts of the training text preparing `request` runs (a stream: its shards; a finite source: its chunks).
    One part gains nothing from workers elsewhere: a caller prepares it in its own process."""
    if request.streamed:
        from blockforge.data.corpus import open_hf_split

        return open_hf_split(request.data, request.data.split, streaming=True).num_shards
    return sum(1 for _ in _chunks(_load_corpus(request.data).train, PART_CHARS))
