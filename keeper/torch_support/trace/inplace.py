"""In-place writes through a slice, written as the exporter's functionalization writes them.

``b = bias.clone(); b[k:2 * k].zero_()`` (torchvision's Swin V2 qkv bias) changes ``b`` through a view. torch.export
functionalizes it: the view's new value is the functional op's result (``zeros_like``), and the base's new value is
``slice_scatter(base, new view, dim, start, end, step)``, which torchlib writes as a ``ScatterND`` of the view's rows
(rows computed as ``Slice(Range(0, Shape(base)[dim], 1))``, the scattered axis moved to the front and back with a
``Transpose`` when it is not the first). The recorder (:mod:`~keeper.torch_support.trace.recorder`) calls
:func:`write_back` after every in-place rule; the slices a write can go back through are those
:func:`remember_slice` was told of (one ``Slice`` on one axis of a tensor, from ``__getitem__``).

Invariant: the base's value afterwards is what eager torch holds in it. The view itself is left stale (a later
read raises): the exporter would read it again as a slice of the scattered base, which is not written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from keeper.torch_support.trace.recorder import Recorder

__all__ = ["remember_slice", "write_back"]


def remember_slice(rec: "Recorder", view: torch.Tensor, base: torch.Tensor, dim: int, start: int, end: int,
                   step: int) -> None:
    """``view`` is ``base[start:end:step]`` along ``dim`` (the arguments of the ``Slice`` node written for it)."""
    rec.slices[id(view)] = (base, dim, start, end, step)


def write_back(rec: "Recorder", view: torch.Tensor) -> None:
    """After an in-place rule wrote ``view``'s new value: when ``view`` is a remembered slice, its base takes the
    scattered value (and is no longer stale); the view goes stale. Otherwise nothing: the base, if any, stays
    stale and a read of it raises."""
    spec = rec.slices.pop(id(view), None)
    if spec is None:
        return
    base, dim, start, end, step = spec
    old_kind = rec.kind_of_unchecked(base)
    rec.stale.discard(id(base))  # its value before the write is what the scatter starts from
    b = rec.b
    old = rec.name_of(base)
    new = rec.name_of(view)
    zero = b.constant([0])
    size = b.node("Gather", [b.node("Shape", [old], start=0), b.constant(dim)], axis=0)
    rows = b.node("Range", [b.constant(0), size, b.constant(1)])
    rows = b.node("Slice", [rows, b.constant([start]), b.constant([end]), zero, b.constant([step])])
    rows = b.node("Unsqueeze", [rows, b.constant([-1])])
    if dim == 0:
        out = b.node("ScatterND", [old, rows, new], "slice_scatter", reduction="none")
    else:
        perm = list(range(base.dim()))
        perm[0], perm[dim] = perm[dim], perm[0]
        moved = [b.node("Transpose", [x], perm=perm) for x in (new, old)]
        scattered = b.node("ScatterND", [moved[1], rows, moved[0]], reduction="none")
        out = b.node("Transpose", [scattered], "slice_scatter", perm=perm)
    rec.bind(base, out, rec.joined((old_kind, rec.kind)))
    rec.stale.add(id(view))
