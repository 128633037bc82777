"""The workload trace: a seeded list of jobs from several tenants, arriving over time, each with its own budget.

Kinds (:data:`KINDS`):
    nas: a FIFO search over ``nas_archs`` distinct architectures drawn from the workload's family space (every
        tenant searches the same space), each trained at the workload's default learning rate.
    hpo: an ASHA search (grace one round, reduction factor 3) over ``hpo_draws`` draws of width x depth x a
        log-uniform learning rate.
    single: one training job (one trial) of an architecture another tenant trained earlier in the trace (drawn
        from those; from the space while there are none), at the default learning rate.

Workloads (:data:`SPACES`): ``digits`` (2-D ResNets with BatchNorm on scikit-learn's 8x8 digits, AdamW under a
cosine schedule) and ``lm`` (byte-level GPT-2s on the Python standard library's source), the settings of
:class:`keeper_bench.pbt.PbtRun` with the trace's budgets. Tenants (:data:`TENANTS`) lean to one workload or mix
both.

Invariants: :func:`make_trace` is a pure function of its arguments; job ``i``'s trials (architecture, learning
rate, initial weights through the job's seed and the trial's index) are the same in every arm that runs it;
arrivals are a Poisson process (exponential gaps of mean ``Sizes.gap_s``) in job order. A job with ``after`` set
arrives ``arrival_s`` after that job ends (the searches that start with a zoo).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from keeper_bench.pbt import PbtRun

__all__ = ["KINDS", "WORKLOADS", "SPACES", "TENANTS", "Sizes", "QUICK", "REPORT", "Job", "make_trace",
           "zoo_start_searches", "workload_run"]

KINDS = ("nas", "hpo", "single")
WORKLOADS = ("digits", "lm")
#: Share of each kind among a trace's jobs.
KIND_SHARES = (0.3, 0.3, 0.4)
#: The family space every tenant searches, per workload, and its default learning rate.
SPACES: dict[str, dict[str, Any]] = {
    "digits": {"widths": (8, 12, 16), "blocks": (1, 2), "lr": 3e-3},
    "lm": {"widths": (32, 64), "blocks": (1, 2, 3), "lr": 3e-3},  # heads of 16 channels: 2 or 4 of them
}
#: Tenants and the share of their jobs on each workload.
TENANTS: dict[str, dict[str, float]] = {
    "ana": {"digits": 0.8, "lm": 0.2},
    "ben": {"digits": 0.2, "lm": 0.8},
    "chen": {"digits": 0.5, "lm": 0.5},
    "dara": {"digits": 0.5, "lm": 0.5},
}


@dataclass(frozen=True)
class Sizes:
    """A trace's budgets: steps per trial (evaluated and reported every ``round_steps``), trials per search, trials
    at once per search (a tenant's share of the cluster) and the mean gap between arrivals."""

    steps: int = 60
    round_steps: int = 20
    nas_archs: int = 3
    hpo_draws: int = 4
    concurrency: int = 2
    gap_s: float = 6.0
    batch_size: int = 64          # digits (the language models keep PbtRun.language's 8 windows)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


#: A few minutes' look (the default of scripts/bench_cluster.py).
QUICK = Sizes()
#: The report's run's budgets (its arrival gap must match the cluster's capacity: scripts/bench_cluster.py).
REPORT = Sizes(steps=160, round_steps=40, nas_archs=3, hpo_draws=5, gap_s=8.0)


@dataclass(frozen=True)
class Job:
    """One job of the trace (JSON-able through :meth:`as_dict`). ``trials``: per trial its ``index`` (which seeds
    its initial weights and data order with the job's ``seed``), ``width``, ``blocks`` and ``lr``."""

    index: int
    tenant: str
    kind: str
    workload: str
    seed: int
    arrival_s: float
    trials: tuple[dict, ...]
    steps: int
    round_steps: int
    concurrency: int
    batch_size: int = 64
    after: int | None = None
    label: str = ""
    space: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"j{self.index:03d}-{self.tenant}-{self.kind}-{self.workload}" + (f"-{self.label}" if self.label
                                                                                  else "")

    @property
    def scheduler(self) -> str:
        return "asha" if self.kind == "hpo" else "fifo"

    def run(self) -> PbtRun:
        """The workload's settings with this job's budget."""
        return workload_run(self.workload, steps=self.steps, round_steps=self.round_steps,
                            batch_size=self.batch_size)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["trials"] = [dict(t) for t in self.trials]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        return cls(**{**d, "trials": tuple(dict(t) for t in d["trials"]), "space": dict(d.get("space") or {})})


def workload_run(workload: str, *, steps: int, round_steps: int, batch_size: int = 64) -> PbtRun:
    """:class:`PbtRun` of ``workload`` (``digits`` or ``lm``) with the trace's budget; the language models keep
    their batches of 8 windows."""
    if workload == "digits":
        return PbtRun.digits(steps=steps, round_steps=round_steps, batch_size=batch_size, population=1)
    if workload == "lm":
        return PbtRun.language(steps=steps, round_steps=round_steps, population=1)
    raise ValueError(f"workload {workload!r}: expected one of {WORKLOADS}")


def _lr(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def make_trace(jobs: int, seed: int = 0, sizes: Sizes = QUICK) -> list[Job]:
    """``jobs`` jobs of the tenants of :data:`TENANTS`, kinds in :data:`KIND_SHARES`, Poisson arrivals.

    Example:
        >>> [j.kind for j in make_trace(5, seed=0)]  # doctest: +SKIP
    """
    rng = np.random.default_rng(seed)
    tenants = sorted(TENANTS)
    trained: dict[str, list[tuple[str, tuple[int, int]]]] = {w: [] for w in WORKLOADS}
    out: list[Job] = []
    t = 0.0
    for i in range(jobs):
        if i:
            t += float(rng.exponential(sizes.gap_s))
        tenant = tenants[int(rng.integers(len(tenants)))]
        shares = TENANTS[tenant]
        workload = str(rng.choice(WORKLOADS, p=[shares[w] for w in WORKLOADS]))
        kind = str(rng.choice(KINDS, p=KIND_SHARES))
        space = SPACES[workload]
        archs = [(w, b) for w in space["widths"] for b in space["blocks"]]
        lr_range = workload_run(workload, steps=1, round_steps=1).lr_range
        if kind == "nas":
            pick = rng.choice(len(archs), size=min(sizes.nas_archs, len(archs)), replace=False)
            trials = [{"width": archs[k][0], "blocks": archs[k][1], "lr": space["lr"]} for k in pick]
        elif kind == "hpo":
            trials = [{"width": int(rng.choice(space["widths"])), "blocks": int(rng.choice(space["blocks"])),
                       "lr": _lr(rng, *lr_range)} for _ in range(sizes.hpo_draws)]
        else:
            others = [a for owner, a in trained[workload] if owner != tenant]
            w, b = others[int(rng.integers(len(others)))] if others else archs[int(rng.integers(len(archs)))]
            trials = [{"width": w, "blocks": b, "lr": space["lr"]}]
        trials = [{"index": k, **{key: (float(v) if key == "lr" else int(v)) for key, v in tr.items()}}
                  for k, tr in enumerate(trials)]
        trained[workload] += [(tenant, (tr["width"], tr["blocks"])) for tr in trials]
        out.append(Job(index=i, tenant=tenant, kind=kind, workload=workload, seed=int(rng.integers(2**31 - 1)),
                       arrival_s=round(t, 3), trials=tuple(trials), steps=sizes.steps,
                       round_steps=sizes.round_steps, concurrency=1 if kind == "single" else sizes.concurrency,
                       batch_size=sizes.batch_size,
                       space={"widths": list(space["widths"]), "blocks": list(space["blocks"]),
                              "lr_range": list(lr_range)}))
    return out


#: The searches that start with a zoo, per workload: the first space, and the adjacent one (wider and deeper).
ZOO_START_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "digits": {"first": {"widths": (8, 16), "blocks": (1, 2)}, "adjacent": {"widths": (16, 24), "blocks": (2, 3)}},
    "lm": {"first": {"widths": (32,), "blocks": (1, 2)}, "adjacent": {"widths": (64,), "blocks": (2, 3)}},
}


def zoo_start_searches(workload: str, seed: int = 0, trials: int = 12, steps: int = 160, round_steps: int = 40,
                       start: int = 0) -> list[Job]:
    """Three ASHA searches of ``trials`` draws, one trial at a time per tenant: ``first`` (tenant ana, on an empty
    zoo), then, both arriving when it ends, ``repeat`` (tenant ben: the same space with another seed and a
    narrower learning-rate range, as a search run again after a change) and ``adjacent`` (tenant chen: a wider and
    deeper space). Job indices count from ``start``."""
    rng = np.random.default_rng(10_000 + seed)
    spaces = ZOO_START_SPACES[workload]
    lo, hi = workload_run(workload, steps=1, round_steps=1).lr_range
    plans = (("ana", "first", spaces["first"], (lo, hi), None),
             ("ben", "repeat", spaces["first"], (lo * 3, hi), start),
             ("chen", "adjacent", spaces["adjacent"], (lo, hi), start))
    out = []
    for k, (tenant, label, space, lr_range, after) in enumerate(plans):
        draws = [{"index": i, "width": int(rng.choice(space["widths"])), "blocks": int(rng.choice(space["blocks"])),
                  "lr": _lr(rng, *lr_range)} for i in range(trials)]
        out.append(Job(index=start + k, tenant=tenant, kind="hpo", workload=workload,
                       seed=int(rng.integers(2**31 - 1)), arrival_s=0.0, trials=tuple(draws), steps=steps,
                       round_steps=round_steps, concurrency=1, after=after, label=label,
                       space={"widths": list(space["widths"]), "blocks": list(space["blocks"]),
                              "lr_range": [float(lr_range[0]), float(lr_range[1])]}))
    return out
