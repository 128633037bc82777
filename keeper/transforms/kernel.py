"""Kernel operators: centred zero padding to grow, centre crop to shrink.

Invariant: with odd kernel sizes and "same" padding on both convolutions, a kernel grown by :func:`fit_kernel`
computes exactly the parent's function (the new taps are zero and the old ones keep their offsets from the
centre). The published system pads at the corner, which shifts every output.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fit_kernel"]


def fit_kernel(tensor: np.ndarray, kernel: tuple[int, ...]) -> np.ndarray:
    """``tensor`` (units, inputs, *spatial) with its spatial axes padded or cropped to ``kernel``, centred.

    Returns a new array; the input is not changed.
    """
    spatial = tensor.shape[2:]
    if len(spatial) != len(kernel):
        raise ValueError(f"fit_kernel: tensor has {len(spatial)} spatial axes, target kernel {kernel}")
    out = tensor
    for ax, (have, want) in enumerate(zip(spatial, kernel), start=2):
        if want > have:
            before = (want - have) // 2
            pad = [(0, 0)] * out.ndim
            pad[ax] = (before, want - have - before)
            out = np.pad(out, pad)
        elif want < have:
            start = (have - want) // 2
            out = np.take(out, np.arange(start, start + want), axis=ax)
    return out if out is not tensor else tensor.copy()
