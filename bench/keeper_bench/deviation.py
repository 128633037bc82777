"""How far a warmed child strays from its parent's function where keeper does not promise to preserve it, beside
the cases where it does (the reference: at most :data:`PRESERVED_MAX`).

Small models of the model families, the parent made trained-like (:func:`trained_like`), exported with keeper's
``torch_support.export`` through either exporter, warmed with ``keeper.warm.inherit(noise=0.0, seed=seed)`` and
loaded into the child; in eval mode, on a batch of 16 random inputs, deviation = max |parent(x) - child(x)| /
max |parent(x)|, beside the same for the child's own initial weights (the scale of "no inheritance").
:func:`deviation_rows` writes the deviation table of ``reports/bench_warm.md``.

Example:
    >>> warmed, own, score = deviation(PRE_LN, {**PRE_LN, "layers": 4}, dynamo=True, seed=0)  # doctest: +SKIP
    >>> warmed <= PRESERVED_MAX                                                                # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

__all__ = ["PRESERVED_MAX", "TRANSFORMER", "PRE_LN", "POST_LN", "RESNET", "CASES", "trained_like", "deviation",
           "deviation_rows"]

PRESERVED_MAX = 1e-4

TRANSFORMER = dict(family="transformer", dim=1, in_channels=1, num_classes=10, input_length=32, d_model=64, heads=4,
                   ffn=128, layers=2, patch=4)
PRE_LN = {**TRANSFORMER, "pre_ln": True}
POST_LN = {**TRANSFORMER, "pre_ln": False}
RESNET = dict(family="resnet", dim=2, in_channels=3, num_classes=10, input_length=16, widths=[16, 32],
              blocks=[1, 1], kernel=3)

#: (case, change, parent, child, function preserved by keeper's operators)
CASES = [
    ("post-LN transformer deepen", "layers 2 -> 4", POST_LN, {**POST_LN, "layers": 4}, False),
    ("pre-LN transformer widen", "d_model 64 -> 96, ffn 128 -> 192", PRE_LN,
     {**PRE_LN, "d_model": 96, "ffn": 192}, False),
    ("post-LN transformer widen", "d_model 64 -> 96, ffn 128 -> 192", POST_LN,
     {**POST_LN, "d_model": 96, "ffn": 192}, False),
    ("pre-LN transformer shrink", "d_model 64 -> 48, ffn 128 -> 96", PRE_LN,
     {**PRE_LN, "d_model": 48, "ffn": 96}, False),
    ("ResNet shrink", "widths [16, 32] -> [12, 24]", RESNET, {**RESNET, "widths": [12, 24]}, False),
    ("ResNet kernel shrink", "kernel 5 -> 3", {**RESNET, "kernel": 5}, RESNET, False),
    ("ResNet widen (reference)", "widths [16, 32] -> [24, 48]", RESNET, {**RESNET, "widths": [24, 48]}, True),
    ("pre-LN transformer deepen (reference)", "layers 2 -> 4", PRE_LN, {**PRE_LN, "layers": 4}, True),
    ("pre-LN transformer d_model x2 (reference)", "d_model 64 -> 128, heads 4 -> 8, ffn 128 -> 256", PRE_LN,
     {**PRE_LN, "d_model": 128, "heads": 8, "ffn": 256}, True),
]


def trained_like(model, x, seed: int):
    """Norm statistics and affine parameters away from their initial values, as after training."""
    import torch

    torch.manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(x + 0.3 * torch.randn_like(x))
        for mod in model.modules():
            if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    return model.eval()


def deviation(parent_spec: dict, child_spec: dict, dynamo: bool, seed: int) -> tuple[float, float, float]:
    """(max relative deviation of the warmed child from the parent, the same for the child's own initial
    weights, similarity score)."""
    import torch

    from keeper_bench import families
    from keeper.torch_support import export
    from keeper.torch_support.load import load_result
    from keeper.warm import inherit

    torch.manual_seed(seed)
    parent = families.build(parent_spec)
    x = families.example_input(parent_spec, batch=16)
    trained_like(parent, x, seed)
    child = families.build(child_spec).eval()
    with contextlib.redirect_stderr(io.StringIO()):
        pe, ce = export(parent, x, dynamo=dynamo), export(child, x, dynamo=dynamo)
    result = inherit(pe.onnx, ce.onnx, parent_name="parent", noise=0.0, seed=seed)
    with torch.no_grad():
        a, cold = parent(x), child(x)
        loaded = load_result(child, result, ce.keys)
        if loaded.load.missing:
            raise RuntimeError(f"child tensors not warmed: {loaded.load.missing}")
        child.eval()
        b = child(x)
    scale = a.abs().max()
    return float((a - b).abs().max() / scale), float((a - cold).abs().max() / scale), float(result.score)


def _spread(v: np.ndarray) -> str:
    """Median [min, max] of a few runs."""
    return f"{np.median(v):.2e} [{v.min():.2e}, {v.max():.2e}]" if len(v) > 1 else f"{v[0]:.2e}"


def deviation_rows(seeds: range) -> tuple[list[str], bool]:
    """The deviation table's rows, and whether every preserving reference met its bound."""
    dev_rows = []
    ok_ref = True
    for name, change, parent, child, preserved in CASES:
        for dynamo in (True, False):
            runs = [deviation(parent, child, dynamo, seed) for seed in seeds]
            dev, cold, scores = (np.array([r[i] for r in runs]) for i in range(3))
            note = ""
            if preserved:
                ok = bool(dev.max() <= PRESERVED_MAX)
                ok_ref &= ok
                note = f"preserving: max <= {PRESERVED_MAX:g} {'met' if ok else 'NOT MET'}"
            exporter = "dynamo" if dynamo else "TorchScript"
            score = f"{scores[0]:.3f}" if np.all(scores == scores[0]) else f"{scores.min():.3f}-{scores.max():.3f}"
            dev_rows.append(f"| {name} | {change} | {exporter} | {_spread(dev)} | {_spread(cold)} | {score} "
                            f"| {note} |")
            print(f"deviation {name} ({exporter}): {_spread(dev)}, score {score}", flush=True)
    return dev_rows, ok_ref
