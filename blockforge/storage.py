"""Where a search keeps its files: a local folder, or a folder of another filesystem named by a URI.

`--out` takes a local path (on a cluster: a folder every node mounts) or a URI that pyarrow understands
(s3://, gs://, abfs://, hdfs://), or that an installed fsspec filesystem does. A local folder is used in place.
A URI's folder is the truth, and nothing works in it directly: the search driver keeps a local working copy of
what its decisions and reports read (records, curves, results; never weights) and puts up what it writes; a
trial trains in a scratch folder of its node, puts its files up before each report and, wherever it starts, first
takes down what the storage holds of its run (its latest checkpoints among them). Credentials come from the
environment, as for Ray Tune and pyarrow (AWS_* variables, a profile, a node's role): never from search files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from blockforge.errors import BlockforgeError, FolderInUseError, WriteError, warn

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
CHUNK = 8 * 2**20  # bytes copied at a time between a local file and the storage
PROBE = ".blockforge-probe"  # written, read back and removed to check a storage before anything else is written


def cache_root() -> Path:
    """Where blockforge caches what it can make again (BLOCKFORGE_CACHE, else ~/.cache/blockforge)."""
    return Path(os.environ.get("BLOCKFORGE_CACHE", Path.home() / ".cache" / "blockforge")).expanduser()


def scheme_of(where: str | os.PathLike) -> str | None:
    """The scheme of a URI ('s3'), or None for a local path (file:// URIs included)."""
    match = _SCHEME.match(str(where))
    if match is None or match.group(1).lower() == "file":
        return None
    return match.group(1).lower()


def is_uri(where: str | os.PathLike) -> bool:
    """Whether `where` is meant as a URI: it has a scheme and '//', or it starts like one without them (refused by
    Storage.open, never read as a local folder named 's3:...')."""
    return scheme_of(where) is not None or _uri_like(str(where)) is not None


_NATIVE = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")  # pyarrow's own filesystems: its error is the one to say


def _known_schemes() -> set[str]:
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return set(_NATIVE)
    return set(known_implementations) | set(_NATIVE)


def _uri_like(text: str) -> str | None:
    """The scheme of a text that starts as a URI of a known filesystem ('s3:x', 'gs:/x') but lacks its '//'."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)", text)  # two letters at least: 'C:' is a drive
    if match is not None and match.group(1).lower() in _known_schemes() - {"file", "local"}:
        return match.group(1).lower()
    return None


def parse_uri(text: str) -> str:
    """`text` as the URI blockforge keeps: its scheme in lower case, no trailing '/', its options (the query) kept; a URI
    that names no bucket, or whose path has an empty part, '.' or '..', is refused in one sentence."""
    import urllib.parse

    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if not parts.netloc:
        raise BlockforgeError(f"{text}: names no bucket (or host) after {scheme}://; give {scheme}://BUCKET/PREFIX")
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if any(segment in ("", ".", "..") for segment in segments) or parts.path.startswith("//"):
        raise BlockforgeError(f"{text}: a URI's path may hold no empty part, '.' or '..'; give the folder's plain path, "
                              f"{scheme}://{parts.netloc}/A/B")
    if parts.fragment:
        raise BlockforgeError(f"{text}: holds a '#' part, which no storage reads; remove it")
    path = "/" + "/".join(segments) if segments else ""
    return f"{scheme}://{parts.netloc}{path}" + (f"?{parts.query}" if parts.query else "")


class StorageError(WriteError):
    """A storage that cannot be reached, read or written: one sentence naming it, why, and what to do."""

    def __init__(self, sentence: str, reason: str = "", fix: str = ""):
        super().__init__(sentence)
        self.reason, self.fix = reason, fix


def _credentials_found(scheme: str) -> bool | None:
    """Whether the environment names credentials for `scheme` (None: cannot tell, e.g. a node's role may supply them)."""
    if scheme not in ("s3", "s3a"):
        return None
    named = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
             "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
    if any(os.environ.get(name) for name in named) or (Path.home() / ".aws").is_dir():
        return True
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return None  # an instance role may answer
    return False


# A read that broke off or met a server's passing error (S3's 500/503, a response cut short, a connection reset); a
# read failing so is tried again, up to READ_TRIES times in all, before it is a failure.
TRANSIENT_READ = re.compile(r"INTERNAL_FAILURE|SERVICE_UNAVAILABLE|SLOW_DOWN|SlowDown|Failed to flush response stream|Connection reset"
                            r"|curlCode: (18|52|56)|HTTP status (500|502|503|504)")
READ_TRIES = 3


def _read_again_if_cut(read: Callable):
    """read(), repeated (up to READ_TRIES in all) while it fails as a response cut short or a server's passing error:
    the client retries a request, not a body that broke off midway, and a read is safe to repeat."""
    for attempt in range(READ_TRIES):
        try:
            return read()
        except OSError as err:
            if isinstance(err, FileNotFoundError) or attempt == READ_TRIES - 1 or not TRANSIENT_READ.search(str(err)):
                raise
            time.sleep(0.25 * 2 ** attempt)


def storage_failure(err: BaseException, storage: "Storage") -> tuple[str, str]:
    """(why, what to do) for an error of `storage`'s filesystem, in words."""
    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    if re.search(r"NETWORK_CONNECTION|Could not connect|Couldn't connect|curlCode: (6|7|28)|Could not resolve|Connection refused"
                 r"|Timeout was reached|Name or service not known", text):
        import urllib.parse

        in_uri = urllib.parse.parse_qs(urllib.parse.urlsplit(storage.uri).query).get("endpoint_override")
        if in_uri:  # the URI's own endpoint is the one that failed
            return f"the storage cannot be reached at {in_uri[0]}", "check the URI's endpoint_override and the network"
        endpoint = os.environ.get("AWS_ENDPOINT_URL") if storage.scheme in ("s3", "s3a") else None
        return (f"the storage cannot be reached{f' at {endpoint}' if endpoint else ''}",
                "check the endpoint (AWS_ENDPOINT_URL or the URI's endpoint_override) and the network")
    if re.search(r"NO_SUCH_BUCKET|NoSuchBucket|bucket does not exist|The specified bucket", text):
        return (f"the bucket '{storage.bucket}' does not exist", "create it, or give an --out in a bucket that exists")
    if _credentials_found(storage.scheme) is False:  # whatever the service answers to a request no one signed
        return (f"it failed, and no credentials were found ({first})",
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) on the driver and on every node")
    if re.search(r"ACCESS_DENIED|AccessDenied|Access Denied|INVALID_ACCESS_KEY|InvalidAccessKeyId|SIGNATURE_DOES_NOT_MATCH|"
                 r"SignatureDoesNotMatch|HTTP status (401|403)|Forbidden|PermissionDenied|Permission denied|Unauthorized", text):
        return ("access was refused", "check that the credentials in the environment (on the driver and on every node) may read "
                                      "and write there")
    return first, "check the storage and its credentials"


@dataclass(frozen=True)
class Storage:
    """A search's (or an export's) folder: a local one (`local`), or one of a filesystem named by a URI.

    Pickled by its URI alone: wherever it is unpickled (a trial on another node), the filesystem is built again
    from that node's own environment."""

    uri: str  # a local folder's absolute path, or the URI without a trailing slash

    @staticmethod
    def open(where: str | os.PathLike) -> "Storage":
        """The storage `where` names; a URI whose filesystem is not installed or that no process could share is refused."""
        text = str(where)
        like = _uri_like(text)
        if like is not None:
            raise BlockforgeError(f"{text}: starts like a URI ({like}://) but has no '//' after '{like}:'; give {like}://BUCKET/PREFIX, "
                                  f"or ./{text} for a local folder of that name")
        if text.lower().startswith("file://"):
            import urllib.parse

            host = urllib.parse.urlsplit(text).netloc
            if host not in ("", "localhost"):
                raise BlockforgeError(f"{text}: names the host '{host}', and a file:// URI names this machine's files; give "
                                      f"file:///PATH (three slashes) or the plain path")
            return Storage(str(Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)).expanduser().resolve()))
        if scheme_of(text) is None:
            return Storage(str(Path(text).expanduser().resolve()))
        storage = Storage(parse_uri(text))  # options pyarrow reads stay in the URI (s3://b/x?endpoint_override=host:port)
        storage._resolved  # noqa: B018 - refused here, by name, rather than at the first write
        return storage

    def __getstate__(self) -> dict:
        return {"uri": self.uri}

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "uri", state["uri"])

    @property
    def scheme(self) -> str | None:
        return scheme_of(self.uri)

    @property
    def local(self) -> bool:
        return self.scheme is None

    @property
    def bucket(self) -> str:
        """The first part of a URI's path (a bucket, a container)."""
        return _SCHEME.sub("", self.uri.partition("?")[0]).split("/", 1)[0]

    def __str__(self) -> str:
        return self.uri

    def child(self, rel: str) -> "Storage":
        """The storage of a folder inside this one."""
        if self.local:
            return Storage(str(Path(self.uri) / rel))
        base, sep, query = self.uri.partition("?")
        return Storage(f"{base}/{rel.strip('/')}{sep}{query}")

    # ---- the filesystem -----------------------------------------------------------------------

    @cached_property
    def _resolved(self):
        """(pyarrow filesystem, root path inside it)."""
        import pyarrow.fs as pafs

        if self.local:
            return pafs.LocalFileSystem(), self.uri
        scheme = self.scheme
        if scheme == "memory":
            raise BlockforgeError(f"{self.uri}: a memory:// filesystem lives inside one process, and a search's trials run in "
                                  "others; give a local folder or an object store (s3://, gs://)")
        try:
            return pafs.FileSystem.from_uri(self.uri)
        except Exception as err:  # ArrowInvalid (unknown scheme), ArrowNotImplementedError (built without it), OSError (libhdfs)
            arrow_said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if scheme in _NATIVE and not isinstance(err, NotImplementedError):  # pyarrow's own filesystem: its error is the cause
                reason, fix = storage_failure(err, self)
                if reason == arrow_said:  # not the network, the bucket or the credentials: the URI itself
                    fix = "fix the URI: its bucket, path and options (endpoint_override, scheme, region, ...)"
                raise StorageError(f"{self.uri}: cannot be opened ({reason}); {fix}", reason=reason, fix=fix) from None
        try:
            import fsspec
        except ImportError:
            fsspec = None
        if fsspec is not None:
            try:
                fsspec.get_filesystem_class(scheme)
                fs, root = fsspec.core.url_to_fs(self.uri)
            except ImportError as err:  # a known protocol whose package is not installed: "Install adlfs to access ..."
                raise BlockforgeError(f"{self.uri}: no filesystem for {scheme}:// is installed ({err}); install it on the driver "
                                      "and on every node, or give a local folder or an s3:// URI") from None
            except ValueError:
                pass  # a protocol fsspec does not know either
            else:
                return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), root
        raise BlockforgeError(f"{self.uri}: no filesystem for {scheme}:// is available (pyarrow: {arrow_said}); give a local folder, "
                              "an s3:// or gs:// URI, or install the fsspec filesystem for it")

    @property
    def fs(self):
        return self._resolved[0]

    def path(self, rel: str = "") -> str:
        root = self._resolved[1].rstrip("/")
        return f"{root}/{rel.strip('/')}" if rel.strip("/") else root

    @contextlib.contextmanager
    def failing_as(self, what: str, fix: str | None = None) -> Iterator[None]:
        """Turn an error of the filesystem inside the block into one StorageError sentence (what: 'write trials.jsonl')."""
        try:
            yield
        except (BlockforgeError, FileNotFoundError):
            raise
        except Exception as err:
            if not isinstance(err, OSError) and type(err).__module__.split(".")[0] not in ("pyarrow", "botocore", "fsspec", "s3fs", "gcsfs"):
                raise
            reason, advice = storage_failure(err, self)
            raise StorageError(f"{self.uri}: cannot {what} ({reason}); {fix or advice}", reason=reason, fix=fix or advice) from None

    # ---- reading and writing ------------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes | None:
        """A file's bytes; None if it does not exist."""

        def read() -> bytes | None:
            try:
                with self.fs.open_input_stream(self.path(rel)) as f:
                    return f.read()
            except FileNotFoundError:
                return None

        with self.failing_as(f"read {rel}"):
            return _read_again_if_cut(read)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file (one object: readers see the old one or the new one)."""
        with self.failing_as(f"write {rel}"):
            if self.local:
                from blockforge.io import atomic_write

                atomic_write(self.path(rel), lambda tmp: Path(tmp).write_bytes(data))
                return
            with self.fs.open_output_stream(self.path(rel)) as f:
                f.write(data)

    def exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        with self.failing_as(f"read {rel or 'the folder'}"):
            return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def listing(self, rel: str = "") -> dict[str, tuple[int, int]]:
        """Every file under `rel`: its path relative to `rel` -> (size, modification time in ns)."""
        import pyarrow.fs as pafs

        base = self.path(rel)
        with self.failing_as(f"list {rel or 'the folder'}"):
            infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        out = {}
        for info in infos:
            if info.type == pafs.FileType.File:
                out[info.path[len(base):].lstrip("/")] = (info.size or 0, info.mtime_ns or 0)
        return out

    def upload(self, local: Path, rel: str) -> None:
        with self.failing_as(f"write {rel}"), open(local, "rb") as source, self.fs.open_output_stream(self.path(rel)) as target:
            while chunk := source.read(CHUNK):
                target.write(chunk)

    def download(self, rel: str, local: Path, mtime_ns: int | None = None) -> None:
        """Copy a file down, written whole or not at all; its modification time becomes the storage's (to compare later)."""
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex[:8]}.tmp")

        def copy() -> None:
            with self.fs.open_input_stream(self.path(rel)) as source, open(tmp, "wb") as target:
                while chunk := source.read(CHUNK):
                    target.write(chunk)

        try:
            with self.failing_as(f"read {rel}"):
                _read_again_if_cut(copy)
            if mtime_ns:
                os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, rel: str) -> None:
        """Remove a file, or a folder and everything in it (nothing: fine)."""
        import pyarrow.fs as pafs

        path = self.path(rel)
        with self.failing_as(f"remove {rel}"):
            kind = self.fs.get_file_info(path).type
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(path)
            elif kind == pafs.FileType.File:
                self.fs.delete_file(path)

    def copy_file(self, rel: str, to: str) -> None:
        """Copy one file inside the storage (for an object store, without taking it down)."""
        with self.failing_as(f"copy {rel}"):
            if self.local:
                import shutil

                Path(self.path(to)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.path(rel), self.path(to))
            else:
                self.fs.copy_file(self.path(rel), self.path(to))

    def move(self, rel: str, to: str) -> None:
        """Move a folder inside the storage (what `to` held goes first)."""
        self.delete(to)
        if self.local:
            if Path(self.path(rel)).exists():
                os.rename(self.path(rel), self.path(to))
            return
        for name in self.listing(rel):
            with self.failing_as(f"move {rel}/{name}"):
                self.fs.copy_file(self.path(f"{rel}/{name}"), self.path(f"{to}/{name}"))
        self.delete(rel)

    def check(self) -> None:
        """Write, read back and remove a small file, so a storage that cannot be reached, read or written is one sentence
        before anything else is written there."""
        rel = f"{PROBE}-{uuid.uuid4().hex[:12]}"
        token = uuid.uuid4().hex.encode()
        self.write_bytes(rel, token)
        if self.read_bytes(rel) != token:
            raise StorageError(f"{self.uri}: a file written there did not read back the same; check the storage")
        self.delete(rel)

    # ---- local copies ---------------------------------------------------------------------------

    def working_copy(self, purpose: str = "searches") -> Path:
        """A local folder for this storage's files on this machine (the storage's own folder, when it is local)."""
        if self.local:
            return Path(self.uri)
        digest = hashlib.sha256(self.uri.encode()).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", PurePosixPath(_SCHEME.sub("", self.uri.partition("?")[0])).name or self.bucket)[:40]
        return cache_root() / "storage" / purpose / f"{name}-{digest}"


