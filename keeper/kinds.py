"""Layer kinds and the one table of what each kind means to matching and the transforms.

:class:`Kind` names every node kind a :class:`~keeper.graph.LayerGraph` records; its integer values are stored in
graphs (``kind`` and ``layer_kind`` arrays, int8) and must never change. :data:`TRAITS` gives every kind one
:class:`Traits` record: whether it carries weights, how its weight's axes read (input axis, kernel axes), how it
shares channels, whether matching keeps it to one resolution level, how it starts as an identity or as zero, and
whether it merges branches. Extraction, matching and the transforms read these records instead of keeping their
own tuples of kinds, so adding a weighted op is one entry here plus one op rule in :mod:`keeper.graph.rules`.

Invariant: every ``Kind`` member has exactly one ``TRAITS`` entry (checked when this module is imported);
:func:`traits` raises :class:`~keeper.errors.KeeperError` naming the kind when a code has none.

Kind lives here, not in :mod:`keeper.graph`, because a kind and its traits are one concept and because the graph
package reads the traits (channel groups): defining both in one dependency-free module keeps the import order
``kinds -> graph -> matching -> transforms`` free of cycles. ``keeper.graph`` re-exports ``Kind``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from keeper.errors import KeeperError

__all__ = ["Kind", "Identity", "Merge", "Traits", "TRAITS", "traits", "kinds_where", "kind_mask"]


class Kind(enum.IntEnum):
    """Node kinds, as stored in LayerGraph arrays (int8). Values are persisted: never renumber, only append.

    Whether a kind carries parameters is :attr:`Traits.weighted`, not its value (a new weighted kind takes the
    next free value like any other).
    """

    CONV = 1          # Conv, groups == 1 or grouped (not depthwise)
    DWCONV = 2        # depthwise Conv: groups == input channels, one filter (or a multiple) per channel
    CONVT = 3         # ConvTranspose
    LINEAR = 4        # Gemm / MatMul with a weight
    BATCHNORM = 5
    LAYERNORM = 6
    EMBEDDING = 7     # Gather from a weight matrix
    PARAM = 8         # a learned tensor added or multiplied elementwise (positional embedding, layer scale)
    # 9 is no kind (it used to mark the end of the weighted kinds); a new kind takes the next value after OTHER
    ADD = 10
    MUL = 11
    CONCAT = 12
    SPLIT = 13
    POOL = 14
    ACTIVATION = 15
    MATMUL = 16       # activation x activation (attention)
    SOFTMAX = 17
    RESHAPE = 18
    TRANSPOSE = 19
    REDUCE = 20
    OTHER = 21
    RECTIFIER = 22    # ReLU: an activation that leaves its own outputs as they are

    @property
    def label(self) -> str:
        """The kind's name in summaries and logs ("conv", "convT", ...)."""
        return TRAITS[self].name


class Identity(enum.Enum):
    """How a new layer of a kind starts as the identity on its channels (see :mod:`keeper.transforms.depth`)."""

    EYE = "eye"            # linear: identity matrix; needs as many outputs as inputs
    DIRAC = "dirac"        # conv: one at the kernel centre of (unit, same unit); square, odd kernel, stride 1
    DIRAC_DEPTHWISE = "dirac-depthwise"  # depthwise conv: one at each filter's centre; odd kernel, stride 1
    UNIT_NORM = "unit-norm"  # BatchNorm: zero mean, unit variance, scale sqrt(1 + eps), zero shift (eval mode)

    @property
    def needs_square(self) -> bool:
        """The identity exists only when the layer has as many output as input units."""
        return self in (Identity.EYE, Identity.DIRAC)


class Merge(enum.Enum):
    """How a weightless node joins branches."""

    SUM = "sum"        # a residual add: the branch that is zero leaves the skip input
    CONCAT = "concat"  # a concatenation of the branches' channels


@dataclass(frozen=True)
class Traits:
    """What one kind means to extraction, matching and the transforms.

    Weight axes are canonical (axis 0 = output units, see :mod:`keeper.graph`).

    Attributes:
        name: label in summaries.
        weighted: the node carries trainable parameters (it is a layer).
        in_axis: weight axis indexing input channels, which get their own channel group (conv, linear); None when
            the layer has none (embedding) or acts per channel.
        per_channel: the layer maps each channel to itself: its input and output share one channel group.
        kernel_axes: weight axes from 2 on are spatial kernel axes (padded or cropped when kernels differ).
        levelled: matched only at equal resolution levels (a stage-1 conv never takes a stage-2 conv's weights).
        identity: how a new layer of this kind starts as the identity (None: it cannot).
        zero_ones: roles that stay one when the layer is zeroed (a zeroed BatchNorm keeps unit variance).
        merge: how the node joins branches (None: it does not).
        nonlinear: a weightless nonlinearity or pool (a block boundary for runs of new layers).
        affine: a per-channel layer whose output, for fixed statistics, is proportional to its tensors (norms'
            scale and shift; a PARAM only when its ``attrs["scales"]``: a product, not a sum).
        proportional: a weightless node that may stand between such a layer and the layer it feeds while keeping
            the output proportional (shape ops; identities, which exporters write as Identity, Cast or Dropout and
            keeper records as activations).
        normalizes: the layer divides its input by the input's own statistics, so an input scaled by s reads the
            same (LayerNorm; a BatchNorm in eval mode uses fixed statistics and does not).
        rectifies: a weightless nonlinearity whose outputs are >= 0 and which leaves inputs >= 0 as they are
            (ReLU): a second one on its output, with only sign-keeping nodes between, changes nothing.
        keeps_sign: a weightless node whose output is >= 0 wherever its inputs are (pools, shape ops, ReLU).
    """

    name: str
    weighted: bool = False
    in_axis: int | None = None
    per_channel: bool = False
    kernel_axes: bool = False
    levelled: bool = False
    identity: Identity | None = None
    zero_ones: tuple[str, ...] = ()
    merge: Merge | None = None
    nonlinear: bool = False
    affine: bool = False
    proportional: bool = False
    normalizes: bool = False
    rectifies: bool = False
    keeps_sign: bool = False


