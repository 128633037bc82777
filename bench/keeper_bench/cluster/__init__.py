"""The shared cluster the published system was built for: many tenants' searches and training jobs, arriving over
time, on one Ray cluster and one long-lived keeper service (``scripts/bench_cluster.py``).

Modules: :mod:`trace` (the seeded workload trace: tenants, job kinds, Poisson arrivals, each job's trials),
:mod:`job` (one job's process: its own Ray driver and ``tune.Tuner``, the trainable every arm shares),
:mod:`drive` (the loopback cluster, the service an operator starts, the drivers launched at their arrival times,
resumable), :mod:`reading` (completion against the cold twin, compute saving, TC speed-up, the service's figures,
the published table beside them).
"""

__all__: list[str] = []
