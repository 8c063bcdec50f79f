"""Where a curve past the training length leaves what it did within it.

Shared by the length reproductions: a curve is sampled at increasing positions (token positions,
or task lengths), fitted as a line against the log of position within the training range, and
said to *depart* where it stays off that line by more than a tolerance up to the last sample.
"""

from __future__ import annotations

import math

import numpy as np

FIT_FROM = 1 / 8  # the lines are fitted over positions FIT_FROM x T .. T
COINCIDE = 1.5  # two positions within this factor coincide


def lasting_from(positions: np.ndarray, exceeds: np.ndarray, after: float) -> float | None:
    """The first of ``positions`` (increasing) beyond ``after`` from which ``exceeds`` holds at
    every later position, or ``None`` when it does not hold at the last."""
    first = None
    for position, over in zip(positions, exceeds, strict=True):
        if position <= after:
            continue
        if not over:
            first = None
        elif first is None:
            first = float(position)
    return first


def departure(
    positions: np.ndarray, values: np.ndarray, train_len: int, tolerance: float
) -> float | None:
    """The first position past ``train_len`` from which ``values`` stay more than ``tolerance``
    away from their least-squares line against log position over :data:`FIT_FROM` x
    ``train_len`` .. ``train_len`` (``None``: they never do; a constant where one position
    alone is fitted)."""
    within = (positions >= FIT_FROM * train_len) & (positions <= train_len)
    if not within.any():
        raise ValueError(f"no position in {FIT_FROM:g} x {train_len} .. {train_len} to fit")
    if within.sum() > 1:
        slope, intercept = np.polyfit(np.log(positions[within]), values[within], 1)
    else:
        slope, intercept = 0.0, float(values[within].mean())
    residual = values - (intercept + slope * np.log(positions))
    return lasting_from(positions, np.abs(residual) > tolerance, train_len)


def order(first: float | None, second: float | None, coincide: float = COINCIDE) -> str:
    """Whether ``first`` comes ``before``, ``with`` (within a factor ``coincide``; 1: equal) or
    ``after`` ``second``; ``neither`` when neither breaks, ``only first``/``only second`` when
    one does."""
    if first is None or second is None:
        return "neither" if first is second else "only first" if second is None else "only second"
    if abs(math.log(first / second)) <= math.log(coincide):
        return "with"
    return "before" if first < second else "after"
