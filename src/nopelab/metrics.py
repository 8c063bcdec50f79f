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

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

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


def _unit(h: Tensor, norms: Tensor | None = None) -> Tensor:
    norms = h.norm(dim=-1) if norms is None else norms
    return h / norms.unsqueeze(-1).clamp_min(EPS)


def cosine_row_blocks(
    h: Tensor, min_block: int = 64, norms: Tensor | None = None
) -> Iterator[tuple[int, Tensor]]:
    """The cosine matrix's lower triangle (diagonal included) in row blocks, without the rest.

    Yields ``(start, block)`` with ``block = S[:, start:stop, :stop]``, shape (B, stop - start,
    stop): cosine similarity is symmetric, so a row block needs only the columns up to its end,
    about (k + 1) / 2k of the full product for k blocks (here 8, of at least ``min_block`` rows).
    Each block is a fresh contiguous tensor: nothing of size T x T is allocated or copied.
    ``norms`` (B, T), if given, are ``h``'s norms, already computed.
    """
    unit = _unit(h, norms)
    T = unit.shape[-2]
    block = max(min_block, -(-T // 8))
    for start in range(0, T, block):
        stop = min(start + block, T)
        yield start, unit[..., start:stop, :] @ unit[..., :stop, :].transpose(-2, -1)


def symmetric_from_lower(lower: Tensor) -> Tensor:
    """The symmetric matrix whose lower triangle (diagonal included) is ``lower``'s."""
    return lower.tril() + lower.tril(-1).transpose(-2, -1)


# The pair counter below merge-sorts each row bottom-up and counts, at every merge, the pairs
# (left element, right element) in increasing order. Its speed comes from four choices (2.2x
# together on one thread; README, Performance): (1) rows become order-preserving integer keys,
# since integer compares have a shorter latency than float ones; (2) runs of 8 are sorted and
# counted by a branch-free sorting network instead of three levels of tiny merges; (3) two rows'
# merges run interleaved in one loop, two independent dependency chains, with no bounds check
# inside the loop; (4) indices are unsigned, which spares numba's negative-index handling.

_u64 = numba.uint64


@numba.njit(cache=True, nogil=True)
def _to_keys(row, out, key_type):  # pragma: no cover - compiled
    """Write into ``out`` the integers ordered as the floats ``row`` (-0.0 and 0.0 both give 0);
    return whether ``row`` holds a NaN."""
    bits = row.view(key_type)
    shift = bits.itemsize * 8 - 1
    magnitude = ~(key_type.type(1) << shift)
    has_nan = False
    for t in range(row.shape[0]):
        sign = bits[t] >> shift  # 0 for positive, -1 for negative
        out[t] = ((bits[t] & magnitude) ^ sign) - sign  # sign-magnitude to two's complement
        has_nan |= row[t] != row[t]
    return has_nan


@numba.njit(cache=True, nogil=True, inline="always")
def _cx(a, b):  # pragma: no cover - compiled
    return min(a, b), max(a, b)


@numba.njit(cache=True, nogil=True)
def _sort8(x, lo):  # pragma: no cover - compiled
    """Sort ``x[lo:lo+8]`` in place with an optimal 19-comparator network; return its
    #{j < k: x_j < x_k} from before the sort."""
    x0, x1, x2, x3 = x[lo], x[lo + 1], x[lo + 2], x[lo + 3]
    x4, x5, x6, x7 = x[lo + 4], x[lo + 5], x[lo + 6], x[lo + 7]
    less = (
        (x0 < x1) + (x0 < x2) + (x0 < x3) + (x0 < x4) + (x0 < x5) + (x0 < x6) + (x0 < x7)
        + (x1 < x2) + (x1 < x3) + (x1 < x4) + (x1 < x5) + (x1 < x6) + (x1 < x7)
        + (x2 < x3) + (x2 < x4) + (x2 < x5) + (x2 < x6) + (x2 < x7)
        + (x3 < x4) + (x3 < x5) + (x3 < x6) + (x3 < x7)
        + (x4 < x5) + (x4 < x6) + (x4 < x7)
        + (x5 < x6) + (x5 < x7)
        + (x6 < x7)
    )  # fmt: skip
    x0, x2 = _cx(x0, x2)
    x1, x3 = _cx(x1, x3)
    x4, x6 = _cx(x4, x6)
    x5, x7 = _cx(x5, x7)
    x0, x4 = _cx(x0, x4)
    x1, x5 = _cx(x1, x5)
    x2, x6 = _cx(x2, x6)
    x3, x7 = _cx(x3, x7)
    x0, x1 = _cx(x0, x1)
    x2, x3 = _cx(x2, x3)
    x4, x5 = _cx(x4, x5)
    x6, x7 = _cx(x6, x7)
    x2, x4 = _cx(x2, x4)
    x3, x5 = _cx(x3, x5)
    x1, x4 = _cx(x1, x4)
    x3, x6 = _cx(x3, x6)
    x1, x2 = _cx(x1, x2)
    x3, x4 = _cx(x3, x4)
    x5, x6 = _cx(x5, x6)
    x[lo], x[lo + 1], x[lo + 2], x[lo + 3] = x0, x1, x2, x3
    x[lo + 4], x[lo + 5], x[lo + 6], x[lo + 7] = x4, x5, x6, x7
    return less


@numba.njit(cache=True, nogil=True)
def _sort_runs(x, lo, hi):  # pragma: no cover - compiled
    """Sort ``x[lo:hi]`` in runs of 8 (the last may be shorter); return the pairs
    #{j < k: x_j < x_k} inside each run, summed."""
    less = 0
    full = lo + (hi - lo) // 8 * 8
    for start in range(lo, full, 8):
        less += _sort8(x, start)
    for k in range(full, hi):  # the short run: count, then insertion sort
        for j in range(full, k):
            less += x[j] < x[k]
    for k in range(full + 1, hi):
        value, j = x[k], k
        while j > full and x[j - 1] > value:
            x[j] = x[j - 1]
            j -= 1
        x[j] = value
    return less


@numba.njit(cache=True, nogil=True)
def _merge(src, dst, i, mid, j, hi):  # pragma: no cover - compiled
    """Merge the sorted runs ``src[i:mid]`` and ``src[j:hi]`` into ``dst[i + j - mid:]``; return
    the pairs (left, right) with left < right. Branch-free step: when the left head is smaller
    than the right head it is smaller than every remaining right element."""
    one = _u64(1)
    increasing = _u64(0)
    o = i + j - mid
    while i < mid and j < hi:
        left, right = src[i], src[j]
        take_left = _u64(left < right)
        increasing += (hi - j) * take_left
        dst[o] = min(left, right)
        i += take_left
        j += one - take_left
        o += one
    while i < mid:
        dst[o] = src[i]
        i += one
        o += one
    while j < hi:
        dst[o] = src[j]
        j += one
        o += one
    return increasing


@numba.njit(cache=True, nogil=True)
def _merge_sort_two(src, dst, na, nb):  # pragma: no cover - compiled
    """Finish sorting rows a = ``src[:na]`` and b = ``src[na:na+nb]``, each sorted in runs of 8,
    bottom-up, alternating with the buffer ``dst``; return (the buffer now holding both sorted
    rows, a's increasing pairs across runs, b's).

    At each width the two rows' merges at the same offset run in one loop: two independent
    dependency chains. The loop runs in stretches of ``k`` steps that cannot exhaust any run,
    so it needs no bounds checks; a row's leftover is finished alone.
    """
    one = _u64(1)
    inc_a, inc_b = _u64(0), _u64(0)
    n = max(na, nb)
    width = _u64(8)
    while width < n:
        step = width + width  # 2 * width would turn a uint64 into a float64
        lo = _u64(0)
        while lo < n:
            ia, mid_a, hi_a = min(lo, na), min(lo + width, na), min(lo + step, na)
            ib, mid_b, hi_b = (
                na + min(lo, nb),
                na + min(lo + width, nb),
                na + min(lo + step, nb),
            )
            ja, jb = mid_a, mid_b
            start_a, start_b = ia, ib
            taken_a, taken_b = _u64(0), _u64(0)  # sums of the right index at each left take
            while True:
                k = min(min(mid_a - ia, hi_a - ja), min(mid_b - ib, hi_b - jb))
                if k == 0:
                    break
                for _ in range(k):
                    left_a, right_a, left_b, right_b = src[ia], src[ja], src[ib], src[jb]
                    take_a, take_b = _u64(left_a < right_a), _u64(left_b < right_b)
                    dst[ia + ja - mid_a] = min(left_a, right_a)
                    dst[ib + jb - mid_b] = min(left_b, right_b)
                    taken_a += ja * take_a
                    taken_b += jb * take_b
                    ia, ja = ia + take_a, ja + one - take_a
                    ib, jb = ib + take_b, jb + one - take_b
            # each left take at right index j counts the hi - j right elements above it
            inc_a += hi_a * (ia - start_a) - taken_a + _merge(src, dst, ia, mid_a, ja, hi_a)
            inc_b += hi_b * (ib - start_b) - taken_b + _merge(src, dst, ib, mid_b, jb, hi_b)
            lo += step
        src, dst = dst, src
        width = step
    return src, inc_a, inc_b


@numba.njit(cache=True, nogil=True)
def _ties(x, lo, hi):  # pragma: no cover - compiled
    """Tied pairs in the sorted ``x[lo:hi]``."""
    ties = 0
    run = 0
    for t in range(lo + 1, hi):
        run = run + 1 if x[t] == x[t - 1] else 0
        ties += run
    return ties


@numba.njit(cache=True, parallel=True)
def _pair_counts(rows, lengths, key_type):  # pragma: no cover - compiled
    """Per row r: increasing and tied pairs among its first ``lengths[r]`` entries, and whether
    those hold a NaN; rows go two at a time (an odd last row with an empty partner)."""
    R = rows.shape[0]
    increasing = np.zeros(R, np.int64)
    ties = np.zeros(R, np.int64)
    nan = np.zeros(R, np.bool_)
    for p in numba.prange((R + 1) // 2):
        a, b = 2 * p, min(2 * p + 1, R - 1)
        na = lengths[a]
        nb = lengths[b] if b != a else 0
        keys = np.empty(na + nb, key_type)
        nan_a = _to_keys(rows[a, :na], keys[:na], key_type)
        nan_b = _to_keys(rows[b, :nb], keys[na:], key_type)
        within_a, within_b = _sort_runs(keys, 0, na), _sort_runs(keys, na, na + nb)
        keys, across_a, across_b = _merge_sort_two(keys, np.empty_like(keys), _u64(na), _u64(nb))
        increasing[a], ties[a], nan[a] = within_a + across_a, _ties(keys, 0, na), nan_a
        if b != a:
            increasing[b], ties[b], nan[b] = within_b + across_b, _ties(keys, na, na + nb), nan_b
    return increasing, ties, nan


class PairCounts(NamedTuple):
    """Per row: #{j < k < n: x_j < x_k}, #{j < k < n: x_j == x_k}, and whether x[:n] has a NaN."""

    less: np.ndarray
    equal: np.ndarray
    nan: np.ndarray


def pair_counts(rows: np.ndarray, lengths: np.ndarray) -> PairCounts:
    """Count the ordered and tied pairs of each row's first ``lengths[row]`` entries.

    ``rows`` is (R, T) float (float32 is kept, anything else becomes float64); ``lengths`` is
    (R,) int. Exact, O(n log n) per row. The counts of a row flagged in ``nan`` are meaningless.
    """
    rows = np.ascontiguousarray(rows, dtype=np.float32 if rows.dtype == np.float32 else np.float64)
    key_type = np.dtype(np.int32 if rows.dtype == np.float32 else np.int64)
    return PairCounts(*_pair_counts(rows, np.ascontiguousarray(lengths, dtype=np.int64), key_type))


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
    s = _to_numpy(rows)
    B, R, C = s.shape
    counts = pair_counts(s.reshape(B * R, C), np.tile(np.arange(first_row, first_row + R), B))
    return AdjacencyCounts(
        counts.less.reshape(B, R).sum(axis=1),
        counts.equal.reshape(B, R).sum(axis=1),
        counts.nan.reshape(B, R).any(axis=1),
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
    x = -_to_numpy(norms)
    B, T = x.shape
    counts = pair_counts(x, np.full(B, T))
    return _pair_scores(counts.less, counts.equal, T * (T - 1) // 2, counts.nan)


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
