"""Haviv et al.'s prefix shuffle: how much a causal language model's loss on the rest of a
window rises when the order of its first ``k`` tokens is destroyed.

For each ``k``, every window's first ``k`` tokens are permuted at random (each window its own
permutation, drawn from ``seed`` and ``k`` alone) and the loss is taken on the targets at
positions ``k`` onwards (each predicted from an input token outside the prefix), beside the
loss on the same targets of the window as it was. ``k`` = 0 and ``k`` = 1 permute nothing. A
model that reads order from its context pays for the shuffle; one that reads its context as a
bag of tokens beside the current one does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from nopelab.measure.length import PositionLoss, position_loss


def shuffled(
    windows: Iterable[tuple[Tensor, Tensor]], k: int, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor]]:
    """``windows`` (inputs, next tokens), each input's first ``k`` tokens permuted at random;
    the targets are left as they are (those inside the prefix are not counted)."""
    for x, y in windows:
        order = torch.cat([torch.randperm(k, generator=generator), torch.arange(k, len(x))])
        yield x[order], y


def suffix_loss(loss: PositionLoss, k: int) -> float:
    """Mean loss over the targets after a prefix of ``k`` tokens: positions ``k`` on."""
    return float(loss.total[k:].sum() / loss.count[k:].sum())


@torch.no_grad()
def prefix_shuffle(
    model: nn.Module,
    windows: Sequence[tuple[Tensor, Tensor]],
    ks: Sequence[int],
    batch_size: int,
    device: torch.device,
    seed: int,
) -> list[dict[str, Any]]:
    """One row per prefix length ``k``: the loss on the targets from position ``k`` on with the
    prefix shuffled (``loss``) and as it was (``unshuffled_loss``), their difference (``rise``)
    and those targets' count (``tokens``)."""
    length = len(windows[0][0])
    if any(not 0 <= k < length for k in ks):
        raise ValueError(f"prefix lengths must be in 0..{length - 1}, got {list(ks)}")
    plain = position_loss(model, windows, length, batch_size, device)
    rows = []
    for k in ks:
        state = np.random.SeedSequence([seed, k]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(state))
        shuffled_loss = position_loss(
            model, shuffled(windows, k, generator), length, batch_size, device
        )
        before, after = suffix_loss(plain, k), suffix_loss(shuffled_loss, k)
        rows.append(
            {
                "k": k,
                "loss": after,
                "unshuffled_loss": before,
                "rise": after - before,
                "tokens": int(plain.count[k:].sum()),
            }
        )
    return rows
