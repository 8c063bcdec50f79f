"""Haviv et al.'s prefix shuffle: how much a causal language model's loss on the rest of a
window rises when the order of its first ``k`` tokens is destroyed.

For each ``k``, every window's first ``k`` tokens are permuted at random (each window its own
permutation) and the loss is taken on the tokens that follow the prefix (the targets at
positions ``k - 1`` onwards: the first suffix token, predicted after the shuffled prefix, and
everything after it), beside the loss on the same targets of the window as it was. ``k`` = 0
and ``k`` = 1 permute nothing and equal the unshuffled loss. A model that reads order from its
context pays for the shuffle; one that treats its context as a bag of tokens does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

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
    """Mean loss over the targets that follow a prefix of ``k`` tokens: positions ``k - 1`` on."""
    first = max(k - 1, 0)
    return float(loss.total[first:].sum() / loss.count[first:].sum())


@torch.no_grad()
def prefix_shuffle(
    model: nn.Module,
    windows: Sequence[tuple[Tensor, Tensor]],
    ks: Sequence[int],
    batch_size: int,
    device: torch.device,
    seed: int,
) -> list[dict[str, Any]]:
    """One row per prefix length ``k``: the suffix loss with the prefix shuffled (``loss``) and
    as it was (``unshuffled_loss``), their difference (``rise``) and the suffix's ``tokens``."""
    length = len(windows[0][0])
    if any(not 0 <= k < length for k in ks):
        raise ValueError(f"prefix lengths must be in 0..{length - 1}, got {list(ks)}")
    generator = torch.Generator().manual_seed(seed)
    plain = position_loss(model, windows, length, batch_size, device)
    rows = []
    for k in ks:
        shuffled_loss = position_loss(
            model, shuffled(windows, k, generator), length, batch_size, device
        )
        before, after = suffix_loss(plain, k), suffix_loss(shuffled_loss, k)
        first = max(k - 1, 0)
        rows.append(
            {
                "k": k,
                "loss": after,
                "unshuffled_loss": before,
                "rise": after - before,
                "tokens": int(plain.count[first:].sum()),
            }
        )
    return rows
