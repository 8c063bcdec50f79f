"""Per-sample metrics of one site's activations, exactly as defined in docs/metrics.md.

For one sequence ``h`` of shape (T, d) at one site:

* per-position variance ``v_t = mean_i (h_ti - mean_i h_ti)^2`` and norm ``||h_t||``;
* the self-cosine-similarity matrix ``S_ij = cos(h_i, h_j)``;
* the adjacency probability score: over rows i and earlier pairs j < k < i, the fraction
  with ``S_ik > S_ij`` (ties fail), pooled over rows: ``A = sum_i #{...} / C(T, 3)``;
  its signed form ``(concordant - discordant) / pairs``;
* the norm score: the same count on the single row ``-||h||``, i.e. the fraction of pairs
  j < k with ``||h_k|| < ||h_j||`` (norms shrinking with position, the variance hypothesis);
* Zuo et al.'s norm score: the adjacency score's pooled count with every row i reading
  ``-||h||`` at its earlier positions: pairs j < k < i with ``||h_k|| < ||h_j||``, summed over
  rows and divided by ``C(T, 3)``. Pair (j, k) thus counts once per later row, T - k times
  (1-based), so early pairs weigh more than in the plain norm score.

Counting is exact and takes O(n log n) per row (sorting that counts ordered pairs, in
:mod:`nopelab.measure.pair_count`), so a T x T matrix costs O(T^2 log T); triples are never enumerated.
The kernel is compiled with numba and runs on the CPU; tensors on other devices are copied there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from nopelab.limits import row_block
from nopelab.measure.pair_count import pair_counts, weighted_pair_counts

EPS = 1e-12


def position_variance(h: Tensor) -> Tensor:
    """(B, T, d) -> (B, T): variance across hidden dimensions at each position.

    Two passes (centre, then a vector norm): as stable as ``Tensor.var`` and, on the CPU, faster
    than it (``benchmarks/bench_stats.py``).
    """
    centred = h - h.mean(dim=-1, keepdim=True)
    return torch.linalg.vector_norm(centred, dim=-1).square() / h.shape[-1]


def cosine_matrix(h: Tensor) -> Tensor:
    """(B, T, d) -> (B, T, T): cosine similarity of every pair of positions (zero vectors give 0)."""
    unit = _unit(h)
    return unit @ unit.transpose(-2, -1)


def _unit(h: Tensor, norms: Tensor | None = None) -> Tensor:
    norms = h.norm(dim=-1) if norms is None else norms
    return h / norms.unsqueeze(-1).clamp_min(EPS)


def cosine_row_blocks(
    h: Tensor, min_block: int = 64, norms: Tensor | None = None, align: int = 1
) -> Iterator[tuple[int, Tensor]]:
    """The cosine matrix's lower triangle (diagonal included) in row blocks, without the rest.

    Yields ``(start, block)`` with ``block = S[:, start:stop, :stop]``, shape (B, stop - start,
    stop): cosine similarity is symmetric, so a row block needs only the columns up to its end,
    about (k + 1) / 2k of the full product for k blocks (here 8, of at least ``min_block`` rows,
    fewer rows where a block would exceed :data:`nopelab.limits.BLOCK_ELEMENTS` per sample:
    long contexts).
    Each block is a fresh contiguous tensor: nothing of size T x T is allocated or copied.
    ``norms`` (B, T), if given, are ``h``'s norms, already computed; every block but the last
    has a multiple of ``align`` rows.
    """
    unit = _unit(h, norms)
    T = unit.shape[-2]
    block = row_block(T, min_block, align)
    for start in range(0, T, block):
        stop = min(start + block, T)
        yield start, unit[..., start:stop, :] @ unit[..., :stop, :].transpose(-2, -1)


def symmetric_from_lower(lower: Tensor) -> Tensor:
    """The symmetric matrix whose lower triangle (diagonal included) is ``lower``'s."""
    return lower.tril() + lower.tril(-1).transpose(-2, -1)


