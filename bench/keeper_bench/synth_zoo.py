"""A synthetic zoo for zoo-scale measurements: random specs of keeper_bench.families' five families in groups of
architectural neighbours (as a NAS or AutoML workload leaves them), and their match arrays synthesised from the
spec's layer sequence without building or exporting a model (checked against real exports by
:func:`check_synthesis`: the same layer classes, shapes and order).

Invariant: ``synth_arrays(spec)`` equals ``match_arrays`` of the spec's export in every array scoring reads
(``cls``, ``shape``, ``vectors``, ``total``).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from keeper.graph import Kind
from keeper.matching import MatchArrays, level_classes
from keeper_bench.families import FAMILIES, neighbours

__all__ = ["COMMON", "random_spec", "layer_sequence", "synth_arrays", "spec_key", "neighbour", "make_zoo",
           "make_queries", "export_onnx", "check_synthesis"]

COMMON = {"dim": 1, "in_channels": 1, "num_classes": 10, "input_length": 40}

def random_spec(rng: np.random.Generator, family: str) -> dict:
    """A random small spec of ``family`` (the keys keeper_bench.families.build takes)."""
    s = {"family": family, **COMMON}
    stages = int(rng.integers(2, 5))
    base = int(rng.choice([8, 12, 16, 24, 32, 48]))
    growth = float(rng.choice([1.5, 2.0]))
    widths = [max(4, int(round(base * growth ** i))) for i in range(stages)]
    kernel = int(rng.choice([3, 5, 7]))
    if family == "resnet":
        return {**s, "widths": widths, "blocks": [int(x) for x in rng.integers(1, 3, stages)], "kernel": kernel}
    if family == "vgg":
        return {**s, "widths": widths, "depths": [int(x) for x in rng.integers(1, 4, stages)], "kernel": kernel}
    if family == "mobilenetv2":
        return {**s, "stem_width": max(4, base // 2), "widths": widths,
                "blocks": [int(x) for x in rng.integers(1, 4, stages)], "expansion": int(rng.choice([2, 4, 6])),
                "kernel": kernel, "head_width": 4 * widths[-1]}
    if family == "transformer":
        heads = int(rng.choice([1, 2, 4]))
        d = heads * int(rng.choice([8, 12, 16, 24]))
        return {**s, "d_model": d, "heads": heads, "ffn": int(rng.choice([2, 4])) * d,
                "layers": int(rng.integers(1, 5)), "patch": int(rng.choice([1, 2, 4, 5, 8])), "pre_ln": True}
    return {**s, "widths": [int(rng.choice([16, 32, 64, 128, 256])) for _ in range(int(rng.integers(1, 5)))],
            "norm": str(rng.choice(["none", "layernorm", "batchnorm"]))}


def layer_sequence(spec: dict) -> list[tuple[int, tuple[int, ...], int, int, int]]:
    """(kind, canonical shape, vectors, input level, output level) of every weighted layer, in keeper.graph's
    canonical order; levels count the strided convs and pools before the layer (keeper.graph)."""
    f, k, cin0 = spec["family"], spec.get("kernel"), spec["in_channels"]
    conv = lambda o, i, kk, a=0, b=None: (Kind.CONV, (o, i, kk), 0, a, a if b is None else b)  # noqa: E731
    bn = lambda c, a=0: (Kind.BATCHNORM, (c,), 1, a, a)  # noqa: E731
    lin = lambda o, i: (Kind.LINEAR, (o, i), 1, 0, 0)  # noqa: E731 - linear layers carry no level
    out: list[tuple[int, tuple[int, ...], int, int, int]] = []
    if f == "resnet":
        w = spec["widths"]
        out += [conv(w[0], cin0, k), bn(w[0])]
        cin = w[0]
        for i, (c, n) in enumerate(zip(w, spec["blocks"])):
            for j in range(n):
                a = i - 1 if i > 0 and j == 0 else i  # the first block of a later stage has stride 2
                if (i > 0 and j == 0) or cin != c:  # downsampling block: the 1x1 shortcut sits beside conv1
                    out += [conv(c, cin, k, a, i), conv(c, cin, 1, a, i), bn(c, i), bn(c, i)]
                else:
                    out += [conv(c, cin, k, i), bn(c, i)]
                out += [conv(c, c, k, i), bn(c, i)]
                cin = c
        out.append(lin(spec["num_classes"], cin))
    elif f == "vgg":
        cin = cin0
        for i, (c, n) in enumerate(zip(spec["widths"], spec["depths"])):  # a max pool before each later stage
            for _ in range(n):
                out += [conv(c, cin, k, i), bn(c, i)]
                cin = c
        out.append(lin(spec["num_classes"], cin))
    elif f == "mobilenetv2":
        cin = spec["stem_width"]
        out += [conv(cin, cin0, 3), bn(cin)]
        for i, (c, n) in enumerate(zip(spec["widths"], spec["blocks"])):
            for j in range(n):
                h, a = cin * spec["expansion"], i - 1 if i > 0 and j == 0 else i  # a strided depthwise conv
                out += [conv(h, cin, 1, a), bn(h, a), (Kind.DWCONV, (h, 1, k), 0, a, i), bn(h, i), conv(c, h, 1, i),
                        bn(c, i)]
                cin = c
        last = len(spec["widths"]) - 1
        out += [conv(spec["head_width"], cin, 1, last), bn(spec["head_width"], last),
                lin(spec["num_classes"], spec["head_width"])]
    elif f == "transformer":
        d, p = spec["d_model"], spec["patch"]
        ln = (Kind.LAYERNORM, (d,), 1, 0, 0)
        out += [lin(d, cin0 * p), (Kind.PARAM, (d, 1, spec["input_length"] // p), 0, 0, 0)]
        for _ in range(spec["layers"]):
            out += [ln, lin(3 * d, d), lin(d, d), ln, lin(spec["ffn"], d), lin(d, spec["ffn"])]
        out += [ln, lin(spec["num_classes"], d)]
    else:
        cin = cin0 * spec["input_length"]
        for c in spec["widths"]:
            out.append(lin(c, cin))
            if spec["norm"] == "layernorm":
                out.append((Kind.LAYERNORM, (c,), 1, 0, 0))
            elif spec["norm"] == "batchnorm":
                out.append(bn(c))
            cin = c
        out.append(lin(spec["num_classes"], cin))
    return out


def synth_arrays(spec: dict) -> MatchArrays:
    """MatchArrays of ``spec`` without building or exporting it (default node rule: kind, rank and, for convs and
    BatchNorms, resolution levels; keeper.matching.level_classes).

    The tie-break arrays of MatchArrays (``skip``, ``edge``, ``context``: read only by the mapping, never by
    scoring) are 0.
    """
    seq = layer_sequence(spec)
    n = len(seq)
    shape = np.ones((n, 5), np.int64)
    for i, (_, s, _, _, _) in enumerate(seq):
        shape[i, :len(s)] = s
    cls = level_classes(np.array([r[0] for r in seq]), np.array([len(r[1]) for r in seq]),
                        np.array([r[3] for r in seq]), np.array([r[4] for r in seq]))
    vectors = np.array([v for _, _, v, _, _ in seq], np.int64)
    total = int(sum(int(np.prod(s)) + v * s[0] for _, s, v, _, _ in seq))
    fields = {f.name: np.zeros(n, np.int64) for f in dataclasses.fields(MatchArrays)}
    fields.update(cls=cls, shape=shape, vectors=vectors, total=total)
    return MatchArrays(**fields)


def spec_key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)


def neighbour(spec: dict, rng: np.random.Generator) -> dict | None:
    near = neighbours(spec, rng)
    return near[int(rng.integers(len(near)))] if near else None


def make_zoo(n: int, rng: np.random.Generator, group: int = 8) -> list[dict]:
    """``n`` distinct specs in groups of about ``group`` architectural neighbours."""
    specs: list[dict] = []
    seen: set[str] = set()
    while len(specs) < n:
        members = [random_spec(rng, str(rng.choice(FAMILIES)))]
        for _ in range(group * 3):
            if len(members) >= group:
                break
            v = neighbour(members[int(rng.integers(len(members)))], rng)
            if v is not None and spec_key(v) not in {spec_key(m) for m in members}:
                members.append(v)
        for m in members:
            if spec_key(m) not in seen and len(specs) < n:
                seen.add(spec_key(m))
                specs.append(m)
    return specs


def make_queries(zoo: list[dict], count: int, rng: np.random.Generator) -> list[dict]:
    keys = {spec_key(s) for s in zoo}
    out: list[dict] = []
    while len(out) < count:
        if rng.random() < 0.8:
            q = neighbour(zoo[int(rng.integers(len(zoo)))], rng)
        else:
            q = random_spec(rng, str(rng.choice(FAMILIES)))
        if q is not None and spec_key(q) not in keys:
            out.append(q)
    return out


# ---------------------------------------------------------------------------------------------- real models


def export_onnx(spec: dict, seed: int = 0) -> bytes:
    import torch

    from keeper_bench.families import build, example_input
    from keeper.torch_support import export

    torch.manual_seed(seed)
    return export(build(spec), example_input(spec), dynamo=False).onnx


def check_synthesis(rng: np.random.Generator, count: int) -> tuple[int, int]:
    """Synthesised arrays equal the arrays of real exports for ``count`` random specs."""
    from keeper.graph import load_graph
    from keeper.matching import match_arrays

    ok = 0
    for i in range(count):
        spec = random_spec(rng, FAMILIES[i % len(FAMILIES)])
        real, synth = match_arrays(load_graph(export_onnx(spec))), synth_arrays(spec)
        same = (np.array_equal(real.cls, synth.cls) and np.array_equal(real.shape, synth.shape)
                and np.array_equal(real.vectors, synth.vectors) and real.total == synth.total)
        ok += same
        if not same:
            print(f"  synthetic arrays differ from the export for {spec}", flush=True)
    return ok, count
