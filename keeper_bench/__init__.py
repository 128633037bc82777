"""keeper_bench: the workloads keeper is measured on, kept out of the product package.

Modules: :mod:`families` (model families as JSON-able specs), :mod:`workload` (MNIST-1D and the training loop),
:mod:`nas` (the NAS experiment through Ray Tune, one arm at a time), :mod:`baselines` (the published system's
operators and name-and-shape loading), :mod:`graph_only` (a ZooManager that also holds match-only entries, for
zoo-scale measurements), :mod:`demo` (``keeper demo``). They need the ``bench`` extra
(``pip install -e ".[bench]"``: mnist1d, matplotlib); the scripts in ``scripts/`` and the tests use them.
"""

__all__: list[str] = []
