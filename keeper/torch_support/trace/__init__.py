"""A torch module's architecture from one eager forward pass, without torch.onnx: the torch front end.

:func:`trace_graph` runs the module once in eval mode under a ``TorchFunctionMode``
(:mod:`~keeper.torch_support.trace.recorder`) that writes each torch call as the ONNX nodes the dynamo exporter
writes for it (the rule table :mod:`~keeper.torch_support.trace.table`, filled by
:mod:`~keeper.torch_support.trace.lowering` for layers and elementwise ops and :mod:`~keeper.torch_support.trace.shapes`
for shape ops), parameters as initializers named by their
state_dict keys and holding no data (:mod:`~keeper.torch_support.trace.builder`). The result is what
:func:`keeper.torch_support.export_graph` returns from the exporter: ONNX whose layers' tensors travel apart, the
ONNX-to-state_dict map and the LayerGraph, so everything downstream is unchanged.

Why this mechanism: the exporter's cost is torch.export's trace, its decompositions and the translation (seconds
per process, whatever the model's size); a forward pass costs milliseconds, the tensors are identified by
identity (no stamping of random values, no matching by value), and ``TorchFunctionMode`` exists unchanged from
torch 2.0 to the current release, with no deprecated exporter behind it.

Invariants:
    * same answers: the LayerGraph equals the dynamo exporter's in what alignment and warming read
      (``scripts/check_trace.py`` compares both paths over a catalogue; ``tests/test_trace.py`` pins a subset);
    * never a silently wrong graph: anything the rule table does not cover raises
      :class:`~keeper.errors.TraceUnsupported` naming the op, and the caller falls back to the exporter;
    * the module is left as it was: values untouched (nothing is stamped), training flags restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import onnx
import torch
from onnx import numpy_helper
from torch.utils._pytree import tree_flatten

from keeper.errors import TraceUnsupported
from keeper.graph import graph_from_proto
from keeper.onnx_safety import load_model
from keeper.torch_support.exported import Exported
from keeper.torch_support.tensors import as_numpy
from keeper.torch_support.trace import lowering, reductions, shapes  # noqa: F401 - importing registers the rules
from keeper.torch_support.trace.table import RULES
from keeper.torch_support.trace.recorder import DATA, Recorder

__all__ = ["trace_graph", "TraceUnsupported"]


def trace_graph(module: torch.nn.Module, args: tuple) -> Exported:
    """``module``'s architecture for ``args``, as the :class:`~keeper.torch_support.exported.Exported` record the
    exporters give: ONNX bytes whose layers' initializers hold no data, the map ONNX key -> (state_dict key,
    "same"), ``apart`` (data-less initializer -> ONNX key) and the LayerGraph.

    Raises:
        TraceUnsupported: naming the op or the reason when the forward cannot be followed.
    """
    rec = Recorder(module, RULES)
    names = _input_names(module, args)
    for i, t in enumerate(x for x in tree_flatten(args)[0]):
        if isinstance(t, torch.Tensor):
            rec.bind(t, rec.b.graph_input(names[i] if i < len(names) else f"args_{i}", t), DATA)
    was_training = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad(), _as_under_export(), rec:
            out = module(*args)
    finally:
        for m, training in was_training.items():
            m.training = training
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and rec.values.get(id(t)) is not None and rec.values[id(t)].kind == DATA:
            rec.b.outputs.append(rec.name_of(t))
    if not rec.b.outputs:
        raise TraceUnsupported("the forward returns no tensor computed from the input")
    proto = rec.b.model()
    graph = graph_from_proto(load_model(proto, what="traced module", weights_apart=True))
    state = module.state_dict(keep_vars=True)
    keys = {r.key: (r.source, "same") for refs in graph.tensors for r in refs
            if r.source in state and torch.is_floating_point(state[r.source])}
    apart: dict[str, str] = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key in keys:
                apart.setdefault(r.source, r.key)
    by_name = {name: t for name, t in rec.state.values()}
    for init in proto.graph.initializer:
        if init.name not in apart:  # a tensor no layer reads, a buffer outside the state_dict: its value stays
            init.CopyFrom(_with_data(init, by_name[init.name]))
    return Exported(proto.SerializeToString(), keys, apart, graph)


@contextlib.contextmanager
def _as_under_export() -> Iterator[None]:
    """torch.compiler's compiling and exporting flags set, as torch.export sets them while it traces: a model
    takes the code paths it takes under export (transformers then builds its attention masks instead of leaving
    them to the kernel), so the graph is the one the exporter sees."""
    flags = [f for f in ("_is_compiling_flag", "_is_exporting_flag") if hasattr(torch.compiler, f)]
    old = [getattr(torch.compiler, f) for f in flags]
    try:
        for f in flags:
            setattr(torch.compiler, f, True)
        yield
    finally:
        for f, v in zip(flags, old):
            setattr(torch.compiler, f, v)


def _with_data(init: onnx.TensorProto, t: torch.Tensor) -> onnx.TensorProto:
    if torch.is_floating_point(t):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        arr = as_numpy(t).astype(dtype, copy=False)
    else:
        arr = t.detach().cpu().numpy()
    return numpy_helper.from_array(arr.copy(order="C"), init.name)


def _input_names(module: torch.nn.Module, args: tuple) -> list[str]:
    """Graph input names as export gives them: the forward's parameter names, ``args_i`` for ``*args``."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    out = []
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            out += [f"args_{i}" for i in range(len(args) - len(out))]
            break
        out.append(p.name)
    return out
