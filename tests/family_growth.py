"""Growth pairs of the benchmark's model families (:mod:`keeper_bench.families`), measured as the Hugging Face pairs
are (:func:`hf_growth.warm_deviation`): the parent made trained-like, the child warmed with ``noise=0``, the max
relative deviation of its outputs, and whether keeper flagged the warm ``preserved``. The tests walk them
(tests/test_preservation.py) and so does ``scripts/bench_growth.py`` (reports/growth.md).

:data:`PAIRS` lists, per family, growth by integer factors and by factors that do not divide (x1.5, x4/3), in
widths, heads, expansion and depth, so that a walk over them checks that ``preserved`` implies exactness.

Example:
    >>> r = growth_deviation(*PAIRS["resnet"][0][1:], dynamo=False)  # doctest: +SKIP
    >>> r.preserved, r.warm                                            # doctest: +SKIP
    (True, 1.7e-07)
"""

from __future__ import annotations

import torch

from keeper_bench import families
from hf_growth import GrowthResult, warm_deviation

__all__ = ["GROWTHS", "PAIRS", "grow", "growable", "growth_deviation"]

_COMMON = {"dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16}
_RESNET = {"family": "resnet", **_COMMON, "widths": [8, 16], "blocks": [1, 1], "kernel": 3}
_VGG = {"family": "vgg", **_COMMON, "widths": [8, 16], "depths": [1, 2], "kernel": 3}
_MOBILE = {"family": "mobilenetv2", **_COMMON, "stem_width": 8, "widths": [8, 16], "blocks": [1, 1],
           "expansion": 4, "kernel": 3, "head_width": 32}
_TRANSFORMER = {"family": "transformer", **_COMMON, "d_model": 16, "heads": 2, "ffn": 32, "layers": 2, "patch": 4}
_MLP = {"family": "mlp", **_COMMON, "widths": [32, 16]}

#: family -> [(growth, parent spec, child spec)]
PAIRS: dict[str, list[tuple[str, dict, dict]]] = {
    "resnet": [("widths x2", _RESNET, {**_RESNET, "widths": [16, 32]}),
               ("widths x1.5", _RESNET, {**_RESNET, "widths": [12, 24]}),
               ("depth", _RESNET, {**_RESNET, "blocks": [2, 1]})],
    "vgg": [("widths x1.5", _VGG, {**_VGG, "widths": [12, 24]}),
            ("depth", _VGG, {**_VGG, "depths": [2, 2]}),
            ("widths x2, one more conv per stage", {**_VGG, "depths": [1, 1]},
             {**_VGG, "widths": [16, 32], "depths": [2, 2]}),
            ("widths x2, one more conv per stage, kernel 5", {**_VGG, "depths": [1, 1]},
             {**_VGG, "widths": [16, 32], "depths": [2, 2], "kernel": 5})],
    "mobilenetv2": [("widths x1.5", _MOBILE, {**_MOBILE, "stem_width": 12, "widths": [12, 24], "head_width": 48}),
                    ("expansion 4 -> 6, widths x1.5", _MOBILE,
                     {**_MOBILE, "expansion": 6, "stem_width": 12, "widths": [12, 24], "head_width": 48}),
                    ("widths x2", _MOBILE, {**_MOBILE, "stem_width": 16, "widths": [16, 32], "head_width": 64})],
    "transformer": [("d_model x2, heads 2 -> 4", _TRANSFORMER, {**_TRANSFORMER, "d_model": 32, "heads": 4,
                                                                 "ffn": 64}),
                    ("d_model x1.5, heads 2 -> 3", _TRANSFORMER, {**_TRANSFORMER, "d_model": 24, "heads": 3,
                                                                   "ffn": 48}),
                    ("ffn x1.5", _TRANSFORMER, {**_TRANSFORMER, "ffn": 48}),
                    ("post-LN d_model x1.5", {**_TRANSFORMER, "pre_ln": False},
                     {**_TRANSFORMER, "pre_ln": False, "d_model": 24, "heads": 3, "ffn": 48}),
                    ("depth", _TRANSFORMER, {**_TRANSFORMER, "layers": 3})],
    "mlp": [("widths x1.5", _MLP, {**_MLP, "widths": [48, 24]}),
            ("depth", _MLP, {**_MLP, "widths": [32, 32, 16]}),
            ("depth, LayerNorm", {**_MLP, "norm": "layernorm"}, {**_MLP, "norm": "layernorm", "widths": [32, 32, 16]}),
            ("widths x1.5, LayerNorm", {**_MLP, "norm": "layernorm"}, {**_MLP, "norm": "layernorm",
                                                                       "widths": [48, 24]}),
            ("widths x1.5, BatchNorm", {**_MLP, "norm": "batchnorm"}, {**_MLP, "norm": "batchnorm",
                                                                       "widths": [48, 24]})],
}


#: growth operators by letter, combined in any order: ``w`` doubles every width (a transformer's d_model, heads
#: and ffn), ``d`` adds one layer per stage (a block per ResNet / MobileNetV2 stage, a conv per VGG stage, one
#: encoder layer, a copy of each MLP hidden layer), ``k`` grows every kernel by 2 (depthwise ones in MobileNetV2)
GROWTHS = {"w": "widths x2", "d": "one more layer per stage", "k": "kernels + 2"}


def growable(spec: dict, ops: str) -> tuple[dict, str]:
    """(the spec nearest ``spec`` that the growth ``ops`` keeps exactly by construction, ``ops`` without the
    letters its family has no use for): a kernel of at most 5 to grow, and for ``d`` a pre-LN transformer (a new
    post-LN layer renormalises the stream) and an MLP without LayerNorm (a new Linear-LayerNorm renormalises its
    input); ``k`` is dropped for the families without kernels."""
    s, family = dict(spec), spec["family"]
    if family in ("mlp", "transformer"):
        ops = ops.replace("k", "")
    if "k" in ops:
        s["kernel"] = min(s["kernel"], 5)
    if "d" in ops and family == "transformer":
        s["pre_ln"] = True
    if "d" in ops and family == "mlp" and s.get("norm") == "layernorm":
        s["norm"] = "none"
    return families._validate(s), ops


def grow(spec: dict, ops: str) -> dict:
    """``spec`` grown by each operator of ``ops`` (letters of :data:`GROWTHS`), as a validated spec.

    Example:
        >>> grow(families.default_spec("vgg"), "wd")["depths"]
        [2, 3, 3]
    """
    s, family = dict(spec), spec["family"]
    for op in ops:
        if op == "w" and family == "transformer":
            s.update(d_model=2 * s["d_model"], heads=2 * s["heads"], ffn=2 * s["ffn"])
        elif op == "w":
            s["widths"] = [2 * w for w in s["widths"]]
            if family == "mobilenetv2":
                s.update(stem_width=2 * s["stem_width"], head_width=2 * s["head_width"])
        elif op == "d" and family == "transformer":
            s["layers"] += 1
        elif op == "d" and family == "mlp":
            s["widths"] = [w for w in s["widths"] for _ in (0, 1)]
        elif op == "d":
            key = "depths" if family == "vgg" else "blocks"
            s[key] = [n + 1 for n in s[key]]
        elif op == "k" and "kernel" in s:
            s["kernel"] += 2
        elif op not in GROWTHS:
            raise ValueError(f"growth {op!r}: expected letters of {sorted(GROWTHS)}")
    return families._validate(s)


def growth_deviation(parent: dict, child: dict, *, dynamo: bool, seed: int = 0) -> GrowthResult:
    """Warm the ``child`` spec's model from a trained-like ``parent`` spec's one and measure (see
    :func:`hf_growth.warm_deviation`)."""
    torch.manual_seed(seed)
    p = families.build(parent).eval()
    torch.manual_seed(seed + 1)
    c = families.build(child).eval()
    return warm_deviation(p, c, (families.example_input(parent, 4),), dynamo=dynamo, seed=seed)
