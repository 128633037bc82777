"""What a call costs the process it runs in: wall time over repetitions, and memory as ``/proc/self/status``
reports it (the resident set, its high-water mark, private resident memory sampled in a thread).

Linux only (``/proc``). The probes read the process they run in, so a benchmark measures each case in a fresh
subprocess when memory must start from a known level.

Example:
    >>> with AnonPeak() as mem:                                  # doctest: +SKIP
    ...     weights = load_file("child.safetensors")
    >>> mem.extra                                                # bytes of private memory above the start
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["proc_status", "timed", "AnonPeak"]


def proc_status(field: str) -> int:
    """A ``/proc/self/status`` line such as VmRSS, VmHWM or RssAnon, in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """The wall time of each of ``reps`` calls of ``fn``, in seconds."""
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


class AnonPeak:
    """Peak RssAnon (private memory: what the process allocated, not file pages it maps) above its level at the
    start, sampled every 2 ms in a thread."""

    def __enter__(self):
        self.base = proc_status("RssAnon")
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, proc_status("RssAnon"))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, proc_status("RssAnon"))
        self.extra = self.peak - self.base
