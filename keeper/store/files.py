"""The files of a zoo store on any ``pyarrow.fs`` filesystem: retried calls, atomic writes, reads, listing,
deletes, and verified local copies. :mod:`keeper.store` keeps its catalog on top of this layer.

Keys are paths relative to the store's base path (``blobs/<sha256>.onnx``, ``catalog/<name>.json``); the layout
and what a key means are the catalog's business, not this module's.

Invariants:
    * every filesystem call is retried a bounded number of times, with doubling waits, and then fails as a
      :class:`~keeper.errors.StoreError` naming the operation, the key and the store; ``FileNotFoundError`` is an
      answer, never retried;
    * :meth:`StoreFiles.write` replaces a key atomically: temp name under ``tmp/`` + rename where the filesystem
      renames, one PUT per key on object stores (atomic per key there). HDFS does not rename onto an existing
      file, so there the old file is deleted just before the rename;
    * data given as a local file is streamed in and out in chunks, never held whole; a file prepared in
      :meth:`StoreFiles.stage` on a local store is renamed into its key, never copied;
    * a local copy handed out by :meth:`StoreFiles.local_file` is checked against its sha256 once per process
      (file size and mtime); a remote copy that does not match is deleted, so it is never served again;
    * credentials in a URI never reach a message: :func:`redact` masks them.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from keeper.errors import StoreError

__all__ = ["StoreFiles", "Staged", "sha256", "redact", "permanent"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK = 1 << 24
# Object stores replace one key atomically but have no cheap rename; everything else gets temp + rename.
_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


#: Temp files older than this, of writers this host cannot check, are leftovers.
STALE_TEMP_S = 3600.0
# A temp name says who writes it, so a later writer can tell a dead writer's leftovers from a live one's file.
_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:64] or "host"
_TEMP_RE = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{32}\.")


def sha256(data: bytes | bytearray | memoryview | os.PathLike) -> str:
    """The hex sha256 of bytes, or of a local file's content (read in chunks)."""
    if isinstance(data, os.PathLike):
        h = hashlib.sha256()
        with open(data, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()
    return hashlib.sha256(data).hexdigest()


def size(data: bytes | bytearray | memoryview | os.PathLike) -> int:
    """Bytes in ``data``, or in the local file it names."""
    return os.path.getsize(data) if isinstance(data, os.PathLike) else memoryview(data).nbytes


def redact(uri: str) -> str:
    """Mask credentials a URI may carry (``s3://KEY:SECRET@bucket``, ``?secret_key=...``)."""
    uri = re.sub(r"(://)[^/@]*@", r"\1***@", uri)
    return re.sub(r"((?:access_key|secret_key|session_token)=)[^&]*", r"\1***", uri)


# A fault no retry mends, by errno, and what to do about it.
_PERMANENT_ERRNO = {
    errno.EROFS: "The zoo is on a read-only filesystem: read from it, and register into a writable zoo",
    errno.EACCES: "Permission denied: ask for write access to the zoo, or register into a zoo of your own",
    errno.EPERM: "Permission denied: ask for write access to the zoo, or register into a zoo of your own",
    errno.ENOTDIR: "A path in the zoo location is a file, not a directory: point the zoo at a directory",
    errno.EISDIR: "A key of the zoo is a directory, not a file: remove it",
    errno.ENOSPC: "The disk is full: free space, or move the zoo",
    errno.EDQUOT: "The disk quota is spent: free space, or move the zoo",
}
# The same for object stores, whose errors carry no errno: (words in the message, what to do).
_PERMANENT_WORDS = (
    (("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist"),
     "The bucket does not exist: create it, or fix the zoo URI"),
    (("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"),
     "Access denied: check the credentials and the bucket's policy"),
)


def permanent(exc: BaseException) -> str | None:
    """What to do about ``exc`` when it is a fault no retry mends (read-only, permission, not a directory, disk
    full, no such bucket, access denied); None when it may be transient."""
    code = getattr(exc, "errno", None)
    if code in _PERMANENT_ERRNO:
        return _PERMANENT_ERRNO[code]
    text = str(exc)
    for m in re.finditer(r"\[errno (\d+)\]", text):  # Arrow names the cause's errno in its message
        if int(m.group(1)) in _PERMANENT_ERRNO:
            return _PERMANENT_ERRNO[int(m.group(1))]
    for words, fix in _PERMANENT_WORDS:
        if any(w in text for w in words):
            return fix
    return None


def open_uri(uri: str) -> tuple[pafs.FileSystem, str, str | None]:
    """``(filesystem, base path, URI to show)`` of a local path or any URI ``pyarrow.fs.FileSystem.from_uri``
    opens; the URI to show is None for a local path (the base path is shown then)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri)), None
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = redact(str(exc))
        raise StoreError(f"cannot open the store URI {redact(uri)!r} ({reason}); use a local path, file://, "
                         "s3://bucket/prefix, gs://bucket/prefix or hdfs://host:port/path") from None
    return fs, base, redact(uri)


class Staged(os.PathLike):
    """A local file prepared for one key of a store (:meth:`StoreFiles.stage`); :meth:`StoreFiles.write` moves it
    into its key where it lies in that store's own ``tmp/`` (a rename: no copy of a model's weights)."""

    def __init__(self, path: str, owner: "StoreFiles | None") -> None:
        self.path = path
        self.owner = owner  # the store whose tmp/ holds it, or None for a file in a local temp directory
        self.moved = False

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Staged({self.path!r})"


class StoreFiles:
    """The files under ``base`` on ``fs``, read and written by key with bounded retries.

    Args:
        fs: any ``pyarrow.fs`` filesystem (replaceable later through :attr:`fs`, e.g. by a wrapper that injects
            faults).
        base: the store's base path on ``fs``.
        shown: how messages name the store (None: derived from ``fs`` and ``base``).
        retries: extra attempts of each call after the first one fails (0: no retry).
        retry_wait_s: wait before the first retry; it doubles on each further retry.
    """

    def __init__(self, fs: pafs.FileSystem, base: str, shown: str | None = None, *, retries: int = 3,
                 retry_wait_s: float = 0.2) -> None:
        if not isinstance(retries, int) or retries < 0:
            raise StoreError(f"retries={retries!r} is invalid; pass an integer >= 0")
        if not isinstance(retry_wait_s, (int, float)) or not retry_wait_s >= 0:
            raise StoreError(f"retry_wait_s={retry_wait_s!r} is invalid; pass a number of seconds >= 0")
        self.fs = fs
        self.base = base.rstrip("/") or "/"
        kind = fs.type_name if fs.type_name != "subtree" else getattr(fs, "base_fs", fs).type_name
        #: False on object stores, which have neither renames nor directories
        self.renames = kind not in _OBJECT_STORES
        #: the store as messages name it (credentials masked)
        self.uri = shown or (self.base if kind == "local" else f"{kind}://{self.base.lstrip('/')}")
        self.retries = retries
        self.retry_wait_s = float(retry_wait_s)

    @property
    def local(self) -> bool:
        """True when the files are this machine's own (then :meth:`local_file` hands them out in place)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base != "/" else f"/{key}"

    def make_dirs(self, subs: tuple[str, ...]) -> None:
        """Create the directories ``subs`` under the base path where the filesystem has directories."""
        if self.renames:  # object stores have no directories to make
            for sub in subs:
                self.call("create directory", sub, lambda p=self.path(sub): self.fs.create_dir(p, recursive=True))

    def call(self, op: str, key: str, fn: Callable[[], T], *, missing_ok: bool = False) -> T:
        """Run one filesystem call, retrying transient faults a bounded number of times; :class:`StoreError` once
        they are spent, or at once for a permanent fault (:func:`permanent`: read-only, permission, not a
        directory, no such bucket), which no retry can mend.

        ``FileNotFoundError`` is an answer, not a fault: never retried, re-raised as is when ``missing_ok``.
        """
        wait = self.retry_wait_s
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except FileNotFoundError as exc:
                if missing_ok:
                    raise
                err, attempts = exc, attempt
                break
            except (OSError, pa.ArrowException) as exc:
                err = exc
                fix = permanent(exc)
                if fix is not None:
                    raise StoreError(f"{op} of {key!r} in the zoo store at {self.uri} failed: {redact(str(exc))}. "
                                     f"{fix}; models stored before are intact") from exc
                if attempt < attempts:
                    log.debug("store %s: %s of %r failed (%s); retry %d/%d in %.2fs", self.uri, op, key, exc,
                              attempt, self.retries, wait)
                    time.sleep(wait)
                    wait *= 2
        raise StoreError(f"{op} of {key!r} in the zoo store at {self.uri} failed after {attempts} attempt(s): "
                         f"{redact(str(err))}. Check that the store is reachable, that the bucket or directory exists "
                         f"and that the credentials allow it; models stored before are intact") from err

    def read(self, key: str, *, missing_ok: bool = False) -> bytes:
        """The whole content of ``key`` (``FileNotFoundError`` when absent and ``missing_ok``)."""
        def read() -> bytes:
            with self.fs.open_input_stream(self.path(key)) as f:
                return f.read()
        return self.call("read", key, read, missing_ok=missing_ok)

    def write(self, key: str, data: bytes | bytearray | memoryview | os.PathLike) -> None:
        """Replace ``key`` atomically: one PUT on object stores, temp file + rename elsewhere. ``data`` may be a
        local file's path, streamed in chunks."""
        def put(path: str) -> Callable[[], None]:
            def write() -> None:
                with self.fs.open_output_stream(path) as f:
                    if isinstance(data, os.PathLike):
                        with open(data, "rb") as src:
                            while chunk := src.read(_CHUNK):
                                f.write(chunk)
                    else:
                        f.write(data)
            return write

        if isinstance(data, Staged) and data.owner is self:  # already in this store's tmp/: one rename
            self.call("rename", key, lambda: self._move(data.path, self.path(key)))
            data.moved = True
            return
        if not self.renames:
            self.call("write", key, put(self.path(key)))
            return
        tmp = self._temp_key(key.rsplit('/', 1)[-1])
        try:
            self.call("write", key, put(self.path(tmp)))  # named by its key: the temp name means nothing to users
            self.call("rename", key, lambda: self._move(self.path(tmp), self.path(key)))
        except StoreError:
            try:
                self.fs.delete_file(self.path(tmp))
            except (OSError, pa.ArrowException):
                pass  # a later writer's sweep removes it (sweep_temp)
            raise

    def _temp_key(self, suffix: str) -> str:
        """A fresh temp key under ``tmp/``, named by this writer's host and process (see :meth:`sweep_temp`)."""
        return f"tmp/{_HOST}-{os.getpid()}-{uuid.uuid4().hex}.{suffix}"

    @contextmanager
    def stage(self, suffix: str) -> Iterator[Staged]:
        """A local file to prepare a large blob in (a model's weights) before :meth:`write` puts it under its key,
        which may depend on the content (its sha256). On a local store the file lies in the store's own ``tmp/``
        (the same filesystem as the key), so the write is a rename; elsewhere it lies in a fresh local temp
        directory and the write streams it. The file is removed on exit unless it was moved into a key; one left
        by a killed process is swept like every temp file (:meth:`sweep_temp`)."""
        tmp_dir = self.path("tmp")
        if self.local and os.path.isdir(tmp_dir):
            staged, scratch = Staged(self.path(self._temp_key(suffix)), self), None
        else:
            scratch = tempfile.mkdtemp(prefix="keeper-stage-")
            staged = Staged(os.path.join(scratch, suffix), None)
        try:
            yield staged
        finally:
            if not staged.moved and os.path.exists(staged.path):
                os.remove(staged.path)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def write_once(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists; False when it did. Only for content-addressed keys: two writers of one
        key write the same bytes, so a race between them stores those bytes either way."""
        try:
            self.read(key, missing_ok=True)
            return False
        except FileNotFoundError:
            self.write(key, data)
            return True

    def copy(self, src: str, dst: str) -> None:
        """Copy key ``src`` to key ``dst`` atomically, for immutable blobs (content-addressed, written once): a hard
        link on a local store (no bytes copied), the filesystem's own copy elsewhere (a server-side copy on object
        stores, one key at once), through a temp name and a rename where the filesystem renames. ``dst`` is left
        as it is when it exists (the same content by its key). ``FileNotFoundError`` when ``src`` is absent."""
        if self.local:
            def link() -> bool:
                try:
                    os.link(self.path(src), self.path(dst))
                except FileExistsError:
                    pass
                except OSError as exc:  # a filesystem without hard links (some network mounts): copy the bytes
                    if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                        raise
                    return False
                return True
            if self.call("link", dst, link, missing_ok=True):
                return
        if not self.renames:
            self.call("copy", dst, lambda: self.fs.copy_file(self.path(src), self.path(dst)), missing_ok=True)
            return
        tmp = self._temp_key(dst.rsplit("/", 1)[-1])
        try:
            self.call("copy", dst, lambda: self.fs.copy_file(self.path(src), self.path(tmp)), missing_ok=True)
            self.call("rename", dst, lambda: self._move(self.path(tmp), self.path(dst)))
        finally:
            try:
                self.fs.delete_file(self.path(tmp))
            except (OSError, pa.ArrowException):
                pass  # renamed into its key, or never written

    def exists_key(self, key: str) -> bool:
        """Whether the file ``key`` is there."""
        info = self.call("look up", key, lambda: self.fs.get_file_info(self.path(key)))
        return info.type == pafs.FileType.File

    def list_dirs(self, sub: str) -> list[pafs.FileInfo]:
        """The directories (object stores: the common prefixes) right under ``sub``; none when it does not exist."""
        sel = pafs.FileSelector(self.path(sub), allow_not_found=True)
        infos = self.call("list", sub + "/", lambda: self.fs.get_file_info(sel))
        return [i for i in infos if i.type == pafs.FileType.Directory]

    def delete_dir(self, sub: str) -> bool:
        """Delete the directory ``sub`` and everything under it; False when it was not there."""
        path = self.path(sub)

        def delete() -> None:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                raise FileNotFoundError(path)
            self.fs.delete_dir(path)
        try:
            self.call("delete", sub + "/", delete, missing_ok=True)
        except FileNotFoundError:
            return False
        return True

    def _move(self, src: str, dst: str) -> None:
        try:
            self.fs.move(src, dst)  # POSIX rename: atomic replace
        except FileNotFoundError:
            raise
        except OSError:
            # HDFS refuses to rename onto an existing file; the catalog entry is then briefly absent.
            if self.fs.get_file_info(dst).type == pafs.FileType.NotFound:
                raise
            self.fs.delete_file(dst)
            self.fs.move(src, dst)

    def list(self, sub: str) -> list[pafs.FileInfo]:
        """The files (not directories) right under ``sub``; none when it does not exist."""
        sel = pafs.FileSelector(self.path(sub), allow_not_found=True)
        infos = self.call("list", sub + "/", lambda: self.fs.get_file_info(sel))
        return [i for i in infos if i.type == pafs.FileType.File]

    def exists(self) -> bool:
        """Whether a store is here: its catalog directory, or on an object store (no directories) any key under the
        base path. A missing bucket or directory is an answer (False), not an error."""
        if self.renames:
            info = self.call("look up", "catalog/", lambda: self.fs.get_file_info(self.path("catalog")))
            return info.type == pafs.FileType.Directory
        sel = pafs.FileSelector(self.base, allow_not_found=True)
        return bool(self.call("list", "", lambda: self.fs.get_file_info(sel)))

    def sweep_temp(self, stale_s: float = STALE_TEMP_S) -> int:
        """Delete the temp files of writers that are gone; returns how many. A temp file's writer is gone when it
        ran on this host and its process has exited, or, for other hosts' writers and older names, when the file
        is older than ``stale_s`` (a live writer's file grows or is renamed long before that)."""
        if not self.renames:
            return 0  # object stores write each key in one PUT: no temp files
        count = 0
        now_ns = time.time_ns()
        for info in self.list("tmp"):
            m = _TEMP_RE.match(info.base_name)
            if m is not None and m["host"] == _HOST:
                gone = not _alive(int(m["pid"]))
            else:
                gone = info.mtime_ns is not None and now_ns - info.mtime_ns > stale_s * 1e9
            if gone and self.delete(f"tmp/{info.base_name}"):
                count += 1
        if count:
            log.info("store %s: removed %d temp file(s) of writers that are gone", self.uri, count)
        return count

    def delete(self, key: str) -> bool:
        """Delete ``key``; False when it was not there."""
        try:
            self.call("delete", key, lambda: self.fs.delete_file(self.path(key)), missing_ok=True)
        except FileNotFoundError:
            return False
        return True

    # -- local copies, for memory-mapping
    def local_file(self, key: str, name: str) -> str:
        """A local path holding ``key``: the file itself on a local filesystem, else ``name`` in this process's
        download directory, streamed there on first use and kept (``name`` must say the content, e.g. carry its
        sha256). Check it with :meth:`verify_local` before use."""
        if self.local:
            return self.path(key)
        path = os.path.join(_download_dir(), name)
        if not os.path.exists(path):
            self._download(key, path)
        return path

    def verify_local(self, path: str, checksum: str) -> bool:
        """Whether the local file ``path`` has sha256 ``checksum`` (hashed once per process while its size and
        mtime stay); a copy that does not match is deleted, unless the filesystem is local (then it is the stored
        file itself). ``FileNotFoundError`` when ``path`` is absent."""
        st = os.stat(path)
        stamp = (path, st.st_size, st.st_mtime_ns, checksum)
        if stamp in _VERIFIED:
            return True
        if sha256(Path(path)) != checksum:
            if not self.local:
                os.remove(path)  # a damaged copy must not be served again once the store is repaired
            return False
        _VERIFIED.add(stamp)
        return True

    def trust_local(self, key: str, checksum: str) -> None:
        """Record that the local file of ``key`` has sha256 ``checksum`` (it was just written from bytes just
        hashed), so :meth:`verify_local` does not hash it again. Nothing on other filesystems."""
        if self.local:
            st = os.stat(self.path(key))
            _VERIFIED.add((self.path(key), st.st_size, st.st_mtime_ns, checksum))

    def _download(self, key: str, path: str) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.part"

        def fetch() -> None:
            with self.fs.open_input_stream(self.path(key)) as src, open(tmp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
        try:
            self.call("read", key, fetch)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (one this process may not signal runs too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# local files already checked against their checksum in this process: (path, size, mtime_ns, sha256)
_VERIFIED: set[tuple[str, int, int, str]] = set()
_DOWNLOADS: list[str] = []


def _download_dir() -> str:
    """This process's directory for files copied from remote stores, removed when the process exits (a file
    still memory-mapped then stays readable until unmapped)."""
    if not _DOWNLOADS:
        _DOWNLOADS.append(tempfile.mkdtemp(prefix="keeper-blobs-"))
        atexit.register(shutil.rmtree, _DOWNLOADS[0], True)
    return _DOWNLOADS[0]
