"""What a trace's runs say: every job against its cold twin (the same job, seeds and arrival, without keeper), per
kind, per workload and overall, and the service's figures under the load.

The published system's measures:
    final quality: the model a job ends with (its trial whose last report has the best validation accuracy), read
        on the test split; a single training job's is its last report's.
    target: the cold twin's final quality, less ``margin`` of it (default 1%: one image of the 300 digits in the
        test split moves the accuracy by 0.3%).
    completion: the first report of the job at or above the target.
    TC speed-up of a job: the cold twin's time from arrival to completion over the keeper job's.
    compute saving: 1 - the keeper jobs' trial-seconds up to completion / the cold twins' (each trial's running time,
        from its start to its end or to the job's completion); also in training steps, which the machine's load does
        not move.
    a keeper job that never reaches the target (not reached) saved nothing and was not sooner, however early it
        ended (an ASHA search can stop its trials before they get there): its TC speed-up is at most 1x and its
        trial-seconds (and steps) count as at least its cold twin's up to completion.

Invariants: every figure is computed from the jobs' result files alone (what ``drive`` wrote); a job that failed
in either arm is counted as failed and left out of the ratios, never dropped silently.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["PUBLISHED", "Progress", "Twin", "twins", "group", "final_quality", "progress", "warm_latency",
           "keeper_share", "node_caches", "zoo_growth", "bootstrap"]

#: The published system's headline table (workload, models, GPU saving, TC speed-up) and the part of the trace
#: each row is read against (a kind, a workload, or nothing the trace has).
PUBLISHED: tuple[tuple[str, int, float, float, tuple[str, str] | None], ...] = (
    ("NAS, NASBench (vs Retiarii)", 1000, 0.655, 2.9, ("kind", "nas")),
    ("NAS, Bayesian AutoKeras", 500, 0.767, 4.3, ("kind", "hpo")),
    ("ensembles, V-Ensemble (vs MotherNets)", 104, 0.412, 1.7, None),
    ("image classification, imgclsmob (Ray w/o it)", 389, 0.642, 2.8, ("workload", "digits")),
    ("language modelling, Hugging Face (Ray w/o it)", 69, 0.447, 1.8, ("workload", "lm")),
)


def _last_by_trial(events: list[dict]) -> dict[str, dict]:
    last: dict[str, dict] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        last[e["trial"]] = e
    return last


def final_quality(result: dict) -> float | None:
    """The job's final quality (see the module docstring); None for a job that failed or reported nothing."""
    if result.get("failed") or not result.get("events"):
        return None
    best = max(_last_by_trial(result["events"]).values(), key=lambda e: e["val_accuracy"])
    return float(best["test_accuracy"])


@dataclass(frozen=True)
class Progress:
    """One job run up to its completion: reached (the target), seconds from arrival to completion (and from its
    first trial's start: its training alone, without its driver's start or a wait for a driver slot), trial-seconds
    and training steps by then, and the same over the whole job."""

    reached: bool
    tc_s: float
    train_s: float
    trial_s: float
    steps: int
    total_trial_s: float
    total_steps: int
    wall_s: float


def _trial_seconds(trials: dict, until: float) -> float:
    total = 0.0
    for t in trials.values():
        for i, s in enumerate(t["starts"]):
            e = t["ends"][i] if i < len(t["ends"]) else until
            total += max(0.0, min(e, until) - s)
    return total


def progress(result: dict, target: float) -> Progress:
    """``result`` against ``target`` (see the module docstring)."""
    events = sorted(result["events"], key=lambda e: e["t"])
    arrived, ended = float(result["arrived"]), float(result["ended"])
    hit = next((e for e in events if e["test_accuracy"] >= target), None)
    at = float(hit["t"]) if hit else ended
    steps = sum(int(e["round_steps"]) for e in events if e["t"] <= at)
    first = min((s for t in result["trials"].values() for s in t["starts"]), default=arrived)
    return Progress(reached=hit is not None, tc_s=at - arrived, train_s=at - first,
                    trial_s=_trial_seconds(result["trials"], at),
                    steps=steps, total_trial_s=_trial_seconds(result["trials"], ended),
                    total_steps=sum(int(e["round_steps"]) for e in events), wall_s=ended - arrived)


