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


def best_of_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Minimum wall time of each function over ``repeats`` rounds, the functions taking turns
    within a round (after one warm-up call each), so that slow drifts of a shared machine hit
    them alike and their ratios stay comparable."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}