Keep = Callable[[str], bool]


def everything(rel: str) -> bool:
    return True


class Mirror:
    """A local folder kept as a copy of a folder of a remote storage.

    `pull` takes down the files that differ there (by size and modification time) and removes local ones the storage
    no longer has; `push` puts up the files that changed here since the last push, and removes from the storage those
    pushed before that are gone here (old checkpoints). `last` names files put up after all others, in order, so that
    a reader of the storage never sees a pointer before what it points to (checkpoints/latest.json after the
    checkpoint, result.json after everything)."""

    def __init__(self, storage: Storage, rel: str, local: Path, last: tuple[str, ...] = ()):
        self.storage, self.rel, self.local, self.last = storage, rel.strip("/"), Path(local), last
        self.pushed: dict[str, tuple[int, int]] = {}  # rel -> (size, mtime) of the local file when put up
        self.before_push: Callable[[], None] | None = None  # called before anything is put up (may raise to refuse it)

    def _remote(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    def pull(self, keep: Keep = everything, remove: bool = True) -> list[str]:
        """Take down what changed in the storage (files `keep` accepts); returns their names."""
        remote = {name: stat for name, stat in self.storage.listing(self.rel).items() if keep(name) and not _temporary(name)}
        changed = []
        for name, (size, mtime) in sorted(remote.items()):
            target = self.local / name
            try:
                here = target.stat()
                same = here.st_size == size and here.st_mtime_ns == mtime
            except OSError:
                same = False
            if not same:
                self.storage.download(self._remote(name), target, mtime)
                changed.append(name)
            self.pushed[name] = _stat(target)
        if remove and self.local.is_dir():
            for path in sorted(self.local.rglob("*")):
                name = path.relative_to(self.local).as_posix()
                if path.is_file() and keep(name) and name not in remote and not _temporary(name):
                    path.unlink()
                    self.pushed.pop(name, None)
        return changed

    def push(self, keep: Keep = everything) -> list[str]:
        """Put up what changed here since the last push (files `keep` accepts); returns their names."""
        if self.before_push is not None:
            self.before_push()
        here = {}
        if self.local.is_dir():
            for path in self.local.rglob("*"):
                name = path.relative_to(self.local).as_posix()
                if path.is_file() and keep(name) and not _temporary(name):
                    with contextlib.suppress(OSError):  # removed meanwhile (an old checkpoint)
                        here[name] = _stat(path)
        order = {name: i for i, name in enumerate(self.last)}
        changed = sorted((name for name, stat in here.items() if self.pushed.get(name) != stat),
                         key=lambda name: (order.get(name, -1), name))
        for name in changed:
            self.storage.upload(self.local / name, self._remote(name))
            self.pushed[name] = here[name]
        for name in [name for name in self.pushed if name not in here and keep(name)]:  # e.g. an old checkpoint's files
            self.storage.delete(self._remote(name))
            del self.pushed[name]
        return changed


def _stat(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _temporary(name: str) -> bool:
    """A file being written (an atomic write's temporary, a checkpoint not finished) or a lock: never copied."""
    leaf = name.rsplit("/", 1)[-1]
    return (leaf.startswith(".") and leaf.endswith(".tmp")) or leaf.endswith((".lock", ".lease")) or "/.partial-" in f"/{name}" \
        or leaf.startswith(PROBE)


def fetch_folder(storage: Storage, purpose: str = "exports") -> Path:
    """A local copy of a whole folder of a remote storage (kept in the cache and brought up to date); a local one as it is."""
    if storage.local:
        return Path(storage.uri)
    if not storage.listing():
        raise BlockforgeError(f"{storage}: holds no files; check the URI")
    local = storage.working_copy(purpose)
    Mirror(storage, "", local).pull()
    return local


def put_folder(local: Path, storage: Storage) -> None:
    """Copy a local folder up to a remote `storage`, removing there what the local folder does not hold."""
    mirror = Mirror(storage, "", local)
    mirror.pushed = {name: (-1, -1) for name in storage.listing()}  # everything differs: put up all, remove what is gone
    mirror.push()


# ---- one writer at a time ------------------------------------------------------------------------------------

LEASE_RENEW_S = 30.0
LEASE_STALE_S = 90.0  # a lease not renewed for this long was left by a process that is gone
_LIVE_LEASES: set[str] = set()  # the tokens of the leases this process holds


@dataclass(frozen=True)
class _Held:
    """A lease object as read: its bytes, its record, and why its record cannot be judged by its date (None: it can)."""

    raw: bytes
    record: dict
    damage: str | None

    @staticmethod
    def of(raw: bytes) -> "_Held":
        try:
            record = json.loads(raw)
        except ValueError:
            return _Held(raw, {}, "is not JSON")
        if not isinstance(record, dict):
            return _Held(raw, {}, "is not a JSON object")
        return _Held(raw, record, _lease_damage(record))

    @property
    def age(self) -> float:
        """Seconds since its last renewal by this machine's clock (0 for a date a little ahead: another host's clock)."""
        return max(0.0, time.time() - self.record["renewed"])


def _lease_damage(record: dict) -> str | None:
    """Why a lease record names no holder or no time this machine can judge it by: a field of the wrong type, a renewal
    that is no finite time, or one further in the future than clocks drift apart (None: a record as leases write it)."""
    renewed = record.get("renewed")
    if isinstance(renewed, bool) or not isinstance(renewed, (int, float)) or not math.isfinite(renewed):
        return f"says it was renewed at {json.dumps(renewed)[:40]}, which is no time"
    if renewed - time.time() > LEASE_STALE_S:
        return f"says it was renewed {renewed - time.time():.0f} s in the future (by this machine's clock)"
    pid, host, token = record.get("pid"), record.get("host"), record.get("token")
    if isinstance(pid, bool) or not isinstance(pid, int) or not isinstance(host, str) or not isinstance(token, str):
        return "names no holder (a pid, host and token)"
    return None


class Lease:
    """One writer of a folder of a storage, which has no flock: an object (`name`) naming its holder (pid, host), renewed
    every LEASE_RENEW_S while it works. Another process finding a fresh lease is refused, naming the holder; a stale one
    (not renewed for LEASE_STALE_S, or left by a process of this host that is gone: one that failed because the storage
    went away could not remove it) is taken over. A lease whose record cannot be dated (damaged, edited, or dated further
    ahead than clocks drift) is watched for two renewal periods: unchanged, no process holds it and it is taken over with
    a warning; renewed, its holder lives and the taker is refused. `check()` before a write says whether this one still
    holds it."""

    def __init__(self, storage: Storage, name: str, doing: str):
        self.storage, self.name, self.doing = storage, name, doing
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict:
        return {"token": self.token, "pid": os.getpid(), "host": socket.gethostname(), "renewed": time.time()}

    def _read(self) -> _Held | None:
        data = self.storage.read_bytes(self.name)
        return _Held.of(data) if data is not None else None

    def _stale(self, held: _Held) -> bool:
        from blockforge.lock import process_alive

        if held.age >= LEASE_STALE_S:
            return True
        pid = held.record["pid"]
        if held.record["host"] != socket.gethostname():
            return False
        return not process_alive(pid) or (pid == os.getpid() and held.record["token"] not in _LIVE_LEASES)

    def _watched(self, held: _Held) -> _Held | None:
        """A lease that cannot be dated, watched for two renewal periods: None when nothing renewed it (no process holds
        it), else what it was renewed to."""
        wait = 2 * LEASE_RENEW_S
        warn(f"{self.storage}/{self.name}: the lease {held.damage}; watching it for {wait:.0f} s: unless a process renews it "
             "meanwhile, this one takes it over")
        time.sleep(wait)
        now = self._read()
        return None if now is None or now.raw == held.raw else now

    def take(self) -> "Lease":
        held = self._read()
        if held is not None and held.damage is not None:
            held = self._watched(held)
        if held is not None and held.record.get("token") != self.token and (held.damage is not None or not self._stale(held)):
            raise FolderInUseError(self._refusal(held))
        self.storage.write_bytes(self.name, json.dumps(self._record()).encode())
        _LIVE_LEASES.add(self.token)
        time.sleep(0.5)  # two that started together: the one whose lease stands goes on
        try:
            self.check()
        except FolderInUseError:
            _LIVE_LEASES.discard(self.token)
            raise
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _refusal(self, held: _Held) -> str:
        holder = f"process {held.record.get('pid', '?')} on {held.record.get('host', '?')}"
        if held.damage is not None:  # renewed while watched, or overwritten under this holder
            return (f"{self.storage}: is in use by {holder}, which is {self.doing}, or by a process that rewrites its lease "
                    f"{self.name} ({held.damage}); stop that process (check the clocks of the machines that run it), or "
                    "choose another --out")
        return (f"{self.storage}: is in use by {holder}, which is {self.doing} (its lease was renewed {held.age:.0f} s ago); wait "
                f"for it to end, or choose another --out (a lease of a process that is gone lapses {LEASE_STALE_S:.0f} s after "
                "its last renewal)")

    def check(self) -> None:
        held = self._read()
        if held is None:
            raise FolderInUseError(f"{self.storage}: the lease of the process {self.doing} is gone from the storage (something "
                                   "else removed the folder's files)")
        if held.record.get("token") != self.token:
            raise FolderInUseError(self._refusal(held))

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            with contextlib.suppress(Exception):  # a storage gone for a moment: the next renewal tries again
                self.storage.write_bytes(self.name, json.dumps(self._record()).encode())

    def release(self, reachable: bool = True) -> None:
        """Stop renewing and remove the lease; not `reachable` (the storage just failed), leave it: a stale lease of this
        host's gone process is taken over, and asking a storage that is away only waits for its retries."""
        _LIVE_LEASES.discard(self.token)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not reachable:
            return
        with contextlib.suppress(Exception):
            held = self._read()
            if held is not None and held.record.get("token") == self.token:
                self.storage.delete(self.name)
