"""keeper.weights: safetensors read memory-mapped and checked, written tensor by tensor, dtypes kept."""

from __future__ import annotations

import json
import mmap
import struct

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file as np_load_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

from keeper.errors import InvalidModelError, InvalidWeightsError
from keeper.weights import SafeTensors, SafeTensorsWriter, check_weights, save_weights, weights_bytes

BF16 = np.dtype(ml_dtypes.bfloat16)


def sample() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a.weight": rng.standard_normal((3, 5)).astype(np.float32),
            "b.half": rng.standard_normal(7).astype(np.float16),
            "c.bf16": rng.standard_normal((2, 2, 3)).astype(BF16),
            "d.ids": np.arange(4, dtype=np.int64),
            "e.empty": np.zeros((0, 4), np.float32)}


def _base(arr: np.ndarray):
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr


def test_round_trip_keeps_values_and_dtypes_and_maps_the_file(tmp_path):
    data = sample()
    path = tmp_path / "w.safetensors"
    save_weights(data, path)
    st_ = SafeTensors(path)
    assert set(st_) == set(data) and st_.nbytes == sum(v.nbytes for v in data.values())
    for k, v in data.items():
        got = st_[k]
        assert got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got.view(np.uint8), v.view(np.uint8))
        assert not got.flags.writeable  # views of the mapping: nobody writes through them
    assert isinstance(_base(st_["a.weight"]), (mmap.mmap, memoryview))
    # the same bytes from memory
    mem = SafeTensors(weights_bytes(data))
    assert all(np.array_equal(mem[k].view(np.uint8), v.view(np.uint8)) for k, v in data.items())


def test_files_interoperate_with_the_safetensors_library(tmp_path):
    data = sample()
    ours = tmp_path / "ours.safetensors"
    save_weights(data, ours)
    loaded = torch_load_file(str(ours))
    assert loaded["c.bf16"].dtype == torch.bfloat16  # BF16 on disk, never widened
    assert torch.equal(loaded["c.bf16"].float(), torch.from_numpy(data["c.bf16"].astype(np.float32)))
    save_weights({"a": data["a.weight"], "h": data["b.half"]}, tmp_path / "plain.safetensors")
    plain = np_load_file(str(tmp_path / "plain.safetensors"))  # the library's numpy loader (it has no bfloat16)
    assert np.array_equal(plain["a"], data["a.weight"]) and np.array_equal(plain["h"], data["b.half"])
    theirs = tmp_path / "theirs.safetensors"
    src = {"w": torch.randn(4, 3, dtype=torch.bfloat16), "h": torch.randn(5, dtype=torch.float16),
           "f": torch.randn(2, 6)}
    torch_save_file(src, str(theirs))
    st_ = SafeTensors(theirs)
    assert st_["w"].dtype == BF16 and np.array_equal(st_["w"].astype(np.float32), src["w"].float().numpy())
    assert st_["h"].dtype == np.float16 and np.array_equal(st_["h"], src["h"].numpy())
    assert np.array_equal(st_["f"], src["f"].numpy())


def test_the_writer_places_tensors_in_any_order_and_requires_every_one(tmp_path):
    specs = {"x": (np.float32, (2, 3)), "y": (BF16, (4,))}
    with SafeTensorsWriter(tmp_path / "o.safetensors", specs) as w:
        w.write("y", np.arange(4, dtype=np.float32))  # cast to the declared dtype
        w.write("x", np.ones((2, 3)))
    st_ = SafeTensors(tmp_path / "o.safetensors")
    assert st_["y"].dtype == BF16 and st_["y"].astype(np.float32).tolist() == [0, 1, 2, 3]
    with pytest.raises(InvalidWeightsError, match="never written.*'y'"):
        with SafeTensorsWriter(tmp_path / "p.safetensors", specs) as w:
            w.write("x", np.ones((2, 3)))
    with pytest.raises(InvalidWeightsError, match="'x' has shape"):
        with SafeTensorsWriter(tmp_path / "q.safetensors", specs) as w:
            w.write("x", np.ones((3, 2)))


