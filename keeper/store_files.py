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
    * data given as a local file is streamed in and out in chunks, never held whole;
    * a local copy handed out by :meth:`StoreFiles.local_file` is checked against its sha256 once per process
      (file size and mtime); a remote copy that does not match is deleted, so it is never served again;
    * credentials in a URI never reach a message: :func:`redact` masks them.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from keeper.errors import StoreError

__all__ = ["StoreFiles", "sha256", "redact"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CHUNK = 1 << 24
# Object stores replace one key atomically but have no cheap rename; everything else gets temp + rename.
_OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


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
        """Run one filesystem call with bounded retries; :class:`StoreError` once they are spent.

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
                if attempt < attempts:
                    log.debug("store %s: %s of %r failed (%s); retry %d/%d in %.2fs", self.uri, op, key, exc,
                              attempt, self.retries, wait)
                    time.sleep(wait)
                    wait *= 2
        raise StoreError(f"{op} of {key!r} in the zoo store at {self.uri} failed after {attempts} attempt(s): "
                         f"{err}. Check that the store is reachable, that the bucket or directory exists and that "
                         f"the credentials allow it; models stored before are intact") from err

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

        if not self.renames:
            self.call("write", key, put(self.path(key)))
            return
        tmp = f"tmp/{uuid.uuid4().hex}.{key.rsplit('/', 1)[-1]}"
        try:
            self.call("write", tmp, put(self.path(tmp)))
            self.call("rename", key, lambda: self._move(self.path(tmp), self.path(key)))
        except StoreError:
            try:
                self.fs.delete_file(self.path(tmp))
            except (OSError, pa.ArrowException):
                pass  # the catalog's gc removes leftover temp files
            raise

    def write_once(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists; False when it did. Only for content-addressed keys: two writers of one
        key write the same bytes, so a race between them stores those bytes either way."""
        try:
            self.read(key, missing_ok=True)
            return False
        except FileNotFoundError:
            self.write(key, data)
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
        """Record that the local file of ``key`` has sha256 ``checksum`` (it was just written from a file just
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
