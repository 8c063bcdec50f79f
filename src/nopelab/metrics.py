"""Per-sample metrics of one site's activations, exactly as defined in the design notes (§3).

For one sequence ``h`` of shape (T, d) at one site:

* per-position variance ``v_t = mean_i (h_ti - mean_i h_ti)^2`` and norm ``||h_t||``;
* the self-cosine-similarity matrix ``S_ij = cos(h_i, h_j)``;
* the adjacency probability score: over rows i and earlier pairs j < k < i, the fraction
  with ``S_ik > S_ij`` (ties fail), pooled over rows: ``A = sum_i #{...} / C(T, 3)``;
  its signed form ``(concordant - discordant) / pairs``;
* the norm score: the same count on the single row ``-||h||``, i.e. the fraction of pairs
  j < k with ``||h_k|| < ||h_j||`` (norms shrinking with position, the variance hypothesis).

Counting is exact and takes O(n log n) per row (a merge sort that counts ordered pairs), so
a T x T matrix costs O(T^2 log T); triples are never enumerated. The kernel is compiled with
numba and runs on the CPU; tensors on other devices are copied there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

EPS = 1e-12

# OpenMP threads sleep between calls; numba's default workqueue layer contends with PyTorch's
# OpenMP pool and slowed the surrounding tensor ops several-fold in our measurements.
numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


def position_variance(h: Tensor) -> Tensor:
    """(B, T, d) -> (B, T): variance across hidden dimensions at each position.

    Two passes (centre, then a vector norm): as stable as ``Tensor.var`` and, on the CPU, several
    times faster than it.
    """
    centred = h - h.mean(dim=-1, keepdim=True)
    return torch.linalg.vector_norm(centred, dim=-1).square() / h.shape[-1]


def cosine_matrix(h: Tensor) -> Tensor:
    """(B, T, d) -> (B, T, T): cosine similarity of every pair of positions (zero vectors give 0)."""
    unit = _unit(h)
    return unit @ unit.transpose(-2, -1)


def _unit(h: Tensor) -> Tensor:
    return h / h.norm(dim=-1, keepdim=True).clamp_min(EPS)


def cosine_lower(h: Tensor, min_block: int = 128) -> Tensor:
    """(B, T, d) -> (B, T, T) whose lower triangle (diagonal included) is the cosine matrix.

    Cosine similarity is symmetric, so row blocks are multiplied only by the columns up to the
    block's end: about (k + 1) / 2k of the full product for k blocks. Entries above the diagonal
    blocks are zero; use :func:`symmetric_from_lower` for the full matrix.
    """
    unit = _unit(h)
    T = unit.shape[-2]
    block = max(min_block, -(-T // 8))
    if block >= T:
        return unit @ unit.transpose(-2, -1)
    out = unit.new_zeros(*unit.shape[:-1], T)
    for start in range(0, T, block):
        stop = min(start + block, T)
        out[..., start:stop, :stop] = unit[..., start:stop, :] @ unit[..., :stop, :].transpose(
            -2, -1
        )
    return out


def symmetric_from_lower(lower: Tensor) -> Tensor:
    """The symmetric matrix whose lower triangle (diagonal included) is ``lower``'s."""
    return lower.tril() + lower.tril(-1).transpose(-2, -1)


@numba.njit(cache=True, nogil=True)
def _merge(src, dst, i, mid, j, hi, o):  # pragma: no cover - compiled
    """Finish merging the sorted runs ``src[i:mid]`` and ``src[j:hi]`` into ``dst[o:]``; return
    the pairs (left, right) with left < right. Branch-free step: when the left head is smaller
    than the right head it is smaller than every remaining right element."""
    increasing = 0
    while i < mid and j < hi:
        left, right = src[i], src[j]
        take_left = left < right
        increasing += (hi - j) * take_left
        dst[o] = left if take_left else right
        i += take_left
        j += 1 - take_left
        o += 1
    while i < mid:
        dst[o] = src[i]
        i += 1
        o += 1
    while j < hi:
        dst[o] = src[j]
        j += 1
        o += 1
    return increasing


@numba.njit(cache=True, nogil=True)
def _ties(x, n):  # pragma: no cover - compiled
    """Tied pairs in the sorted ``x[:n]``."""
    ties = 0
    run = 0
    for t in range(1, n):
        run = run + 1 if x[t] == x[t - 1] else 0
        ties += run
    return ties