def test_the_writer_hashes_the_file_it_writes_in_file_order_and_only_then(tmp_path):
    import hashlib

    rng = np.random.default_rng(0)
    big = rng.standard_normal((700, 500)).astype(np.float32)  # over 1 MiB: hashed on the writer's second thread
    weights = {"z.big": big, "a.small": np.arange(6, dtype=np.float16), "m.bf16": big[:3].astype(BF16)}
    specs = {k: (v.dtype, v.shape) for k, v in weights.items()}
    with SafeTensorsWriter(tmp_path / "o.safetensors", specs) as w:
        assert w.names == sorted(weights)
        for k in w.names[:-1]:
            w.write(k, weights[k])
        w.write("z.big", big[:300])
        w.write("z.big", big[300:], start=300)  # row slices in order keep the hash going
    assert w.digest == hashlib.sha256((tmp_path / "o.safetensors").read_bytes()).hexdigest()
    assert dict(SafeTensors(tmp_path / "o.safetensors")).keys() == weights.keys()
    # out of file order, written twice, or with holes left as zeros: no digest, rather than a wrong one
    orders = {"reversed": [(k, 0, weights[k]) for k in reversed(sorted(weights))],
              "rewritten": [(k, 0, weights[k]) for k in sorted(weights)] + [("a.small", 0, weights["a.small"] * 2)]}
    for label, steps in orders.items():
        with SafeTensorsWriter(tmp_path / f"{label}.safetensors", specs) as w:
            for k, start, value in steps:
                w.write(k, value, start)
        assert w.digest is None, label
    with SafeTensorsWriter(tmp_path / "holes.safetensors", specs, missing_as_zeros=True) as w:
        w.write("a.small", weights["a.small"])
    assert w.digest is None


def _file(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("blob, match", [
    (b"", "too short"),
    (b"\x01\x02", "too short"),
    (struct.pack("<Q", 10**12) + b"{}", "does not fit"),
    (struct.pack("<Q", 4) + b"nope", "not JSON"),
    (_file([1, 2]), "JSON list"),
    (_file({"w": {"dtype": "F32", "shape": [2]}}), "malformed"),
    (_file({"w": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16), "dtype 'C64'"),
    (_file({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8), "non-negative"),
    (_file({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8), "byte range"),
    (_file({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "truncated"),
    (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "overlaps"),
    (_file({"__metadata__": {"a": 1}}), "__metadata__"),
])
def test_malformed_files_are_refused_with_a_named_reason(blob, match, tmp_path):
    with pytest.raises(InvalidWeightsError, match=match):
        SafeTensors(blob)
    if blob:
        (tmp_path / "bad.safetensors").write_bytes(blob)
        with pytest.raises(InvalidWeightsError, match=match):
            SafeTensors(tmp_path / "bad.safetensors")


def test_every_truncation_is_refused(tmp_path):
    full = weights_bytes(sample())
    for cut in range(0, len(full) - 1, 7):
        with pytest.raises(InvalidWeightsError):
            SafeTensors(full[:cut])
    with pytest.raises(InvalidWeightsError, match="no file"):
        SafeTensors(tmp_path / "absent.safetensors")
    assert issubclass(InvalidWeightsError, InvalidModelError)  # callers that catch model errors catch these


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_escape_as_anything_but_invalid_weights(data):
    try:
        st_ = SafeTensors(data)
    except InvalidWeightsError:
        return
    for k in st_:  # whatever parses is consistent: every tensor reads
        st_[k]


def test_check_weights_names_the_first_bad_tensor():
    st_ = SafeTensors(weights_bytes(sample()))
    ok = {"a.weight": (np.float32, (3, 5)), "c.bf16": (BF16, (2, 2, 3))}
    check_weights(st_, ok)
    with pytest.raises(InvalidWeightsError, match=r"'z' \(float32 \[1\]\) is missing"):
        check_weights(st_, {**ok, "z": (np.float32, (1,))})
    with pytest.raises(InvalidWeightsError, match=r"'a.weight' is float32 \[3, 5\], the graph says float32 \[5, 3\]"):
        check_weights(st_, {"a.weight": (np.float32, (5, 3))})
    with pytest.raises(InvalidWeightsError, match=r"'c.bf16' is bfloat16 .* the graph says float32"):
        check_weights(st_, {"c.bf16": (np.float32, (2, 2, 3))})
    check_weights(dict(sample()), ok)  # a mapping in memory is checked the same way
