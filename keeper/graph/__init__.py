"""ONNX -> LayerGraph: the compact, Ray-friendly view of a model that matching and transforms use.

This is the only package that knows ONNX node conventions. A LayerGraph holds:

* every data-dependent ONNX node ("node"), in a canonical topological order that does not depend on the order of
  nodes in the file, with its kind and its predecessors in CSR form;
* the weighted nodes ("layers": conv, linear, norm, embedding, learned additive parameters), each with its main
  parameter's shape in one canonical orientation (axis 0 = output units, axis 1 = input units, then kernel), its
  trainable element count, and the initializers it reads (:class:`TensorRef`), followed through
  Identity/Transpose/Cast/Reshape/Squeeze/Unsqueeze so a dynamo export (renamed, pre-transposed, aliased weights)
  reads the same as a TorchScript one;
* channel groups: layers whose unit axes must share one channel indexing (a conv's output, the BatchNorm after
  it, the residual stream it is added to, the next conv's input) get one group id; concatenations are composite
  groups made of their parts;
* resolution levels: how many strided convs and pools (less strided transposed convs) stand between the graph
  input and a layer's input and output, so a CNN's stages can be told apart whatever their widths.

Every array is a flat numpy array (no Python objects in them), so a LayerGraph moves zero-copy through Ray.

Modules: :mod:`~keeper.graph.types` (TensorRef, LayerGraph and its persistence), :mod:`~keeper.graph.reader`
(reading a checked ModelProto), :mod:`~keeper.graph.fold` (integer constants computed in the graph),
:mod:`~keeper.graph.zeroed` (a learned vector with rows zeroed in the forward pass, found by folding),
:mod:`~keeper.graph.rules` (per-op rules), :mod:`~keeper.graph.order` (canonical
order), :mod:`~keeper.graph.unionfind`, :mod:`~keeper.graph.groups` and :mod:`~keeper.graph.packed` (channel
groups), :mod:`~keeper.graph.extract` (the entry points); over a built graph, :mod:`~keeper.graph.stream` (the
residual stream and its blocks) and :mod:`~keeper.graph.walk` (the walk to a layer's nearest neighbours). Kinds and
their traits: :mod:`keeper.kinds`.
"""

from keeper.graph.extract import as_graph, graph_from_proto, load_graph
from keeper.graph.types import INPUT_ROLE, LayerGraph, TensorRef
from keeper.kinds import Kind

__all__ = [
    "Kind",
    "INPUT_ROLE",
    "TensorRef",
    "LayerGraph",
    "load_graph",
    "as_graph",
    "graph_from_proto",
]
