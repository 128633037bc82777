"""``Registrar``: the actor that turns finished Tune trials' checkpoints into zoo models, off the Tune driver.

One long-lived process per service (``<name>-registrar``, started by :class:`KeeperCallback`), reserving no CPU.
Its imports (torch, onnx, the checkpoint readers) are paid once, when the callback starts it with the experiment,
not once per trial: a task per trial would run in a fresh worker each time (Ray keeps no more idle workers than
CPUs while trials hold them) and import torch again, seconds of CPU that the trials beside it lose.

Invariant: every registration the driver announced to the front door (``FrontDoor.expect``) is settled there
(``FrontDoor.settled``) when it ends, registered or refused, so no parent choice waits for it longer than it runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Registrar"]


class Registrar:
    """Registers trials' checkpoints (see the module docstring); a plain class, made an actor by the launcher."""

    def __init__(self) -> None:
        # the heavy imports now, while the experiment's first trials train, so the first registration is quick
        from keeper.tune_integration import checkpoint  # noqa: F401

    def ping(self) -> bool:
        return True

    def prepare(self, handle: Any, builder: Any, config: dict) -> None:
        """Build a starting trial's model from its config (``KeeperCallback(model_builder=...)``) and ask the front
        door for its parent, so the trial's own ask is a cache hit."""
        from keeper.torch_support.export import export_graph
        from keeper.torch_support.inputs import example_for

        module, example = builder(config)
        handle.choose.remote(export_graph(module, example_for(module, example)).graph.to_arrays())

    def register(self, handle: Any, name: str, checkpoint: Any, storage_fs: Any, trial_fs_path: str,
                 accuracy: float, builder: Any, config: dict, timeout_s: float, zoo_uri: str | None) -> dict:
        """The trial's checkpoint registered as ``name`` through the front door ``handle``
        (:func:`keeper.tune_integration.checkpoint.register_trial`); ``name`` is settled there whatever happens."""
        from keeper.tune_integration.checkpoint import register_trial

        try:
            return register_trial(handle, checkpoint, storage_fs, trial_fs_path, accuracy, name, builder, config,
                                  timeout_s, zoo_uri)
        finally:
            handle.settled.remote(name)
