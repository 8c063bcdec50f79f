"""Held-out loss by position at multiples of the training length (``nopelab evaluate``).

Every window's cross-entropy is computed per token and added into per-position sums and counts
as each batch of windows is run, so the logits of only one batch are ever held; positions are
then reduced into log-spaced buckets. The *flat length* is the longest length up to which the
perplexity stays at most :data:`FLAT_TOLERANCE` above that of the shortest length evaluated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nopelab.errors import UserError
from nopelab.limits import available_memory, size_text
from nopelab.training.corpus import TokenStream

FLAT_TOLERANCE = 0.10  # relative perplexity increase that still counts as flat
FLAG = "--lengths"


@dataclass(frozen=True)
class PositionLoss:
    """Summed cross-entropy (nats) and token counts per position (0-based index) of windows of
    one length."""

    total: np.ndarray  # float64, (length,)
    count: np.ndarray  # int64, (length,)

    @property
    def windows(self) -> int:
        return int(self.count[0])

    @property
    def tokens(self) -> int:
        return int(self.count.sum())

    @property
    def mean(self) -> float:
        """Mean nats per token over every position."""
        return float(self.total.sum() / self.count.sum())

    def row(self) -> dict[str, Any]:
        """One length's row: mean ``loss``, ``perplexity``, ``windows`` and ``tokens``."""
        return {
            "loss": self.mean,
            "perplexity": perplexity(self.mean),
            "windows": self.windows,
            "tokens": self.tokens,
        }


@torch.inference_mode()
def position_loss(
    model: nn.Module,
    windows: Iterable[tuple[Tensor, Tensor]],
    length: int,
    batch_size: int,
    device: torch.device,
) -> PositionLoss:
    """Per-position cross-entropy of ``model`` on ``windows`` (inputs and targets, each
    ``(length,)``), run ``batch_size`` windows at a time and reduced as it goes."""
    total = torch.zeros(length, dtype=torch.float64)
    count = torch.zeros(length, dtype=torch.int64)
    pairs = iter(windows)
    while batch := list(itertools.islice(pairs, batch_size)):
        x, y = (torch.stack(t).to(device) for t in zip(*batch, strict=True))
        logits = model(x)
        flat = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
        loss = flat.view(y.shape)
        total += loss.double().sum(0).cpu()
        count += len(batch)
    return PositionLoss(total.numpy(), count.numpy())


def log_buckets(length: int, buckets: int) -> list[tuple[int, int]]:
    """At most ``buckets`` ranges (first, last) of 1-based positions, log-spaced, that cover
    1..``length`` once each: a range per bucket edge that rounding leaves distinct."""
    edges = np.unique(np.rint(np.geomspace(1, length + 1, buckets + 1)).astype(np.int64))
    return [(int(start), int(end) - 1) for start, end in itertools.pairwise(edges)]


def bucket_rows(loss: PositionLoss, buckets: int) -> list[dict[str, Any]]:
    """Mean loss and token count of each log-spaced bucket of positions."""
    rows = []
    for first, last in log_buckets(len(loss.total), buckets):
        tokens = int(loss.count[first - 1 : last].sum())
        mean = float(loss.total[first - 1 : last].sum() / tokens)
        rows.append({"bucket_start": first, "bucket_end": last, "loss": mean, "tokens": tokens})
    return rows


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # beyond, a float overflows


def flat_length(
    perplexities: Mapping[float, float],
    tolerance: float = FLAT_TOLERANCE,
    reference: float | None = None,
) -> float | None:
    """The largest key (a length) up to which every length's perplexity is at most
    ``tolerance`` above ``reference`` (default: the shortest length's perplexity); a lower
    perplexity counts as flat. ``None`` when even the shortest length is above it."""
    lengths = sorted(perplexities)
    limit = (1 + tolerance) * (perplexities[lengths[0]] if reference is None else reference)
    flat = None
    for length in lengths:
        if not perplexities[length] <= limit:
            break
        flat = length
    return flat


# ------------------------------------------------------------------------ planning


@dataclass(frozen=True)
class LengthPlan:
    """One length to evaluate: its multiple of the training length, its windows, and how many
    of them one forward pass takes."""

    factor: int
    length: int
    windows: int
    batch_size: int


