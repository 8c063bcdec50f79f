"""Streaming per-position statistics, reduced batch by batch; memory does not grow with samples.

:class:`SiteStats` takes one site's activations (B, T, d) and folds them into fixed-size sums:
per-position variance and norm, the summed cosine matrix, and running moments of the
per-sample adjacency and norm scores (the plain norm score and Zuo et al.'s pooled one, both
from the per-sample norms). Up to :data:`MAX_MATRIX` positions the cosine matrix is kept whole;
beyond, as sums over squares of positions (at most ``MAX_MATRIX`` x ``MAX_MATRIX``, for figures)
beside the cosine by distance summed on the fly, so that the state is O(T) per site whatever T.
Attention statistics are in :mod:`nopelab.measure.attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nopelab.limits import MAX_MATRIX, matrix_block
from nopelab.measure.metrics import (
    AdjacencyCounts,
    adjacency_counts,
    cosine_by_distance,
    cosine_row_blocks,
    lower_triangle_sums,
    norm_score,
    norm_score_zuo,
    position_variance,
    symmetric_from_lower,
    to_numpy,
)


class RunningMoments:
    """Count, mean and spread of a stream of scalars (Chan et al.'s parallel update)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: np.ndarray) -> None:
        n = len(values)
        if n == 0:
            return
        mean = float(np.mean(values))
        m2 = float(np.sum((values - mean) ** 2))
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        """Sample standard deviation (0 for fewer than two values)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0


@dataclass(frozen=True)
class SiteResult:
    """Reduced statistics of one (site, layer); arrays are indexed by 0-based position."""

    samples: int
    variance: np.ndarray  # (T,) mean per-position variance across hidden dimensions
    norm: np.ndarray  # (T,) mean per-position L2 norm
    cosine: np.ndarray  # (K, K) mean self-cosine similarity over squares of `block` positions
    cosine_by_distance: np.ndarray  # (T,) mean cosine similarity against distance, 0..T-1
    adjacency: RunningMoments
    adjacency_signed: RunningMoments
    norm_score: RunningMoments
    norm_signed: RunningMoments
    norm_score_zuo: RunningMoments  # Zuo et al.'s pooled norm score (metrics.norm_score_zuo)
    block: int = 1  # positions per side of `cosine`'s squares (1: the whole T x T matrix)


def _zeros(shape: tuple[int, ...], device: torch.device | str) -> Tensor:
    return torch.zeros(shape, dtype=torch.float64, device=device)


class SiteStats:
    """Accumulates the statistics of one site from (B, T, d) activation batches."""

    def __init__(
        self, seq_len: int, device: torch.device | str = "cpu", max_matrix: int = MAX_MATRIX
    ):
        self.samples = 0
        self.variance_sum = _zeros((seq_len,), device)
        self.norm_sum = _zeros((seq_len,), device)
        self.block = matrix_block(seq_len, max_matrix)
        side = -(-seq_len // self.block)
        if self.block == 1:
            self.cosine_sum = _zeros((seq_len, seq_len), device)  # the lower triangle
        else:  # what the whole matrix would give at the end, summed on the CPU in one pass
            self.cosine_sum = _zeros((side, side), "cpu")  # the lower triangle, per square
            self.distance_sum = _zeros((seq_len,), "cpu")
            self.diagonal_sum = _zeros((side,), "cpu")
        self.adjacency, self.adjacency_signed = RunningMoments(), RunningMoments()
        self.norm_score, self.norm_signed = RunningMoments(), RunningMoments()
        self.norm_score_zuo = RunningMoments()

    @torch.no_grad()
    def update(self, h: Tensor) -> None:
        h = h.detach().float()
        B, T, _ = h.shape
        norms = h.norm(dim=-1)  # (B, T)
        self.samples += B
        self.variance_sum += position_variance(h).sum(0).double()
        self.norm_sum += norms.sum(0).double()
        # The cosine matrix's lower triangle, a row block at a time: all that the scores read.
        counts = AdjacencyCounts.zeros(B)
        for start, block in cosine_row_blocks(h, norms=norms, align=self.block):
            rows = to_numpy(block)  # (copied once off a GPU) for the passes on the CPU
            if self.block == 1:
                self.cosine_sum[start : block.shape[-1], : block.shape[-1]] += block.sum(0)
            else:
                squares, distances = self.cosine_sum.numpy(), self.distance_sum.numpy()
                lower_triangle_sums(
                    rows, start, self.block, squares, distances, self.diagonal_sum.numpy()
                )
            counts += adjacency_counts(rows, start)
        adjacency, by_norm = counts.scores(T), norm_score(norms)
        self.adjacency.update(adjacency.score)
        self.adjacency_signed.update(adjacency.signed)
        self.norm_score.update(by_norm.score)
        self.norm_signed.update(by_norm.signed)
        self.norm_score_zuo.update(norm_score_zuo(norms))

    def finite(self) -> bool:
        """Whether every activation seen so far was finite (a NaN or inf reaches these sums)."""
        return bool(self.norm_sum.isfinite().all() and self.variance_sum.isfinite().all())

    def result(self) -> SiteResult:
        n = max(self.samples, 1)
        T = len(self.norm_sum)
        if self.block == 1:
            cosine = (symmetric_from_lower(self.cosine_sum) / n).cpu().numpy()
            by_distance = cosine_by_distance(cosine)
        else:  # each square's sum: its lower part, mirrored, its diagonal once
            lower = self.cosine_sum.tril()
            sums = lower + lower.T - torch.diag(self.diagonal_sum)
            sizes = torch.full_like(self.diagonal_sum, float(self.block))
            sizes[-1] = T - self.block * (len(sums) - 1)
            cosine = (sums / (n * sizes[:, None] * sizes[None, :])).cpu().numpy()
            pairs = torch.arange(T, 0, -1, dtype=torch.float64, device=self.distance_sum.device)
            by_distance = (self.distance_sum / (n * pairs)).cpu().numpy()  # T - k pairs at k
        return SiteResult(
            samples=self.samples,
            variance=(self.variance_sum / n).cpu().numpy(),
            norm=(self.norm_sum / n).cpu().numpy(),
            cosine=cosine,
            cosine_by_distance=by_distance,
            adjacency=self.adjacency,
            adjacency_signed=self.adjacency_signed,
            norm_score=self.norm_score,
            norm_signed=self.norm_signed,
            norm_score_zuo=self.norm_score_zuo,
            block=self.block,
        )
