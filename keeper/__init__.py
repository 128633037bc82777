"""keeper: warm starts for deep-learning training from a zoo of trained models.

Public entry points: :func:`load_graph`, :func:`similarity`, :func:`align`, :class:`Zoo` (with
:class:`ZooConfig`), :class:`WarmResult`. The Ray service lives in :mod:`keeper.actors`, the Tune integration in
:mod:`keeper.tune_integration`, torch helpers in :mod:`keeper.torch_support`.

Example:
    >>> import keeper
    >>> zoo = keeper.Zoo("/tmp/zoo")                                   # doctest: +SKIP
    >>> zoo.register(trained_onnx_bytes, accuracy=0.91, name="net-a")  # doctest: +SKIP
    >>> zoo.warm(new_onnx_bytes).parent                                # doctest: +SKIP
    'net-a'
"""

from keeper.errors import InvalidModelError, KeeperError
from keeper.graph import LayerGraph, load_graph
from keeper.matching import Alignment, align, similarity
from keeper.warm import WarmResult
from keeper.zoo import Zoo, ZooConfig

__all__ = ["load_graph", "LayerGraph", "similarity", "align", "Alignment", "Zoo", "ZooConfig", "WarmResult",
           "KeeperError", "InvalidModelError"]
__version__ = "0.1.0"