def to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    """float32 for float32 and narrower floats; float64 otherwise, so that no ties are invented."""
    if isinstance(x, Tensor):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.float64 else x.float().numpy()
    x = np.asarray(x)
    narrow = np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize <= 4
    return np.ascontiguousarray(x, dtype=np.float32 if narrow else np.float64)


@dataclass(frozen=True)
class PairScores:
    """Per-sample scores: ``score`` = P(nearer is more similar); ``signed`` = (conc - disc) / pairs."""

    score: np.ndarray
    signed: np.ndarray


def _pair_scores(
    concordant: np.ndarray, tied: np.ndarray, pairs: int, nan: np.ndarray
) -> PairScores:
    """Scores from per-sample counts; NaN for samples whose values held a NaN."""
    discordant = pairs - concordant - tied
    score = np.where(nan, np.nan, concordant / pairs)
    return PairScores(score, np.where(nan, np.nan, (concordant - discordant) / pairs))


@dataclass(frozen=True)
class AdjacencyCounts:
    """Per-sample triple counts over some rows of similarity matrices; add them up over row
    blocks, then :meth:`scores` gives the adjacency score of the whole matrices."""

    concordant: np.ndarray  # (B,) int: triples j < k < i with S_ik > S_ij
    tied: np.ndarray  # (B,) int: triples with S_ik == S_ij
    nan: np.ndarray  # (B,) bool: a NaN among the entries read

    @classmethod
    def zeros(cls, batch: int) -> AdjacencyCounts:
        return cls(np.zeros(batch, np.int64), np.zeros(batch, np.int64), np.zeros(batch, bool))

    def __add__(self, other: AdjacencyCounts) -> AdjacencyCounts:
        return AdjacencyCounts(
            self.concordant + other.concordant, self.tied + other.tied, self.nan | other.nan
        )

    def scores(self, seq_len: int) -> PairScores:
        return _pair_scores(self.concordant, self.tied, math.comb(seq_len, 3), self.nan)


def adjacency_counts(rows: Tensor | np.ndarray, first_row: int = 0) -> AdjacencyCounts:
    """Triple counts of rows ``first_row, first_row + 1, ...`` of each sample's similarity matrix,
    given as (B, R, C) with C > first_row + R - 1 (e.g. a block of :func:`cosine_row_blocks`).

    Row i's earlier entries S_ij (j < i) are ordered by j, and k > j is nearer to i: a
    concordant triple is an increasing pair of that row.
    """
    s = to_numpy(rows)
    B, R, C = s.shape
    counts = pair_counts(s.reshape(B * R, C), np.tile(np.arange(first_row, first_row + R), B))
    return AdjacencyCounts(
        counts.less.reshape(B, R).sum(axis=1),
        counts.equal.reshape(B, R).sum(axis=1),
        np.asarray(counts.nan.reshape(B, R).any(axis=1)),
    )


def adjacency_score(similarity: Tensor | np.ndarray) -> PairScores:
    """Adjacency probability score of each (T, T) similarity matrix in a (B, T, T) batch.

    Row i compares earlier positions j < k < i: a pair is concordant when ``S_ik > S_ij``,
    discordant when ``S_ik < S_ij``, and a tie otherwise (ties count as failures). A sample
    with a NaN below the diagonal scores NaN.
    """
    return adjacency_counts(similarity).scores(similarity.shape[-1])


