"""Architecture exports kept on local disk, so a fresh process (a Tune trial, a Ray Train worker, the next job on
the node) never traces an architecture another process already traced.

One entry is three files named by the module's fingerprint (:func:`keeper.torch_support.cache.fingerprint`) in
:func:`directory`: ``<fp>.onnx`` (the graph without weights), ``<fp>.npz`` (its LayerGraph as plain arrays) and
``<fp>.json`` (the ONNX-to-state_dict map, the tensors the graph holds as data with their digest, every
parameter's and buffer's name, shape and dtype, and the sha256 of the other two files). Nothing is ever unpickled.

Invariants:
    * an entry is used only when every parameter and buffer of the module has the name, shape and dtype the entry
      recorded (a fingerprint collision cannot pass unseen), its files hash to what it recorded, and the tensors
      the graph holds as data are unchanged; an entry that fails a check, or cannot be read, is ignored and
      overwritten by a fresh export;
    * writes are atomic (a temp file renamed into place): a reader sees a whole entry or none, and two processes
      exporting one architecture at once both succeed;
    * a process that misses an entry another process of the node is exporting waits for it (:func:`exporting`, a
      file lock per entry, held only while that export runs) instead of tracing it again: the trials a job starts at
      once on a node trace each architecture once, not once per trial;
    * the cache is an optimisation: no failure to read or write it fails a warm start (a write that fails is
      reported once per process as a warning).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from keeper.store.stored import graph_blob, graph_from_blob

try:
    import fcntl
except ImportError:  # Windows: no flock; concurrent processes may then export one architecture each
    fcntl = None

__all__ = ["directory", "exporting", "load", "save", "ENV", "LOCK_WAIT_S"]

#: Environment variable naming the cache directory; ``off`` (or ``0``) disables the disk cache.
ENV = "KEEPER_ARCH_CACHE"
_FORMAT = 1
_warned = False
#: The longest a process waits for another's export of the same entry before exporting it itself (an export that
#: falls back to the dynamo exporter takes seconds; a holder that dies releases its lock at once).
LOCK_WAIT_S = 120.0


def directory() -> Path | None:
    """The cache directory: ``$KEEPER_ARCH_CACHE``, else ``$XDG_CACHE_HOME/keeper/architectures``, else
    ``~/.cache/keeper/architectures``; None when disabled."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "keeper" / "architectures"


def tensor_specs(module: torch.nn.Module) -> dict[str, list]:
    """Every parameter's and buffer's name -> [shape, dtype] (tied names each listed)."""
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return {k: [list(t.shape), str(t.dtype)] for k, t in named.items()}


def load(key: str, module: torch.nn.Module) -> tuple[bytes, dict, dict, Any, tuple[str, ...], str] | None:
    """(onnx, keys, apart, graph, baked keys, baked digest) of entry ``key`` if it exists and its tensor specs are
    the module's, else None."""
    root = directory()
    if root is None:
        return None
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        if meta.get("format") != _FORMAT or meta.get("tensors") != tensor_specs(module):
            return None
        onnx, blob = (root / f"{key}.onnx").read_bytes(), (root / f"{key}.npz").read_bytes()
        if meta.get("sha256") != [_sha(onnx), _sha(blob)]:
            return None  # a file cut short or replaced
        graph = graph_from_blob(blob)
        keys = {k: (v[0], v[1]) for k, v in meta["keys"].items()}
        return onnx, keys, dict(meta["apart"]), graph, tuple(meta["baked"]), meta["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or written by another version: export again


def save(key: str, module: torch.nn.Module, result: Any, baked: tuple[str, ...], digest: str) -> None:
    """Write ``result`` (an Exported whose ``graph`` is set) as entry ``key``; failures warn once, never raise."""
    global _warned
    root = directory()
    if root is None or result.graph is None:
        return
    blob = graph_blob(result.graph)
    meta = {"format": _FORMAT, "keys": {k: list(v) for k, v in result.keys.items()}, "apart": result.apart,
            "baked": list(baked), "digest": digest, "tensors": tensor_specs(module),
            "sha256": [_sha(result.onnx), _sha(blob)]}
    try:
        root.mkdir(parents=True, exist_ok=True)
        # the json last: an entry is whole once it lands (its hashes reject the files of a writer still at work)
        for suffix, data in ((".onnx", result.onnx), (".npz", blob), (".json", json.dumps(meta).encode())):
            fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}{suffix}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, root / f"{key}{suffix}")
            except BaseException:
                _unlink(tmp)
                raise
    except OSError as e:
        if not _warned:
            _warned = True
            warnings.warn(f"keeper could not keep an architecture export in {root} ({e}); each new process will "
                          f"export again. Set {ENV} to a writable directory, or to 'off'.", stacklevel=3)


@contextlib.contextmanager
def exporting(key: str, wait_s: float = LOCK_WAIT_S):
    """Hold this node's lock on entry ``key`` while the caller exports it and saves it: a process that misses the
    same entry meanwhile waits here, then finds the entry on disk (the caller looks again once inside). Best-effort:
    without a cache directory, where file locks are unavailable, or once ``wait_s`` runs out, the caller goes on
    without the lock (at worst a second trace, never a failure)."""
    root = directory()
    fd = None
    if root is not None and fcntl is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(root / f".{key}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        except OSError:
            fd = None
    try:
        deadline = time.monotonic() + wait_s
        while fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            except OSError:  # a filesystem without locks
                break
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
