"""Extraction: a checked ModelProto -> :class:`~keeper.graph.LayerGraph`, and the public entry points.

Steps: read the model (:mod:`~keeper.graph.reader`), keep the data nodes (those reading activations and producing
more than shape information), ask each its :class:`~keeper.graph.rules.NodeInfo` (:mod:`~keeper.graph.rules`),
put them in canonical order (:mod:`~keeper.graph.order`), build channel groups (:mod:`~keeper.graph.groups`) and
resolution levels, and lay everything out as flat arrays.

Invariant: the result depends on the model's graph, never on the order of nodes in its file; any change to what
it records must bump ``LayerGraph.FORMAT`` (stored graphs are then re-extracted).
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import onnx

from keeper.errors import InvalidModelError
from keeper.graph.groups import ChannelGroups, channel_groups
from keeper.graph.order import canonical_order
from keeper.graph.reader import ModelReader, value_inputs
from keeper.graph.rules import NodeInfo, RuleContext, input_tables, node_info, resolution_step
from keeper.graph.types import MAX_RANK, LayerGraph
from keeper.kinds import Kind, traits
from keeper.onnx_safety import ModelInput, load_model

__all__ = ["load_graph", "as_graph", "graph_from_proto"]


def load_graph(model: ModelInput) -> LayerGraph:
    """Parse an untrusted model once and extract its LayerGraph.

    Args:
        model: ONNX bytes, a path to an .onnx file, or an ``onnx.ModelProto``.

    Raises:
        InvalidModelError: the input is not a safe, usable ONNX model.

    Example:
        >>> g = keeper.load_graph(onnx_bytes)  # doctest: +SKIP
        >>> g.num_layers, g.total_params        # doctest: +SKIP
    """
    return graph_from_proto(load_model(model))


def as_graph(model: Union[ModelInput, LayerGraph]) -> LayerGraph:
    """``model`` itself when it already is a LayerGraph, else :func:`load_graph` of it."""
    return model if isinstance(model, LayerGraph) else load_graph(model)


def graph_from_proto(proto: onnx.ModelProto) -> LayerGraph:
    """Extract the LayerGraph of a ModelProto already checked by :func:`keeper.onnx_safety.load_model`."""
    try:
        return _extract(proto)
    except InvalidModelError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise InvalidModelError(f"model: its graph could not be read ({type(exc).__name__}: {exc}); "
                                "check it with onnx.checker.check_model and re-export") from None


def _extract(proto: onnx.ModelProto) -> LayerGraph:
    reader = ModelReader(proto)
    const, meta = reader.classify()
    tables = input_tables(reader, const, meta)
    if tables:  # constant tables a linear layer reads are inputs: what is computed from them is data
        const, meta = reader.classify(tables)
    # nodes that read activations and produce more than shape information
    nodes = [n for n in reader.nodes if n.op_type != "Constant"
             and any(x not in const and x not in meta for x in value_inputs(n))
             and not all(o in meta for o in n.output if o)]
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for x in n.input:
            users.setdefault(x, []).append(n)
    ctx = RuleContext(reader, const, users, tables)
    info = [node_info(ctx, n) for n in nodes]
    # A MatMul's bias Add is absorbed: the Add is no node, and the layer answers for its output.
    absorbed = {id(d.bias_add): i for i, d in enumerate(info) if d.bias_add is not None}
    keep = [i for i, n in enumerate(nodes) if id(n) not in absorbed]
    preds = _predecessors(nodes, keep, absorbed)
    # a rectifier orders as any activation: telling ReLU apart must not reorder graphs (nor their alignments)
    order = canonical_order(keep, preds, [Kind.ACTIVATION if d.kind == Kind.RECTIFIER else d.kind for d in info],
                            nodes)
    groups = channel_groups(reader, nodes, order, info, const, meta)
    graph = _layout(nodes, info, order, preds, groups)
    graph.unread = _unread(ctx, meta, nodes, graph)
    return graph


def _unread(ctx: RuleContext, meta: set[str], nodes: Sequence[onnx.NodeProto], graph: LayerGraph) -> dict[str, int]:
    """Learned tensors the data nodes read (as weights, or through lookups, known or not) that no layer holds: an
    op with no rule, or a rule that declined. A tensor only computed into other constants with positions (RoPE's
    ``inv_freq`` into cos and sin) is not read as such and is no parameter."""
    held = {r.source for refs in graph.tensors for r in refs}
    out: dict[str, int] = {}
    for n in nodes:
        for x in n.input:
            if x in ctx.const:
                for src in ctx.reader.read_by(x, meta) - held:
                    out[src] = int(np.prod(ctx.reader.init_shapes[src]))
    return dict(sorted(out.items()))


def _predecessors(nodes: Sequence[onnx.NodeProto], keep: list[int], absorbed: dict[int, int]) -> dict[int, list[int]]:
    """Data node -> the data nodes producing its inputs, in input order, each once (absorbed bias Adds answer
    for their MatMul)."""
    out_of: dict[str, int] = {}
    for i, n in enumerate(nodes):
        owner = absorbed.get(id(n), i)
        for o in n.output:
            if o:
                out_of[o] = owner
    preds: dict[int, list[int]] = {i: [] for i in keep}
    for i in keep:
        for x in nodes[i].input:
            j = out_of.get(x)
            if j is not None and j != i and j not in preds[i]:
                preds[i].append(j)
    return preds


def _layout(nodes: Sequence[onnx.NodeProto], info: Sequence[NodeInfo], order: list[int],
            preds: dict[int, list[int]], groups: ChannelGroups) -> LayerGraph:
    """The flat arrays of the LayerGraph (see its docstring), nodes and layers in canonical order."""
    pos = {i: p for p, i in enumerate(order)}
    indptr = [0]
    indices: list[int] = []
    for i in order:
        indices.extend(sorted(pos[j] for j in preds[i]))
        indptr.append(len(indices))
    level_in: dict[int, int] = {}  # data node -> resolution level of its input, and of its output
    level: dict[int, int] = {}
    for i in order:
        level_in[i] = max((level[j] for j in preds[i]), default=0)
        level[i] = level_in[i] + resolution_step(nodes[i])
    layers = [i for i in order if traits(info[i].kind).weighted]
    nl = len(layers)
    shape = np.ones((nl, MAX_RANK), dtype=np.int64)
    rank = np.zeros(nl, dtype=np.int8)
    vectors = np.zeros(nl, dtype=np.int64)
    params = np.zeros(nl, dtype=np.int64)
    conv_groups = np.ones(nl, dtype=np.int64)
    in_group = np.full(nl, -1, dtype=np.int32)
    out_group = np.full(nl, -1, dtype=np.int32)
    in_level = np.zeros(nl, dtype=np.int16)
    out_level = np.zeros(nl, dtype=np.int16)
    names, tensors, attrs = [], [], []
    for li, i in enumerate(layers):
        d = info[i]
        s = d.shape
        shape[li, :len(s)] = s
        rank[li] = len(s)
        vectors[li] = d.vectors
        params[li] = int(np.prod(s)) + d.vectors * s[0]
        conv_groups[li] = d.groups
        in_group[li], out_group[li] = groups.layer_groups.get(i, (-1, -1))
        in_level[li], out_level[li] = level_in[i], level[i]
        names.append(nodes[i].name or nodes[i].output[0])
        tensors.append(tuple(d.refs))
        projection = traits(d.kind).in_axis is not None
        heads = groups.heads.get(int(out_group[li]), 0) if projection else 0
        axes = groups.unit_axes.get(int(out_group[li])) if projection else None
        attrs.append({**d.attrs, **({"packed": groups.packed[i]} if i in groups.packed else {}),
                      **({"heads": heads} if heads else {}), **({"unit_axes": list(axes)} if axes else {})})
    return LayerGraph(
        kind=np.array([info[i].kind for i in order], dtype=np.int8),
        pred_indptr=np.array(indptr, dtype=np.int64), pred_indices=np.array(indices, dtype=np.int32),
        layer_node=np.array([pos[i] for i in layers], dtype=np.int32),
        layer_kind=np.array([info[i].kind for i in layers], dtype=np.int8), shape=shape, rank=rank,
        vectors=vectors, params=params, conv_groups=conv_groups, in_group=in_group, out_group=out_group,
        in_level=in_level, out_level=out_level, group_size=np.array(groups.sizes, dtype=np.int64),
        group_parts_indptr=np.array(groups.parts_indptr, dtype=np.int64),
        group_parts=np.array(groups.parts, dtype=np.int32),
        layer_names=names, tensors=tensors, attrs=attrs)