def plan_lengths(
    train_len: int,
    held_out: int,
    window_bytes: Callable[[int], int],
    *,
    factors: Iterable[int],
    windows: int,
    batch_size: int,
    table: int | None = None,
) -> list[LengthPlan]:
    """The windows (up to ``windows``) and batch (up to ``batch_size``) of every multiple of
    ``train_len`` in ``factors``, or a one-line error naming ``--lengths`` for a length beyond
    a learned position table of ``table`` positions, longer than the ``held_out`` tokens allow,
    or whose one-window forward pass (``window_bytes(length)``) would not fit in memory. Fewer
    windows are run together where a whole batch would not fit."""
    plans = []
    for factor in factors:
        length = factor * train_len
        if table is not None and length > table:
            raise UserError(
                f"{FLAG}: {factor}x is {length} tokens, beyond the learned position table of "
                f"{table}; allowed: up to {table // train_len}x"
            )
        available = (held_out - 1) // length
        if available < 1:
            raise UserError(
                f"{FLAG}: {factor}x needs a window of {length + 1} tokens; the held-out text has "
                f"{held_out} tokens: allowed up to {(held_out - 1) // train_len}x"
            )
        need, have = window_bytes(length), available_memory()
        if need > have:
            raise UserError(
                f"{FLAG}: a window of {factor}x ({length} tokens) needs about {size_text(need)} "
                f"of memory for its forward pass; {size_text(have)} is available"
            )
        count = min(windows, available)
        plans.append(
            LengthPlan(factor, length, count, max(1, min(batch_size, count, have // need)))
        )
    return plans


def chosen_windows(
    stream: TokenStream, length: int, count: int, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """``count`` of the consecutive non-overlapping held-out windows of ``length`` tokens: all of
    them, in order, when there are no more; else a choice drawn with ``seed``."""
    available = (len(stream.val) - 1) // length
    chosen = set(range(available))
    if count < available:
        rng = np.random.default_rng([seed, length])
        chosen = set(rng.choice(available, count, replace=False).tolist())
    pairs = stream.eval_windows("val", length, available)
    return (pair for i, pair in enumerate(pairs) if i in chosen)


# ------------------------------------------------------------------------ outputs


@dataclass(frozen=True)
class LengthResult:
    """What ``nopelab evaluate`` measured: a row per bucket of every length, a row per length."""

    positions: pd.DataFrame  # loss_by_position.parquet
    perplexity: pd.DataFrame  # perplexity.parquet
    shuffle: pd.DataFrame | None = None  # shuffle.parquet (--shuffle): measure/shuffle.py's rows


def result_tables(
    losses: Mapping[LengthPlan, PositionLoss], buckets: int, shuffle: pd.DataFrame | None = None
) -> LengthResult:
    """The tables of :class:`LengthResult` from the per-position losses of every length (and
    the prefix shuffle's rows, if measured)."""
    positions, lengths = [], []
    for plan, loss in losses.items():
        where = {"length_factor": plan.factor, "length": plan.length}
        positions += [{**where, **row} for row in bucket_rows(loss, buckets)]
        lengths.append({**where, **loss.row()})
    return LengthResult(pd.DataFrame(positions), pd.DataFrame(lengths), shuffle)


def write_result(
    out: Path, result: LengthResult, settings: dict[str, Any], title: str, seconds: float
) -> None:
    """Write the tables, ``loss_by_position.png`` (and ``shuffle.png``), ``config.json``
    (``settings``) and ``summary.md`` into ``out``."""
    from nopelab import plots
    from nopelab.runtime.rundir import environment, write_json
    from nopelab.tables import markdown_table

    train_len = int(settings["train_len"])
    write_json(out / "config.json", {**settings, "environment": environment()})
    result.positions.to_parquet(out / "loss_by_position.parquet", index=False)
    result.perplexity.to_parquet(out / "perplexity.parquet", index=False)
    plots.loss_by_position(result.positions, out / "loss_by_position.png", train_len, title)
    table = result.perplexity
    flat = flat_length(dict(zip(table["length_factor"], table["perplexity"], strict=True)))
    shortest = int(table["length_factor"].iloc[0])
    flat_text = "none" if flat is None else f"{flat:g}x ({round(flat * train_len)} tokens)"
    shown = ", ".join(f"{key} {value}" for key, value in settings.items())
    shuffled = ""
    if result.shuffle is not None:
        result.shuffle.to_parquet(out / "shuffle.parquet", index=False)
        plots.prefix_shuffle(result.shuffle, out / "shuffle.png", title=f"{title}: prefix shuffle")
        shuffled = (
            "## Prefix shuffle\n\nLoss (nats) on the tokens after the first k, with those k "
            f"tokens in random order and as they were, on windows of {train_len} tokens "
            "(`shuffle.png`):\n\n"
            f"{markdown_table(result.shuffle)}\n\n"
        )
    (out / "summary.md").write_text(
        f"# nopelab evaluate: {title}\n\n"
        f"Held-out loss (nats per token) and perplexity at multiples of the training length "
        f"({train_len} tokens), {seconds:.1f} s.\n\n"
        f"{markdown_table(table)}\n\n"
        f"**Flat length: {flat_text}**: the longest length up to "
        f"which every evaluated length has a perplexity at most {FLAT_TOLERANCE:.0%} above "
        f"the perplexity at {shortest}x (a lower perplexity counts as flat).\n\n"
        f"{shuffled}Settings: {shown}.\n"
    )