def norm_score(norms: Tensor | np.ndarray) -> PairScores:
    """Variance-hypothesis counterpart on (B, T) norms: P(||h_k|| < ||h_j||) over pairs j < k."""
    x = -to_numpy(norms)
    B, T = x.shape
    counts = pair_counts(x, np.full(B, T))
    return _pair_scores(counts.less, counts.equal, T * (T - 1) // 2, counts.nan)


def norm_score_zuo(norms: Tensor | np.ndarray) -> np.ndarray:
    """Zuo et al.'s pooled norm score of each sample of (B, T) norms, shape (B,).

    For every row i = 1..T (1-based) count the pairs j < k < i with ``||h_k|| < ||h_j||`` (ties
    fail), sum over rows and divide by ``sum_i C(i - 1, 2) = C(T, 3)``. Pair (j, k) is counted by
    the T - k rows after k, so the sum is ``sum_{j<k} [||h_k|| < ||h_j||] (T - k)``, computed in
    O(T log T). A sample with a NaN norm scores NaN, as in :func:`norm_score`; T < 3 gives NaN.
    """
    x = -to_numpy(norms)
    T = x.shape[-1]
    pairs = math.comb(T, 3)
    weighted, nan = weighted_pair_counts(x, np.arange(T - 1, -1, -1))  # T - k, k = 1..T
    return np.where(nan | (pairs == 0), np.nan, weighted / max(pairs, 1))


def adjacency_score_bruteforce(similarity: Tensor | np.ndarray) -> PairScores:
    """O(T^3) reference: compare every triple j < k < i directly (for tests and benchmarks)."""
    s = to_numpy(similarity)
    B, T, _ = s.shape
    concordant = np.zeros(B, np.int64)
    discordant = np.zeros(B, np.int64)
    for i in range(2, T):
        row = s[:, i, :i]  # (B, i): S_ij for j < i
        nearer, farther = row[:, None, :], row[:, :, None]  # [b, j, k] = S_ik vs S_ij
        upper = np.triu(np.ones((i, i), dtype=bool), k=1)  # j < k
        concordant += ((nearer > farther) & upper).sum(axis=(1, 2))
        discordant += ((nearer < farther) & upper).sum(axis=(1, 2))
    pairs = T * (T - 1) * (T - 2) // 6
    return PairScores(concordant / pairs, (concordant - discordant) / pairs)


def cosine_by_distance(mean_cosine: np.ndarray) -> np.ndarray:
    """Mean of a (T, T) matrix's sub-diagonals: entry k is the mean of S[i, i - k], k = 0..T-1."""
    T = mean_cosine.shape[0]
    i, j = np.tril_indices(T)
    sums = np.bincount(i - j, weights=mean_cosine[i, j], minlength=T)
    return sums / np.arange(T, 0, -1)  # T - k entries on sub-diagonal k


def lower_triangle_sums(
    lower: np.ndarray,
    start: int,
    block: int,
    squares: np.ndarray,
    distances: np.ndarray,
    diagonal: np.ndarray,
) -> None:
    """Add a row block of lower triangles into the sums that stand in for the whole matrices.

    ``lower`` (B, R, C) holds S[i, j] for rows i = start..start+R-1 and columns j = 0..C-1,
    C = start + R (as :func:`cosine_row_blocks` gives it); ``start`` is a multiple of
    ``block``. Into float64 arrays: ``squares`` (K, K), the sums of S[i, j], j <= i, over
    ``block`` x ``block`` squares of positions; ``distances`` (T,), entry k the sum of
    S[i, i - k]; ``diagonal`` (K,), the sums of S[i, i] per square. One pass, O(B R C).
    """
    R, C = lower.shape[-2:]
    if start + R != C or start % block:
        raise ValueError(
            "a row block of the lower triangle starts at a square and ends at its last row"
        )
    _lower_triangle_sums(to_numpy(lower), start, block, squares, distances, diagonal)


@numba.njit(cache=True, nogil=True)
def _lower_triangle_sums(lower, start, block, squares, distances, diagonal):  # pragma: no cover
    for b in range(lower.shape[0]):
        for r in range(lower.shape[1]):
            i = start + r
            row, square = lower[b, r], i // block
            for first in range(0, i + 1, block):  # one square of the row at a time
                total = 0.0
                for j in range(first, min(first + block, i + 1)):
                    total += row[j]
                    distances[i - j] += row[j]
                squares[square, first // block] += total
            diagonal[square] += row[i]
