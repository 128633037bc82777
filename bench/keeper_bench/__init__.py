"""keeper_bench: the workloads keeper is measured on, a distribution of its own (``bench/``), apart from keeper.

Modules: :mod:`families` (model families as JSON-able specs), :mod:`workload` (MNIST-1D and the training loop),
:mod:`nas` (the NAS experiment through Ray Tune, one arm at a time), :mod:`lm` and :mod:`lm_nas` (the
language-model workload and experiment), :mod:`pbt` and :mod:`search` (the PBT and whole-search arms),
:mod:`baselines` (the published system's operators and name-and-shape loading), :mod:`synth_zoo` and
:mod:`scale_out` (a synthetic zoo and the loopback cluster for zoo-scale measurements), :mod:`cluster` (many
tenants' jobs arriving on one cluster and one keeper service), :mod:`transform_cost`, :mod:`deviation` and
:mod:`any_size` (what ``scripts/bench_warm.py`` measures; :mod:`footprint`, a call's time and memory),
:mod:`reporting`, :mod:`plateau` and :mod:`estimate` (what the training reports share), :mod:`demo`
(``keeper demo``, a ``keeper.commands`` plugin). ``pip install -e ./bench`` installs it with its dependencies
(mnist1d, matplotlib); the scripts in ``scripts/`` use it, and ``bench/tests/`` tests it.
"""

__all__: list[str] = []
