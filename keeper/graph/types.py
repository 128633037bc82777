"""The LayerGraph data types and their persistence: :class:`TensorRef` and :class:`LayerGraph`.

Invariant: ``LayerGraph.from_arrays(g.to_arrays())`` gives back ``g`` exactly (the arrays, names, tensor refs
and attrs); the stored form is plain numpy arrays plus one JSON blob, read back with ``allow_pickle=False``.
Kind codes are stored as int8 in ``kind`` and ``layer_kind`` (see :mod:`keeper.kinds`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from keeper.errors import InvalidModelError
from keeper.kinds import traits

__all__ = ["TensorRef", "LayerGraph", "MAX_RANK", "INPUT_ROLE"]

# Canonical parameter shapes are stored padded to this rank (``LayerGraph.shape`` is ``num_layers x MAX_RANK``);
# a learned tensor of higher rank is no layer.
MAX_RANK = 5


# The role of a constant table a layer reads as its input (the coordinates a position-bias MLP runs on; see
# keeper.graph.rules.input_tables): after the layer's trainable roles, never counted as learned; a warm gives the
# child the parent's table when both have the same shape, else keeps the child's own.
INPUT_ROLE = "input"


@dataclass(frozen=True)
class TensorRef:
    """One parameter tensor a layer reads.

    ``key`` names it in a WarmResult's ``weights`` (the name the op sees when only Identity nodes stand between
    it and the initializer, so deduplicated initializers are untied; the initializer's name otherwise).
    ``source`` is the initializer holding the data; ``chain`` turns the source array into the op's input
    (("T", perm) / ("R", shape) steps); ``canon`` is the extra transpose from the op's input to keeper's
    canonical orientation (empty when none).

    ``span`` = (start, stop, whole) marks one piece of a role assembled from several tensors (a bias built as
    concat(q_bias, zeros, v_bias)): the piece's canonical array is rows ``start:stop`` of the role's array of
    ``whole`` rows. A layer then has one ref per learned piece under the same role; rows no piece covers are
    constant zeros of the architecture, not learned (:attr:`LayerGraph.fixed_params`). Empty: the whole role.

    ``zeroed`` = (start, stop, start, stop, ...) marks rows of a vector (a 1-D canonical array) the op sees as
    zeros whatever the tensor holds there (a bias whose key rows are zeroed in the forward pass: ``b =
    bias.clone(); b[k:2k].zero_()``): constant zeros of the architecture as well, read and written as zeros. They
    still count as learned elements: they are the parameter's, which the module stores and trains (unlike the
    zeros between pieces, a buffer or a constant). Empty: none.
    """

    role: str
    key: str
    source: str
    source_shape: tuple[int, ...]
    chain: tuple[tuple[str, tuple[int, ...]], ...] = ()
    canon: tuple[int, ...] = ()
    span: tuple[int, ...] = ()
    zeroed: tuple[int, ...] = ()

    def to_json(self) -> list:
        out = [self.role, self.key, self.source, list(self.source_shape),
               [[op, list(arg)] for op, arg in self.chain], list(self.canon)]
        if self.zeroed:
            return out + [list(self.span), list(self.zeroed)]
        return out + [list(self.span)] if self.span else out

    @classmethod
    def from_json(cls, v: list) -> "TensorRef":
        return cls(v[0], v[1], v[2], tuple(v[3]), tuple((op, tuple(arg)) for op, arg in v[4]), tuple(v[5]),
                   tuple(v[6]) if len(v) > 6 else (), tuple(v[7]) if len(v) > 7 else ())



@dataclass
class LayerGraph:
    """A model as flat arrays. See the module docstring for the meaning of each part.

    Node arrays (length ``num_nodes``, canonical order): ``kind``, ``pred_indptr``/``pred_indices``.
    Layer arrays (length ``num_layers``, layers in canonical order): ``layer_node`` (node index),
    ``layer_kind``, ``shape`` (``num_layers x 5`` canonical parameter shape, padded with 1), ``rank``,
    ``vectors`` (trainable per-output-unit vectors besides the main tensor, e.g. 1 for a bias),
    ``params`` (trainable elements), ``conv_groups``, ``in_group``/``out_group`` (channel group or -1),
    ``in_level``/``out_level`` (resolution level of the layer's input and output; they differ only across a
    strided layer).
    Group arrays: ``group_size`` (units, or -1 when unknown/inconsistent), ``group_parts_indptr`` /
    ``group_parts`` (the parts of a concatenation group, in order; empty for plain groups).
    ``unread``: learned tensors the model reads that no layer holds (initializer name -> elements): an op keeper
    has no rule for. They are no layer, so a warm cannot transfer them; they count in :attr:`total_params` and in
    the score's denominator (:attr:`score_total`), so a child holding them never scores 1.0.
    """

    kind: np.ndarray
    pred_indptr: np.ndarray
    pred_indices: np.ndarray
    layer_node: np.ndarray
    layer_kind: np.ndarray
    shape: np.ndarray
    rank: np.ndarray
    vectors: np.ndarray
    params: np.ndarray
    conv_groups: np.ndarray
    in_group: np.ndarray
    out_group: np.ndarray
    in_level: np.ndarray
    out_level: np.ndarray
    group_size: np.ndarray
    group_parts_indptr: np.ndarray
    group_parts: np.ndarray
    layer_names: list[str] = field(default_factory=list)
    tensors: list[tuple[TensorRef, ...]] = field(default_factory=list)
    attrs: list[dict[str, Any]] = field(default_factory=list)
    unread: dict[str, int] = field(default_factory=dict)

    # Version of what extraction records; 2 added packed projections (attrs["packed"]), 3 resolution levels, 4
    # learned tables read by lookups (positions, relative-position biases, class tokens) and ``unread``, 5 channel
    # groups kept through slices and concatenations along positions (a roll, patch merging) and attrs["scales"] of
    # a PARAM Mul, 6 the canonical order's last tie-break comparing numbers in names as numbers, 7 ReLU as its own
    # kind (RECTIFIER; the canonical order still reads it as an activation), 8 attrs["heads"] of a projection whose
    # output is reshaped into heads (q, k, v computed apart), 9 roles assembled from pieces (TensorRef.span) and
    # tensors an exporter marks as constants (a buffer outside the state_dict) no longer learned, 10 rows of a bias
    # zeroed in the forward pass (TensorRef.zeroed), a per-channel Mul by a function of a learned tensor
    # (attrs["through"]), linear layers run on a constant table (the table an INPUT_ROLE ref, what they compute
    # data), 11 packed q/k/v projections whose output is reshaped to (..., 3, heads, head size) and taken apart along
    # the 3 (timm's and torchvision's Swin attention: parts, groups and their numbering, attrs["packed"] with heads)
    # and attrs["unit_axes"] of a projection whose units a reshape spreads over 3+ axes in a layout not found packed
    # (no growth claimed exact across it). A stored graph of an older version is re-extracted from its model (see
    # keeper.store.stored.graph_from_blob). Bump it with any change to what extraction records (kinds, shapes, groups
    # and their numbering, order, refs, attrs), so that stored graphs are re-extracted; docs/architecture.md
    # ("Foundation") says when.
    FORMAT = 11

    _ARRAYS = ("kind", "pred_indptr", "pred_indices", "layer_node", "layer_kind", "shape", "rank", "vectors",
               "params", "conv_groups", "in_group", "out_group", "in_level", "out_level", "group_size",
               "group_parts_indptr", "group_parts")

    @property
    def num_nodes(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.layer_kind.shape[0])

    @property
    def total_params(self) -> int:
        """Trainable parameter elements of the model: every layer's, a tensor several layers read (tied
        embeddings, a bias table shared by all blocks) once, the constant rows of a role built from pieces not at
        all, plus the :attr:`unread` ones."""
        return int(self.params.sum()) - self.shared_params - self.fixed_params + sum(self.unread.values())

    def trainable_refs(self, layer: int) -> tuple[TensorRef, ...]:
        """The refs of ``layer``'s trainable roles: its main tensor and its ``vectors`` (every piece of each)."""
        refs = self.tensors[layer]
        roles = list(dict.fromkeys(r.role for r in refs))[:1 + int(self.vectors[layer])]
        return tuple(r for r in refs if r.role in roles)

    @property
    def shared_params(self) -> int:
        """Elements that layers read again after an earlier layer (canonical order) read the same tensor."""
        seen: set[str] = set()
        again = 0
        for li in range(len(self.tensors)):
            for r in self.trainable_refs(li):
                if r.source in seen:
                    again += int(np.prod(r.source_shape))
                seen.add(r.source)
        return again

    @property
    def fixed_params(self) -> int:
        """Elements of trainable roles built from pieces that no piece covers: constant zeros of the architecture
        (the key bias of concat(q_bias, zeros, v_bias)); a ref's ``zeroed`` rows are not among them (see
        :class:`TensorRef`). :attr:`params` and the alignment count the role whole, as
        its shape says; :attr:`total_params` leaves them out."""
        fixed = 0
        for li in range(len(self.tensors)):
            left: dict[str, int] = {}  # role -> elements no piece covers
            for r in self.trainable_refs(li):
                if r.span:
                    per_row = int(np.prod(r.source_shape)) // max(r.span[1] - r.span[0], 1)
                    left[r.role] = left.get(r.role, r.span[2] * per_row) - int(np.prod(r.source_shape))
            fixed += sum(left.values())
        return fixed

    @property
    def score_total(self) -> int:
        """The similarity's denominator: every layer's elements as the alignment counts them (a shared tensor
        once per layer reading it, as each such layer inherits it again) plus the unread ones."""
        return int(self.params.sum()) + sum(self.unread.values())

    def predecessors(self, node: int) -> np.ndarray:
        return self.pred_indices[self.pred_indptr[node]:self.pred_indptr[node + 1]]

    def predecessor_lists(self) -> list[list[int]]:
        """Per node, :meth:`predecessors` as a list of ints (built anew on each call, so a caller walking backward
        builds them once)."""
        indptr, indices = self.pred_indptr, self.pred_indices
        return [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(self.num_nodes)]

    def successors(self) -> list[list[int]]:
        """Per node, the nodes it feeds in ascending order (the predecessor lists turned around; built anew on
        each call, so a caller walking forward builds them once)."""
        succs: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node in range(self.num_nodes):
            for p in self.predecessors(node).tolist():
                succs[int(p)].append(node)
        return succs

    def group_of_parts(self, group: int) -> np.ndarray:
        return self.group_parts[self.group_parts_indptr[group]:self.group_parts_indptr[group + 1]]

    def summary(self) -> dict[str, Any]:
        """A small JSON-able description for catalogs and logs."""
        kinds: dict[str, int] = {}
        for k in self.layer_kind.tolist():
            name = traits(k).name
            kinds[name] = kinds.get(name, 0) + 1
        return {"nodes": self.num_nodes, "layers": self.num_layers, "params": self.total_params,
                "layer_kinds": kinds}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays (for ``np.savez``; reload with ``allow_pickle=False``)."""
        out = {name: getattr(self, name) for name in self._ARRAYS}
        meta = {"layer_names": self.layer_names, "tensors": [[t.to_json() for t in ts] for ts in self.tensors],
                "attrs": self.attrs, "unread": self.unread}
        out["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        out["format"] = np.array(self.FORMAT, dtype=np.int64)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "LayerGraph":
        try:
            meta = json.loads(bytes(np.asarray(arrays["meta"], dtype=np.uint8)).decode())
            kw = {name: np.asarray(arrays[name]) for name in cls._ARRAYS}
            return cls(**kw, layer_names=list(meta["layer_names"]),
                       tensors=[tuple(TensorRef.from_json(t) for t in ts) for ts in meta["tensors"]],
                       attrs=list(meta["attrs"]), unread={str(k): int(v) for k, v in meta.get("unread", {}).items()})
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise InvalidModelError(f"stored graph arrays are incomplete or corrupt ({exc}); "
                                    "re-register the model to rebuild them") from None
