"""Timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Minimum wall time over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Wall times of each function over ``repeats`` rounds (after one warm-up call each). The
    functions take turns within a round, and the order rotates from round to round, so that slow
    drifts of a shared machine, and whatever one call leaves behind for the next, hit them
    alike: their ratios stay comparable."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times
