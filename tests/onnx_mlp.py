"""A Gemm/Relu chain as ONNX bytes, built with numpy and onnx alone: the tests' MLP, importable where torch is not
(the cluster tests' driver processes); :mod:`nets` re-exports it."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def mlp_onnx(widths: Sequence[int], seed: int = 0, in_dim: int = 16, scale: float = 0.3) -> bytes:
    """A Gemm/Relu chain with random weights of std ``scale`` (other seeds: other bytes, same architecture)."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, d = [], [], "x", in_dim
    for i, w in enumerate(widths):
        inits += [numpy_helper.from_array((rng.standard_normal((w, d)) * scale).astype(np.float32), f"fc{i}.weight"),
                  numpy_helper.from_array((rng.standard_normal(w) * 0.1).astype(np.float32), f"fc{i}.bias")]
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [f"h{i}"], transB=1,
                                      name=f"fc{i}"))
        x, d = f"h{i}", w
        if i < len(widths) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, in_dim])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
