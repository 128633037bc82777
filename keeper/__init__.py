"""keeper: warm starts for deep-learning training from a zoo of trained models.

What users call: :func:`warm_start` (a torch module warmed in place from the best parent: one line in a Tune
trainable, a Ray Train worker or a plain script) and :func:`register` (a trained module into a zoo), with
:class:`Zoo` (the embedded zoo, with :class:`ZooConfig`) and :class:`WarmResult` (what a warm start did and why);
:class:`~keeper.tune_integration.KeeperCallback` registers a Tune search's trials. Below them: :func:`load_graph`,
:func:`similarity` and :func:`align` over ONNX models. The Ray service lives in :mod:`keeper.actors`, the Tune
integration in :mod:`keeper.tune_integration`, torch helpers in :mod:`keeper.torch_support`.

``import keeper`` imports neither torch nor Ray: :func:`warm_start`, :func:`register` and ``KeeperCallback`` are
imported on first use.

Example:
    >>> import keeper
    >>> zoo = keeper.Zoo("/tmp/zoo")                                      # doctest: +SKIP
    >>> keeper.register(trained_model, example_input, zoo, accuracy=0.91)  # doctest: +SKIP
    >>> keeper.warm_start(new_model, example_input, zoo).parent           # doctest: +SKIP
    'model-...'
"""

from __future__ import annotations

from keeper.errors import InvalidModelError, KeeperError
from keeper.lazy import exports

__all__ = ["warm_start", "register", "KeeperCallback", "Zoo", "ZooConfig", "WarmResult", "load_graph",
           "LayerGraph", "similarity", "align", "Alignment", "KeeperError", "InvalidModelError"]
__version__ = "0.1.0"

# Imported on first use: the torch entry points import torch (seconds in a fresh process), the callback Ray Tune,
# and a trial process that imports keeper for warm_start must not load the embedded zoo or the aligner, which only
# a warm that transforms a parent in that process needs.
_LAZY = {"warm_start": "keeper.torch_support.start", "register": "keeper.torch_support.start",
         "KeeperCallback": "keeper.tune_integration.callback", "Zoo": "keeper.zoo", "ZooConfig": "keeper.zoo",
         "WarmResult": "keeper.warm", "load_graph": "keeper.graph", "LayerGraph": "keeper.graph",
         "similarity": "keeper.matching", "align": "keeper.matching", "Alignment": "keeper.matching"}
# a subpackage named as an attribute (``keeper.store.ModelStore`` after ``import keeper``) is imported too
__getattr__, __dir__ = exports(__name__, _LAZY, subpackages=True)