@dataclass(frozen=True)
class Twin:
    """A job and its cold twin: who, what, both final qualities, the target and both runs' progress (None where
    either arm failed), and how many of the keeper job's trials started from a parent."""

    name: str
    kind: str
    workload: str
    tenant: str
    cold_final: float | None
    keeper_final: float | None
    target: float | None
    cold: Progress | None
    keeper: Progress | None
    trials: int
    warmed: int
    same_arch: int

    @property
    def failed(self) -> bool:
        return self.cold is None or self.keeper is None

    @property
    def tc(self) -> float:
        """The TC speed-up (cold's time to completion over keeper's; at most 1 for a keeper job not reached)."""
        ratio = self.cold.tc_s / max(self.keeper.tc_s, 1e-9)
        return ratio if self.keeper.reached else min(1.0, ratio)

    @property
    def tc_train(self) -> float:
        """The same from each run's first trial start (training alone)."""
        ratio = self.cold.train_s / max(self.keeper.train_s, 1e-9)
        return ratio if self.keeper.reached else min(1.0, ratio)

    @property
    def keeper_cost(self) -> tuple[float, float]:
        """(trial-seconds, steps) the keeper job spent up to completion, as the saving counts them: at least the
        cold twin's for a job not reached."""
        k, c = self.keeper, self.cold
        if k.reached:
            return k.trial_s, float(k.steps)
        return max(k.total_trial_s, c.trial_s), float(max(k.total_steps, c.steps))

    @property
    def diff(self) -> float:
        """keeper's final quality minus cold's."""
        return float(self.keeper_final - self.cold_final)

    def as_dict(self) -> dict:
        return asdict(self)


def twins(jobs: Iterable[Any], cold: dict[str, dict], keeper: dict[str, dict], margin: float = 0.01) -> list[Twin]:
    """Every job of ``jobs`` (trace :class:`~keeper_bench.cluster.trace.Job`) with both arms' results (by job name);
    jobs missing from either arm are left out (a run still going)."""
    out = []
    for j in jobs:
        c, k = cold.get(j.name), keeper.get(j.name)
        if c is None or k is None:
            continue
        cf, kf = final_quality(c), final_quality(k)
        target = None if cf is None else cf * (1.0 - margin)
        firsts = [e for e in sorted(k.get("events") or [], key=lambda e: e["t"]) if e.get("warm_s")]
        out.append(Twin(j.name, j.kind, j.workload, j.tenant, cf, kf, target,
                        progress(c, target) if target is not None else None,
                        progress(k, target) if target is not None and kf is not None else None,
                        len(j.trials), sum(1 for e in firsts if e.get("parent")),
                        sum(1 for e in firsts if e.get("same_arch"))))
    return out


def bootstrap(rows: Sequence[tuple[float, ...]], stat, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of ``stat`` over ``n`` resamples (with replacement) of ``rows`` (one per job).
    ``stat`` maps an array of resamples, shape (n, jobs, columns), to ``n`` values (vectorised: a report is
    rewritten as jobs end)."""
    if len(rows) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    arr = np.asarray(rows, dtype=np.float64)
    stats = stat(arr[rng.integers(0, len(arr), (n, len(arr)))])
    return float(np.percentile(stats, 5)), float(np.percentile(stats, 95))


def _saving(rows: np.ndarray) -> np.ndarray:
    """1 - the keeper column's sum over the cold column's, per resample (rows: (..., jobs, 2))."""
    return 1.0 - rows[..., 1].sum(axis=-1) / np.maximum(rows[..., 0].sum(axis=-1), 1e-9)


def _median(rows: np.ndarray) -> np.ndarray:
    return np.median(rows[..., 0], axis=-1)


def group(twins_: Sequence[Twin]) -> dict:
    """The figures of a set of twins: jobs, failures, compute saving (trial-seconds and steps, with a bootstrap 90%
    interval over jobs), TC speed-up (median, quartiles, extremes, geometric mean, interval of the median), keeper
    jobs that reached the target, and those that ended worse than their cold twin."""
    ok = [t for t in twins_ if not t.failed]
    out: dict[str, Any] = {"jobs": len(twins_), "failed": len(twins_) - len(ok)}
    if not ok:
        return out
    secs = [(t.cold.trial_s, t.keeper_cost[0]) for t in ok]
    steps = [(float(t.cold.steps), t.keeper_cost[1]) for t in ok]
    ratios = np.array([t.tc for t in ok])
    diffs = np.array([t.diff for t in ok])
    out.update(
        saving=float(_saving(np.asarray(secs))), saving_ci=bootstrap(secs, _saving),
        saving_steps=float(_saving(np.asarray(steps))), saving_steps_ci=bootstrap(steps, _saving),
        tc_median=float(np.median(ratios)), tc_ci=bootstrap([(r,) for r in ratios], _median),
        tc_quartiles=[float(np.percentile(ratios, q)) for q in (25, 75)],
        tc_train_median=float(np.median([t.tc_train for t in ok])),
        tc_min=float(ratios.min()), tc_max=float(ratios.max()), tc_geomean=float(np.exp(np.mean(np.log(ratios)))),
        tc_hist=tc_histogram(ratios), reached=sum(t.keeper.reached for t in ok),
        worse=int((diffs < 0).sum()), worse_1pt=int((diffs < -0.01).sum()),
        worst_diff=float(diffs.min()), mean_diff=float(diffs.mean()),
        warmed=sum(t.warmed for t in ok), trials=sum(t.trials for t in ok),
        cold_final=float(np.mean([t.cold_final for t in ok])), keeper_final=float(np.mean([t.keeper_final
                                                                                               for t in ok])))
    return out


#: Edges of the TC speed-up distribution's bins.
TC_BINS = (0.0, 0.5, 0.9, 1.1, 2.0, 3.0, 5.0, 10.0, math.inf)


def tc_histogram(ratios: np.ndarray) -> list[int]:
    """How many jobs' TC speed-ups fall in each bin of :data:`TC_BINS` (left-closed)."""
    return [int(((ratios >= lo) & (ratios < hi)).sum()) for lo, hi in zip(TC_BINS[:-1], TC_BINS[1:])]


def _first_reports(results: Iterable[dict]) -> list[dict]:
    """The first report of every trial that ran keeper's warm start (it carries the warm start's figures)."""
    return [e for r in results for e in r.get("events") or [] if e.get("warm_phases") not in (None, "{}")]


def warm_latency(results: Iterable[dict]) -> dict:
    """p50 / p99 / max of ``warm_start``'s seconds in the trials, and of each of its phases (``WarmResult.seconds``)."""
    firsts = _first_reports(results)
    if not firsts:
        return {"n": 0}
    total = np.array([float(e["warm_s"]) for e in firsts])
    phases: dict[str, list[float]] = {}
    for e in firsts:
        for k, v in json.loads(e["warm_phases"]).items():
            phases.setdefault(k, []).append(float(v))

    def pct(xs) -> dict:
        a = np.asarray(xs)
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}

    return {"n": len(firsts), **pct(total), "phases": {k: pct(v) for k, v in phases.items()}}


