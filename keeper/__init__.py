"""keeper: warm starts for deep-learning training from a zoo of trained models.

Public entry points: :func:`load_graph`, :func:`similarity`, :func:`align`, :class:`Zoo`,
:class:`WarmResult`. The Ray service lives in :mod:`keeper.actors`, the Tune integration in
:mod:`keeper.tune_integration`, torch helpers in :mod:`keeper.torch_support`.
"""

from keeper.errors import InvalidModelError, KeeperError
from keeper.graph import LayerGraph, load_graph
from keeper.matching import Alignment, align, similarity

__all__ = ["load_graph", "LayerGraph", "similarity", "align", "Alignment", "KeeperError", "InvalidModelError"]
__version__ = "0.1.0"
