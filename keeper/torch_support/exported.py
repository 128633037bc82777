"""The record of a torch module's export: its ONNX, the map from ONNX tensors to state_dict entries, and which
data-less initializer each state_dict entry feeds. Built by :mod:`keeper.torch_support.export` and remembered by
:mod:`keeper.torch_support.cache`."""

from __future__ import annotations

from dataclasses import dataclass, field

from keeper.graph import LayerGraph

__all__ = ["Exported"]


@dataclass
class Exported:
    """ONNX bytes of a module and, per ONNX tensor key, (state_dict key, "same" | "T").

    ``apart``: for a graph without weights (:func:`export_graph`), each data-less initializer -> the ONNX key
    whose state_dict entry holds its value (empty when ``onnx`` holds the weights)."""

    onnx: bytes
    keys: dict[str, tuple[str, str]]
    apart: dict[str, str] = field(default_factory=dict)
    #: the LayerGraph of ``onnx`` when already extracted (by :func:`export_graph`), so a warm does not parse twice
    graph: LayerGraph | None = field(default=None, compare=False, repr=False)
