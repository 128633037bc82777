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
    * the cache is an optimisation: no failure to read or write it fails a warm start (a write that fails is
      reported once per process as a warning).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from keeper.store.stored import graph_blob, graph_from_blob

__all__ = ["directory", "load", "save", "ENV"]

#: Environment variable naming the cache directory; ``off`` (or ``0``) disables the disk cache.
ENV = "KEEPER_ARCH_CACHE"
_FORMAT = 1
_warned = False


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


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
