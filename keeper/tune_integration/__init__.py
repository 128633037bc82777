"""Ray Tune integration: one callback on the driver, one line in the trainable.

- :class:`KeeperCallback` (``tune.RunConfig(callbacks=[KeeperCallback(metric="accuracy", mode="max")])``)
  starts or finds the keeper service and registers every finished trial's checkpoint into the zoo.
- :func:`warm_start` (``warm_start(model, example_input)`` in the trainable) loads the best parent's weights,
  transformed onto the trial's architecture, on the model's own device.

Checkpoint layouts the callback reads are listed in :mod:`keeper.tune_integration.checkpoint`.
"""

from keeper.tune_integration.callback import KeeperCallback
from keeper.tune_integration.checkpoint import CHECKPOINT_FILES
from keeper.tune_integration.trainable import ARCHITECTURE_FILE, warm_start

__all__ = ["KeeperCallback", "warm_start", "CHECKPOINT_FILES", "ARCHITECTURE_FILE"]
