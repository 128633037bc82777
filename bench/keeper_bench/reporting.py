"""What the training benchmarks' reports share: the machine's load beside a wall time, a figure's mean and spread
over seeds, and the two figures every training report draws (quality against steps per family, cold vs keeper;
the distribution of per-trial speedups of the warmed trials).

Records are read through their ``family``, ``parent``, ``steps`` and the quality series the caller names, so the
image (:class:`keeper_bench.nas.TrialRecord`) and language (:class:`keeper_bench.lm_nas.LmRecord`) benchmarks
draw alike.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["LoadSampler", "spread", "plot_family_curves", "plot_speedup_hist"]


class LoadSampler:
    """The 1-minute load average, sampled every ``every`` seconds in a daemon thread while a benchmark runs (the
    cores may be shared: a report states the load beside its wall time)."""

    def __init__(self, every: float = 30.0):
        self.every = float(every)
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> None:
        self._stop.set()

    def mean(self) -> float:
        return float(np.mean(self.samples))

    def summary(self) -> dict:
        s = np.asarray(self.samples)
        return {"samples": len(s), "every_s": self.every, "mean": float(s.mean()), "median": float(np.median(s)),
                "min": float(s.min()), "max": float(s.max())}


def spread(values: Sequence[float], fmt: str) -> str:
    """``values`` as ``mean ± sample std`` (one value: itself), each formatted with ``fmt``."""
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(float(np.mean(values)), fmt)} ± {format(float(np.std(values, ddof=1)), fmt)}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_family_curves(cold: Sequence[Any], warm: Sequence[Any], series: Callable[[Any], list[float]], ylabel: str,
                       path: str, marker: str | None = None) -> None:
    """One panel per family: ``series`` (a record's quality per evaluation) averaged over the architectures keeper
    warmed, cold and keeper, against training steps. ``cold[i]`` and ``warm[i]`` are one architecture (one family,
    one budget, one evaluation grid)."""
    plt = _pyplot()
    fams = sorted({r.family for r in cold})
    fig, axes = plt.subplots(1, len(fams), figsize=(4.5 * len(fams), 3.3), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        warmed = [i for i, r in enumerate(warm) if r.family == fam and r.parent]
        for recs, label, colour in ((cold, "cold", "tab:gray"), (warm, "keeper", "tab:blue")):
            if warmed:
                ax.plot(recs[warmed[0]].steps, np.mean([series(recs[i]) for i in warmed], axis=0), marker=marker,
                        label=f"{label} ({len(warmed)} warmed archs)", color=colour)
        ax.set_title(fam)
        ax.set_xlabel("training steps")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_hist(rows: dict, results: dict, top: float, path: str, seed: int = 0) -> None:
    """Per arm, the histogram of the warmed trials' speedups in steps to target on ``seed`` (``rows[arm][seed]``
    holds ``per_trial_speedup`` in the order of ``results[arm][seed]``), on log bins from 0.1 to ``top``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = np.logspace(np.log10(0.1), np.log10(top), 24)
    for arm, per_seed in rows.items():
        sp = [x for x, r in zip(per_seed[seed]["per_trial_speedup"], results[arm][seed]) if r.parent]
        ax.hist(sp, bins=bins, histtype="step", label=arm, linewidth=1.5)
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_xlabel(f"per-trial speedup in steps to target (warmed trials, seed {seed})")
    ax.set_ylabel("trials")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
