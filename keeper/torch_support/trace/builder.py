"""The ONNX graph the recorder writes: nodes, names, small constants, and initializers without data.

Names follow the dynamo exporter's: an op's result is named after the op (``linear``, ``linear_1``, ...) and
values inside a lowering ``val_N`` (zero-padded); initializers carry their state_dict key. The canonical order of
a LayerGraph only falls back to names between structurally identical nodes, so this keeps those ties where dynamo
puts them.

Invariants: a name is used once; a learned tensor is an initializer with dims and data type but no data (its
values are the module's, read in place); nodes no graph output depends on are dropped (:meth:`model`), as
torch.export drops dead code.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from keeper.errors import TraceUnsupported
from keeper.graph.reader import INPUT_KIND, INPUT_PERSISTENT

__all__ = ["OnnxBuilder", "OPSET", "onnx_dtype", "numpy_dtype"]

#: The opset the dynamo exporter of the supported torch versions writes (LayerNormalization needs 17).
OPSET = 20

_DTYPES = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
           torch.bfloat16: TensorProto.BFLOAT16, torch.float64: TensorProto.DOUBLE, torch.int64: TensorProto.INT64,
           torch.int32: TensorProto.INT32, torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8,
           torch.uint8: TensorProto.UINT8, torch.bool: TensorProto.BOOL}


def onnx_dtype(dtype: torch.dtype) -> int:
    """The ONNX data type of a torch dtype (complex and quantised types have none here)."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TraceUnsupported(f"a tensor of dtype {dtype}") from None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of the constants written for a tensor of ``dtype``: bfloat16's widened to float32, as the
    exporter writes Python scalars next to a bfloat16 tensor. From the table, not from a tensor made to ask:
    a tensor made here would land on torch's default device (``meta`` has no values to convert)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.float32)
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_dtype(dtype)))


class OnnxBuilder:
    """An ONNX graph under construction."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, TensorProto] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        self._used: set[str] = set()
        self._count: dict[str, int] = {}
        self._vals = 0
        self._consts: dict[tuple, str] = {}
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        self.marks: dict[str, onnx.ValueInfoProto] = {}  # initializer -> what it is in the module (see initializer)

    def fresh(self, base: str | None = None) -> str:
        """A new value name: ``base``, ``base_1``, ... as torch.fx numbers nodes, or ``val_N`` without a base."""
        if base is None:
            while True:
                # zero-padded: names sort in the order values were made, as the exporter's do between the
                # structurally identical nodes whose order falls back to names (q/k/v projections)
                name = f"val_{self._vals:06d}"
                self._vals += 1
                if name not in self._used:
                    break
        else:
            n = self._count.get(base, 0)
            while True:
                name = base if n == 0 else f"{base}_{n}"
                n += 1
                if name not in self._used:
                    break
            self._count[base] = n
        self._used.add(name)
        return name

    def node(self, op: str, inputs: Sequence[str], base: str | None = None, outputs: int = 1,
             **attrs: Any) -> str | list[str]:
        """Append node ``op``; its output name (``base`` numbered, else ``val_N``), or the list of ``outputs``."""
        outs = [self.fresh(base) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, **attrs))
        return outs[0] if outputs == 1 else outs

    def constant(self, value: Any, dtype: Any = np.int64) -> str:
        """A ``Constant`` node holding ``value`` (shapes, axes, scalars, masks), one per distinct value. A Constant
        node, never an initializer: the graph reader takes float initializers for learned tensors."""
        arr = np.asarray(value, dtype=dtype) if not isinstance(value, np.ndarray) else value
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self.fresh()
            tensor = numpy_helper.from_array(arr.copy(order="C"), name)  # ascontiguousarray makes 0-d 1-d
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
            self._consts[key] = name
        return name

    def tensor_constant(self, t: torch.Tensor) -> str:
        """A Constant node holding a tensor made during the forward from no input and no learned tensor."""
        if t.device.type == "meta":
            raise TraceUnsupported(f"a tensor of shape {tuple(t.shape)} made during the forward on the meta device "
                                   "has no values for the graph's constant: the code that makes it names no "
                                   "device while torch's default device is meta; make it on its input's device")
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return self.constant(t.numpy().copy(), dtype=None)

    def initializer(self, name: str, t: torch.Tensor, constant: str | None = None) -> str:
        """Declare the module tensor ``t`` as initializer ``name``, without data; or, for a tensor the state_dict
        does not hold (``constant``: "BUFFER" for a buffer that is not persistent, "CONSTANT_TENSOR" for a tensor
        attribute), with its data and marked as the dynamo exporter marks it, which tells the graph reader it is
        no learned tensor (:func:`keeper.graph.reader.architecture_constants`)."""
        if name not in self.initializers:
            init = TensorProto()
            init.name, init.data_type = name, onnx_dtype(t.dtype)
            init.dims.extend(int(d) for d in t.shape)
            if constant is not None:
                v = t.detach().cpu()
                arr = (v.float() if v.dtype == torch.bfloat16 else v).numpy()
                init.CopyFrom(numpy_helper.from_array(
                    np.ascontiguousarray(arr).astype(helper.tensor_dtype_to_np_dtype(init.data_type)), name))
                mark = helper.make_tensor_value_info(name, init.data_type, list(init.dims))
                for key, value in ((INPUT_KIND, constant),
                                   (INPUT_PERSISTENT, "False" if constant == "BUFFER" else "None")):
                    prop = mark.metadata_props.add()
                    prop.key, prop.value = key, value
                self.marks[name] = mark
            self.initializers[name] = init
            self._used.add(name)
        return name

    def annotate(self, name: str, t: torch.Tensor) -> None:
        """Record ``t``'s dtype and shape for value ``name``: the exporter annotates every op's result so (its
        values inside a lowering are left to ONNX shape inference, as here)."""
        if name not in self.value_info and name not in self.initializers:
            self.value_info[name] = helper.make_tensor_value_info(name, onnx_dtype(t.dtype), list(t.shape))

    def graph_input(self, base: str, t: torch.Tensor) -> str:
        name = self.fresh(base)
        self.inputs.append(helper.make_tensor_value_info(name, onnx_dtype(t.dtype), list(t.shape)))
        return name

    def model(self) -> onnx.ModelProto:
        """The ModelProto of the nodes the outputs depend on, and of the initializers those read."""
        producer = {o: i for i, n in enumerate(self.nodes) for o in n.output}
        keep: set[int] = set()
        stack = [producer[o] for o in self.outputs if o in producer]
        while stack:
            i = stack.pop()
            if i in keep:
                continue
            keep.add(i)
            stack.extend(producer[x] for x in self.nodes[i].input if x in producer)
        nodes = [n for i, n in enumerate(self.nodes) if i in keep]
        read = {x for n in nodes for x in n.input} | set(self.outputs)
        inits = [t for name, t in self.initializers.items() if name in read]
        outputs = [helper.make_empty_tensor_value_info(o) for o in self.outputs]
        made = {o for n in nodes for o in n.output}
        graph = helper.make_graph(nodes, "keeper_trace", [i for i in self.inputs if i.name in read], outputs,
                                  initializer=inits,
                                  value_info=[v for name, v in self.value_info.items() if name in made]
                                  + [v for name, v in self.marks.items() if name in read])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 producer_name="keeper.trace", ir_version=10)