@numba.njit(cache=True, nogil=True)
def _sort_and_count_two(a, ta, na, b, tb, nb):  # pragma: no cover - compiled
    """Merge-sort ``a[:na]`` and ``b[:nb]`` bottom-up, alternating with the buffers ``ta``, ``tb``;
    return each row's (#pairs j<k with x_j < x_k, #pairs with x_j == x_k).

    The two rows' merges run in one loop while both have elements left: two independent
    dependency chains, which a single latency-bound merge leaves the CPU idle for.
    """
    inc_a, inc_b = 0, 0
    sa, da, sb, db = a, ta, b, tb
    n = max(na, nb)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid_a, hi_a = min(lo + width, na), min(lo + 2 * width, na)
            mid_b, hi_b = min(lo + width, nb), min(lo + 2 * width, nb)
            ia, ja, oa = lo, mid_a, lo
            ib, jb, ob = lo, mid_b, lo
            while ia < mid_a and ja < hi_a and ib < mid_b and jb < hi_b:
                left_a, right_a, left_b, right_b = sa[ia], sa[ja], sb[ib], sb[jb]
                take_a, take_b = left_a < right_a, left_b < right_b
                inc_a += (hi_a - ja) * take_a
                inc_b += (hi_b - jb) * take_b
                da[oa] = left_a if take_a else right_a
                db[ob] = left_b if take_b else right_b
                ia, ja, oa = ia + take_a, ja + 1 - take_a, oa + 1
                ib, jb, ob = ib + take_b, jb + 1 - take_b, ob + 1
            if lo < na:
                inc_a += _merge(sa, da, ia, mid_a, ja, hi_a, oa)
            if lo < nb:
                inc_b += _merge(sb, db, ib, mid_b, jb, hi_b, ob)
        sa, da, sb, db = da, sa, db, sb
        width *= 2
    return inc_a, _ties(sa, na), inc_b, _ties(sb, nb)


@numba.njit(cache=True, parallel=True)
def _pair_counts(rows, lengths):  # pragma: no cover - compiled
    """For each row r, count ordered and tied pairs among its first ``lengths[r]`` entries;
    rows go two at a time (an odd last row with an empty partner)."""
    R = rows.shape[0]
    increasing = np.zeros(R, np.int64)
    ties = np.zeros(R, np.int64)
    for p in numba.prange((R + 1) // 2):
        r = 2 * p
        na = lengths[r]
        nb = lengths[r + 1] if r + 1 < R else 0
        a = rows[r, :na].copy()
        b = rows[min(r + 1, R - 1), :nb].copy()
        inc_a, ties_a, inc_b, ties_b = _sort_and_count_two(
            a, np.empty(na, rows.dtype), na, b, np.empty(nb, rows.dtype), nb
        )
        increasing[r], ties[r] = inc_a, ties_a
        if r + 1 < R:
            increasing[r + 1], ties[r + 1] = inc_b, ties_b
    return increasing, ties


def pair_counts(rows: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: #{j < k < n: x_j < x_k} and #{j < k < n: x_j == x_k}, with n = lengths[row].

    ``rows`` is (R, T) float; ``lengths`` is (R,) int. Exact, O(n log n) per row.
    """
    rows = np.ascontiguousarray(rows)
    return _pair_counts(rows, np.ascontiguousarray(lengths, dtype=np.int64))


def _to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
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


def adjacency_score(similarity: Tensor | np.ndarray) -> PairScores:
    """Adjacency probability score of each (T, T) similarity matrix in a (B, T, T) batch.

    Row i compares earlier positions j < k < i: a pair is concordant when ``S_ik > S_ij``,
    discordant when ``S_ik < S_ij``, and a tie otherwise (ties count as failures).
    """
    s = _to_numpy(similarity)
    B, T, _ = s.shape
    # Row i's earlier entries S_ij (j < i) are ordered by j; k > j is nearer to i.
    lengths = np.tile(np.arange(T), B)
    increasing, ties = pair_counts(s.reshape(B * T, T), lengths)
    concordant = increasing.reshape(B, T).sum(axis=1)
    tied = ties.reshape(B, T).sum(axis=1)
    pairs = T * (T - 1) * (T - 2) // 6  # sum_i C(i - 1, 2) = C(T, 3)
    discordant = pairs - concordant - tied
    return PairScores(concordant / pairs, (concordant - discordant) / pairs)


def norm_score(norms: Tensor | np.ndarray) -> PairScores:
    """Variance-hypothesis counterpart on (B, T) norms: P(||h_k|| < ||h_j||) over pairs j < k."""
    x = -_to_numpy(norms)
    B, T = x.shape
    increasing, ties = pair_counts(x, np.full(B, T))
    pairs = T * (T - 1) // 2
    discordant = pairs - increasing - ties
    return PairScores(increasing / pairs, (increasing - discordant) / pairs)


def adjacency_score_bruteforce(similarity: Tensor | np.ndarray) -> PairScores:
    """O(T^3) reference: compare every triple j < k < i directly (for tests and benchmarks)."""
    s = _to_numpy(similarity)
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
    return np.array([np.diagonal(mean_cosine, offset=-k).mean() for k in range(T)])