def keeper_share(results: Iterable[dict]) -> dict:
    """keeper's share of the jobs' time: the trials' seconds in ``warm_start`` plus the drivers' in the callback's
    hooks, over the trials' seconds plus those hooks."""
    warm = hooks = trial_s = 0.0
    for r in results:
        if r.get("failed"):
            continue
        warm += sum(float(e.get("warm_s") or 0.0) for e in r.get("events") or [])
        hooks += float((r.get("callback") or {}).get("hook_s", 0.0))
        trial_s += _trial_seconds(r["trials"], float(r["ended"]))
    return {"warm_s": warm, "hook_s": hooks, "trial_s": trial_s,
            "share": (warm + hooks) / (trial_s + hooks) if trial_s + hooks else 0.0}


def node_caches(results: Iterable[dict], numbers: dict[str, int]) -> list[dict]:
    """Per node (numbered as the cluster was started; 0 the head): the trials that ran keeper's warm start there, the
    distinct architectures among them, and the architecture cache's traces (misses), disk hits and in-memory hits
    their warm starts made; trials that imported numba."""
    rows: dict[int, dict] = {}
    for r in results:
        for e in _first_reports([r]):
            node = numbers.get(e.get("node"), -1)
            row = rows.setdefault(node, {"node": node, "trials": 0, "archs": set(), "misses": 0, "disk_hits": 0,
                                         "hits": 0, "numba": 0, "pids": set()})
            before, after = json.loads(e["cache_before"]), json.loads(e["cache_after"])
            row["trials"] += 1
            row["archs"].add((e.get("workload"), e["width"], e["blocks"]))
            for k in ("misses", "disk_hits", "hits"):
                row[k] += int(after.get(k, 0)) - int(before.get(k, 0))
            row["numba"] += bool(e.get("numba"))
            row["pids"].add(e.get("pid"))
    out = []
    for node in sorted(rows):
        row = rows[node]
        out.append({**row, "archs": len(row["archs"]), "processes": len(row["pids"]), "pids": None})
    return out


def zoo_growth(samples: list[dict], points: int = 10) -> list[dict]:
    """The zoo's size at ``points`` evenly spaced times of the run (and its last sample)."""
    if not samples:
        return []
    t0 = samples[0]["t"]
    span = samples[-1]["t"] - t0
    picks = []
    for k in range(points + 1):
        at = t0 + span * k / points
        picks.append(min(samples, key=lambda s: abs(s["t"] - at)))
    seen, out = set(), []
    for s in picks:
        if id(s) not in seen:
            seen.add(id(s))
            out.append({**s, "t": s["t"] - t0})
    return out
