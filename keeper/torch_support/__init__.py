"""keeper for torch modules: warm-start a module in place, register a trained one, export its architecture.

Public surface:
    * :func:`warm_start` (``keeper.warm_start(model, example_input, zoo)``; in a Tune trainable or a Ray Train
      worker ``warm_start(model, example_input)`` warms from the running service) and :func:`register`
      (``keeper.register``);
    * :func:`export_graph` / :func:`module_weights` (the architecture without weights, and the weights read in
      place) and :func:`export` (ONNX with weights, under 2 GiB), with their :class:`Exported` record;
    * :class:`DataProbe`, a probe from data for ``warm_start(..., probe=...)``;
    * :func:`warm_lr`: the warm start's learning-rate recipe on a torch optimizer and the caller's scheduler.

Modules: :mod:`export` (the architecture), :mod:`cache` (exports remembered per architecture), :mod:`tensors`
(tensors as arrays), :mod:`cache_files` (exports kept on disk across processes), :mod:`exported` (the
record), :mod:`schedule` (warm_lr), :mod:`templates` (architecture templates and where they are kept),
:mod:`load` (a result into the module, and its loading report), :mod:`probe` (data probes), :mod:`start`
(warm_start, register), :mod:`restore` (a trial's checkpoint into the module), :mod:`trial` (files a Tune trial
leaves, the checkpoint it starts from), :mod:`distributed` (one warm start per Ray Train trial), :mod:`trace` (the
torch front end), :mod:`inputs`, :mod:`layouts` and :mod:`state_keys` (example inputs and checkpoint layouts).
"""

from keeper.torch_support.export import Exported, export, export_graph, module_weights
from keeper.torch_support.probe import DataProbe
from keeper.torch_support.schedule import warm_lr
from keeper.torch_support.start import register, warm_start

__all__ = ["warm_start", "register", "warm_lr", "export", "export_graph", "module_weights", "Exported", "DataProbe"]