TRAITS: Mapping[Kind, Traits] = MappingProxyType({
    Kind.CONV: Traits("conv", weighted=True, in_axis=1, kernel_axes=True, levelled=True, identity=Identity.DIRAC),
    Kind.DWCONV: Traits("dwconv", weighted=True, per_channel=True, kernel_axes=True, levelled=True,
                        identity=Identity.DIRAC_DEPTHWISE),
    Kind.CONVT: Traits("convT", weighted=True, in_axis=1, kernel_axes=True, levelled=True),
    Kind.LINEAR: Traits("linear", weighted=True, in_axis=1, identity=Identity.EYE),
    Kind.BATCHNORM: Traits("batchnorm", weighted=True, per_channel=True, levelled=True,
                           identity=Identity.UNIT_NORM, zero_ones=("var",), affine=True),
    Kind.LAYERNORM: Traits("layernorm", weighted=True, per_channel=True, affine=True, normalizes=True),
    Kind.EMBEDDING: Traits("embedding", weighted=True),
    Kind.PARAM: Traits("param", weighted=True, per_channel=True, affine=True),
    Kind.ADD: Traits("add", merge=Merge.SUM),
    Kind.MUL: Traits("mul"),
    Kind.CONCAT: Traits("concat", merge=Merge.CONCAT),
    Kind.SPLIT: Traits("split"),
    Kind.POOL: Traits("pool", nonlinear=True, keeps_sign=True),
    Kind.ACTIVATION: Traits("activation", nonlinear=True, proportional=True),
    Kind.MATMUL: Traits("matmul"),
    Kind.SOFTMAX: Traits("softmax"),
    Kind.RESHAPE: Traits("reshape", proportional=True, keeps_sign=True),
    Kind.TRANSPOSE: Traits("transpose", proportional=True, keeps_sign=True),
    Kind.REDUCE: Traits("reduce"),
    Kind.OTHER: Traits("other"),
    # an activation like any other to matching, channel groups and the transforms; preservation tells it apart
    Kind.RECTIFIER: Traits("rectifier", nonlinear=True, proportional=True, rectifies=True, keeps_sign=True),
})


def traits(kind: int) -> Traits:
    """The traits of ``kind`` (a Kind or its stored integer code).

    Raises:
        KeeperError: the code is no Kind, or the Kind has no TRAITS entry.
    """
    try:
        k = Kind(int(kind))
    except ValueError:
        raise KeeperError(f"layer kind {kind!r}: not a keeper.kinds.Kind code; a graph extracted by another "
                          "keeper version needs re-extracting (re-register the model)") from None
    t = TRAITS.get(k)
    if t is None:
        raise KeeperError(f"layer kind {k.name}: no entry in keeper.kinds.TRAITS; every Kind needs one "
                          "(add a Traits record for it next to the others)")
    return t


def kinds_where(predicate: Callable[[Traits], bool]) -> frozenset[int]:
    """Integer codes of the kinds whose traits satisfy ``predicate`` (plain ints: cheap to test numpy codes in)."""
    return frozenset(int(k) for k, t in TRAITS.items() if predicate(t))


def kind_mask(predicate: Callable[[Traits], bool]) -> np.ndarray:
    """A bool array indexed by kind code (0..255): True for the kinds whose traits satisfy ``predicate``."""
    mask = np.zeros(256, dtype=bool)
    mask[sorted(kinds_where(predicate))] = True
    return mask


def _check_table() -> None:
    missing = [k.name for k in Kind if k not in TRAITS]
    if missing:
        raise KeeperError(f"keeper.kinds.TRAITS has no entry for {', '.join(missing)}; every Kind needs one "
                          "(add a Traits record for each)")
    for k, t in TRAITS.items():
        if t.weighted and (t.merge is not None or t.nonlinear):
            raise KeeperError(f"keeper.kinds.TRAITS[{k.name}]: a weighted kind cannot merge or be a weightless "
                              "nonlinearity; fix its entry")
        if t.in_axis is not None and t.per_channel:
            raise KeeperError(f"keeper.kinds.TRAITS[{k.name}]: a layer with an input axis is not per-channel; "
                              "set one of in_axis / per_channel")


_check_table()

# Codes by name, for callers that index names by a stored code (``Kind.NAMES[int(code)]``). Set after the class:
# an IntEnum body would turn the dict into a member.
Kind.NAMES = MappingProxyType({int(k): t.name for k, t in TRAITS.items()})  # type: ignore[attr-defined]
