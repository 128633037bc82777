"""Ray Tune integration: one callback on the driver, one line in the trainable.

- :class:`KeeperCallback` (``tune.RunConfig(callbacks=[KeeperCallback(metric="accuracy", mode="max")])``)
  starts or finds the keeper service and registers every finished trial's checkpoint into the zoo.
- :func:`warm_start` (``warm_start(model, example_input)`` in the trainable) is
  :func:`keeper.torch_support.warm_start`: with no zoo given it warms from the running service, and in a trial it
  leaves the architecture template and the warm's lineage for the callback; :func:`warm_lr` applies its
  learning-rate recipe to the trainable's optimizer.

- :class:`KeeperPBT`: Tune's population-based training whose exploit step may cross architectures (the
  ``warm_start`` line restores a cloned checkpoint of any architecture onto the trial's own).

Checkpoint layouts the callback reads (keeper's own, Ray Train's, the Hugging Face Trainer's, ``save_pretrained``
folders, Lightning's) are listed in :mod:`keeper.torch_support.layouts`.
"""

from __future__ import annotations

from keeper.lazy import exports
from keeper.torch_support import warm_lr, warm_start
from keeper.torch_support.trial import ARCHITECTURE_FILE

__all__ = ["KeeperCallback", "KeeperPBT", "warm_start", "warm_lr", "CHECKPOINT_FILES", "ARCHITECTURE_FILE"]

# The driver's half is imported on first use: a trial process imports this package for warm_start and must not pay
# for the service's modules (the launcher, the front door, the manager) or the checkpoint readers.
_LAZY = {"KeeperCallback": "keeper.tune_integration.callback", "KeeperPBT": "keeper.tune_integration.pbt",
         "CHECKPOINT_FILES": "keeper.tune_integration.checkpoint"}
__getattr__, __dir__ = exports(__name__, _LAZY)
