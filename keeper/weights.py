"""Weights apart from the graph: safetensors files read memory-mapped and checked, written tensor by tensor.

A model of any size is its graph (ONNX without the parameter data, kilobytes) plus its weights in safetensors,
so no model is bounded by protobuf's 2 GiB. The format is an 8-byte little-endian header length, a JSON header
(tensor name -> dtype, shape, byte range), then the raw little-endian data.

Invariants:
    * reading executes and unpickles nothing, and opens only the path the caller gives (never one a model names);
    * a file is accepted only when its header parses, every tensor's dtype is known, its byte range lies inside
      the data and holds exactly shape x item size bytes, and no two ranges overlap;
    * tensors come back as read-only numpy views of the file's memory map (no copy, no page read until used);
    * float32, float16 and bfloat16 keep their dtype on disk and in memory (bfloat16 is ``ml_dtypes.bfloat16``,
      which ``onnx.numpy_helper`` uses too), never widened.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Mapping, Union

import ml_dtypes
import numpy as np

from keeper.errors import InvalidWeightsError

__all__ = ["SafeTensors", "SafeTensorsWriter", "WeightsInput", "open_weights", "save_weights", "weights_bytes",
           "check_weights", "staged_weights", "MAX_HEADER_BYTES", "MAX_WEIGHTS_BYTES"]

WeightsInput = Union[bytes, bytearray, memoryview, str, os.PathLike, Mapping[str, np.ndarray]]

#: The JSON header may not exceed this (the safetensors library's own limit).
MAX_HEADER_BYTES = 100_000_000
#: A weights file may not exceed this (1 TiB); raise ``KEEPER_MAX_WEIGHTS_BYTES`` for larger models.
MAX_WEIGHTS_BYTES = int(os.environ.get("KEEPER_MAX_WEIGHTS_BYTES", 2**40))

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_CODES = {dt: code for code, dt in _DTYPES.items()}


def dtype_code(dtype: np.dtype, name: str = "tensor") -> str:
    """The safetensors code of a numpy dtype (``F32``, ``BF16``...)."""
    code = _CODES.get(np.dtype(dtype))
    if code is None:
        raise InvalidWeightsError(f"weights: tensor {name!r} has dtype {np.dtype(dtype)}, which safetensors cannot "
                                  f"store; use one of {sorted(str(d) for d in _CODES)}")
    return code


class SafeTensors(Mapping[str, np.ndarray]):
    """A checked safetensors file or buffer; ``st[name]`` is a read-only view (memory-mapped for files).

    Example:
        >>> st = SafeTensors("model.safetensors")          # doctest: +SKIP
        >>> st["fc.weight"].dtype, st.spec("fc.weight")    # doctest: +SKIP
    """

    def __init__(self, source: bytes | bytearray | memoryview | str | os.PathLike, what: str = "weights"):
        self.what = what
        self.path: str | None = None
        if isinstance(source, (str, os.PathLike)):
            self.path = os.fspath(source)
            if not os.path.isfile(self.path):
                raise InvalidWeightsError(f"{what}: no file at {self.path!r}; pass a .safetensors file or its bytes")
            size = os.path.getsize(self.path)
            if size == 0:
                raise InvalidWeightsError(f"{what}: {self.path!r} is empty; expected a safetensors file")
            with open(self.path, "rb") as f:  # the map outlives the descriptor
                self._buf: memoryview = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self._buf = memoryview(source).cast("B")
        else:
            raise InvalidWeightsError(f"{what}: got {type(source).__name__}; expected safetensors bytes or a path "
                                      "to a .safetensors file")
        self._specs, self.metadata, self._start = _parse_header(self._buf, what)

    def spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        """(dtype, shape) of ``name`` without touching its data."""
        dtype, shape, _, _ = self._specs[name]
        return dtype, shape

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return sum(e - b for _, _, b, e in self._specs.values())

    def __getitem__(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self._specs[name]
        arr = np.frombuffer(self._buf, dtype=dtype, count=(end - begin) // dtype.itemsize,
                            offset=self._start + begin).reshape(shape)
        arr.flags.writeable = False
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"SafeTensors({self.path or '<bytes>'!r}, tensors={len(self)}, bytes={self.nbytes})"


def _parse_header(buf: memoryview, what: str) -> tuple[dict, dict, int]:
    if len(buf) < 8:
        raise InvalidWeightsError(f"{what}: {len(buf)} bytes is too short for a safetensors file (8-byte header "
                                  "length first); the file is truncated or not safetensors")
    if len(buf) > MAX_WEIGHTS_BYTES:
        raise InvalidWeightsError(f"{what}: {len(buf)} bytes exceeds the cap of {MAX_WEIGHTS_BYTES}; raise "
                                  "KEEPER_MAX_WEIGHTS_BYTES if this is intended")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(buf):
        raise InvalidWeightsError(f"{what}: header length {n} does not fit the {len(buf)}-byte file (or exceeds "
                                  f"{MAX_HEADER_BYTES}); the file is truncated or not safetensors")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidWeightsError(f"{what}: the header is not JSON ({exc}); the file is corrupt or not "
                                  "safetensors") from None
    if not isinstance(header, dict):
        raise InvalidWeightsError(f"{what}: the header is a JSON {type(header).__name__}, expected an object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InvalidWeightsError(f"{what}: __metadata__ must map strings to strings")
    data_len = len(buf) - 8 - n
    specs: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
    for name, entry in header.items():
        try:
            code, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise InvalidWeightsError(f"{what}: tensor {name!r} has a malformed header entry ({exc!r}); expected "
                                      "dtype, shape and data_offsets") from None
        if code not in _DTYPES:
            raise InvalidWeightsError(f"{what}: tensor {name!r} has dtype {code!r}; keeper reads "
                                      f"{sorted(_DTYPES)}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in (begin, end)):
            raise InvalidWeightsError(f"{what}: tensor {name!r} has shape {list(shape)} and offsets "
                                      f"{[begin, end]}; expected non-negative integers")
        dtype = _DTYPES[code]
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if not 0 <= begin <= end <= data_len or end - begin != need:
            raise InvalidWeightsError(f"{what}: tensor {name!r} ({code} {list(shape)}, {need} bytes) has byte "
                                      f"range [{begin}, {end}) in {data_len} bytes of data; the file is truncated "
                                      "or corrupt: write it again")
        specs[name] = (dtype, shape, begin, end)
    last = 0
    for name, (_, _, begin, end) in sorted(specs.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < last:
            raise InvalidWeightsError(f"{what}: tensor {name!r} overlaps another tensor's bytes; the file is "
                                      "corrupt: write it again")
        last = max(last, end)
    return specs, meta, 8 + n


class SafeTensorsWriter:
    """Write a safetensors file tensor by tensor: the layout is fixed from the specs up front, so each tensor is
    written to its place as soon as it exists and need not be kept (peak memory: one tensor).

    The writer hashes what it writes: when the tensors arrive whole (or in row slices) in file order
    (:attr:`names`), :attr:`digest` is the sha256 of the finished file, computed from the very buffers handed to
    the file (on a second thread, beside the writes), so the caller never reads the file back to hash it. Written
    in any other order, or with tensors left to ``missing_as_zeros``, :attr:`digest` is None.

    Example:
        >>> with SafeTensorsWriter("out.safetensors", {"w": (np.float32, (2, 3))}) as w:  # doctest: +SKIP
        ...     w.write("w", np.zeros((2, 3), np.float32))
        >>> w.digest                                                                     # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                 metadata: Mapping[str, str] | None = None, *, missing_as_zeros: bool = False):
        """``missing_as_zeros``: tensors never written read as zeros (the file is sparse there) instead of
        :meth:`close` refusing them."""
        self.path = os.fspath(path)
        self.missing_as_zeros = missing_as_zeros
        header: dict = {"__metadata__": dict(metadata)} if metadata else {}
        self._slots: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        self._left: dict[str, int] = {}  # bytes of each tensor not yet written
        offset = 0
        for name in sorted(specs):
            dtype, shape = np.dtype(specs[name][0]), tuple(int(d) for d in specs[name][1])
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            header[name] = {"dtype": dtype_code(dtype, name), "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            self._slots[name] = (dtype, shape, offset)
            self._left[name] = size
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the safetensors library writes it
        self._start = 8 + len(raw)
        self._end = self._start + offset
        head = struct.pack("<Q", len(raw)) + raw
        self._hash: hashlib._Hash | None = hashlib.sha256(head)
        self._hashed_to = len(head)  # the file's bytes [0, _hashed_to) are in the hash, in order
        self._hasher: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._digest: str | None = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(self._fd, head, 0)
            os.ftruncate(self._fd, self._end)
        except OSError:
            os.close(self._fd)
            raise

    @property
    def names(self) -> list[str]:
        """The tensors in file order: writing them in this order lets the writer hash the file as it goes."""
        return list(self._slots)

    @property
    def digest(self) -> str | None:
        """After :meth:`close`: the hex sha256 of the file when every byte was written in file order, else None."""
        return self._digest

    def write(self, name: str, value: np.ndarray, start: int = 0) -> None:
        """Store ``value`` (cast to the declared dtype) as tensor ``name``, or as its rows ``start...`` along the
        first axis (a tensor larger than memory written in slices)."""
        if name not in self._slots:
            raise InvalidWeightsError(f"{self.path}: tensor {name!r} was not declared; declared "
                                      f"{sorted(self._slots)[:5]}...")
        dtype, shape, offset = self._slots[name]
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        whole = start == 0 and arr.shape == shape
        if not whole and not (arr.ndim == len(shape) >= 1 and arr.shape[1:] == shape[1:]
                              and 0 <= start and start + arr.shape[0] <= shape[0]):
            raise InvalidWeightsError(f"{self.path}: tensor {name!r} has shape {arr.shape} at row {start}, declared "
                                      f"{shape}")
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize if shape else 0
        view = memoryview(arr.reshape(-1).view(np.uint8))
        at = self._start + offset + start * row
        self._hash_next(view, at)
        done = 0
        while done < len(view):  # pwrite may write less than asked for large buffers
            done += os.pwrite(self._fd, view[done:], at + done)
        self._left[name] -= len(view)

    def _hash_next(self, view: memoryview, at: int) -> None:
        """Add ``view`` (the bytes going to file offset ``at``) to the running hash if they follow what it holds;
        else give the digest up. hashlib releases the GIL on large buffers, so one worker thread hashes tensor i
        while this thread writes it: a single worker keeps the updates in file order."""
        if self._hash is None:
            return
        if at != self._hashed_to:  # out of file order, or written again: the hash cannot say what the file holds
            self._stop_hashing()
            self._hash = None
            return
        self._hashed_to += len(view)
        if len(view) < 1 << 20 and self._hasher is None:
            self._hash.update(view)
            return
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keeper-sha256")
        self._pending = self._hasher.submit(self._hash.update, view)  # view keeps its array alive until hashed

    def _stop_hashing(self) -> None:
        """Wait for the hashing thread and let it go; the hash is given up unless it covers the whole file."""
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
            self._hasher = None
            if self._pending is not None:
                self._pending.result()  # an error in hashing is an error of the write
        self._pending = None
        if self._hashed_to != self._end:
            self._hash = None

    def close(self) -> None:
        """Close the file; every declared tensor must have been written."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        self._stop_hashing()
        self._digest = self._hash.hexdigest() if self._hash is not None else None
        missing = sorted(k for k, left in self._left.items() if left > 0)
        if missing and not self.missing_as_zeros:
            raise InvalidWeightsError(f"{self.path}: {len(missing)} declared tensors were never written "
                                      f"(first: {missing[0]!r})")

    def __enter__(self) -> "SafeTensorsWriter":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        elif self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._stop_hashing()
            self._hash = None


def save_weights(weights: Mapping[str, np.ndarray], path: str | os.PathLike,
                 metadata: Mapping[str, str] | None = None) -> None:
    """Write ``weights`` to a safetensors file, one tensor at a time."""
    specs = {k: (np.asarray(v).dtype, np.shape(v)) for k, v in weights.items()}
    with SafeTensorsWriter(path, specs, metadata) as w:
        for k in w.names:
            w.write(k, weights[k])


def weights_bytes(weights: Mapping[str, np.ndarray]) -> bytes:
    """``weights`` as safetensors bytes (small models and tests; large ones go to a file)."""
    header: dict = {}
    parts: list[bytes] = []
    offset = 0
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name])
        header[name] = {"dtype": dtype_code(arr.dtype, name), "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        parts.append(arr.reshape(-1).view(np.uint8).tobytes())
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(parts)


def open_weights(weights: WeightsInput, what: str = "weights") -> Mapping[str, np.ndarray]:
    """A mapping of name -> array from safetensors bytes, a path, or a mapping already in memory."""
    if isinstance(weights, Mapping):
        return weights
    if isinstance(weights, (str, os.PathLike)):
        return SafeTensors(Path(weights), what)
    return SafeTensors(weights, what)


def check_weights(weights: Mapping[str, np.ndarray], specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                  what: str = "weights") -> None:
    """Raise :class:`InvalidWeightsError` naming the first tensor of ``specs`` that ``weights`` lacks or holds with
    another dtype or shape. Reads headers only (``SafeTensors.spec``), never tensor data."""
    for name, (dtype, shape) in specs.items():
        if name not in weights:
            raise InvalidWeightsError(f"{what}: tensor {name!r} ({np.dtype(dtype)} {list(shape)}) is missing; the "
                                      "weights must hold every initializer the graph leaves without data, under "
                                      "its ONNX name")
        have_dtype, have_shape = (weights.spec(name) if isinstance(weights, SafeTensors)
                                  else (np.asarray(weights[name]).dtype, np.shape(weights[name])))
        if tuple(have_shape) != tuple(shape) or np.dtype(have_dtype) != np.dtype(dtype):
            raise InvalidWeightsError(f"{what}: tensor {name!r} is {np.dtype(have_dtype)} {list(have_shape)}, the "
                                      f"graph says {np.dtype(dtype)} {list(shape)}; the weights belong to another "
                                      "architecture or precision: export them from the same model")


def staged_weights(weights: WeightsInput, specs: dict, what: str,
                   staged: os.PathLike) -> tuple[os.PathLike, str | None]:
    """``(file, its sha256 or None)``: a safetensors file holding exactly the tensors ``specs`` names, checked
    against them: the caller's own file when it holds just those (its sha256 not yet known), else a new one
    written tensor by tensor into ``staged``, hashed as it is written."""
    st = open_weights(weights, what)
    check_weights(st, specs, what)
    if isinstance(st, SafeTensors) and st.path is not None and set(st) == set(specs):
        return Path(st.path), None
    with SafeTensorsWriter(staged, specs) as w:
        for k in w.names:  # in file order: the writer hashes the bytes as it writes them
            w.write(k, st[k])
    return staged, w.digest
