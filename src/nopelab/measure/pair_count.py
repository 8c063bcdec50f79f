"""Exact pair counts of rows: ``#{j < k < n: x_j < x_k}`` and ``#{j < k < n: x_j == x_k}``.

The adjacency score needs them for every row of every similarity matrix at every site, so this is
the hot loop of the statistics. Counting sorts each row and counts, at each merge of two sorted
halves L and R, the pairs (l, r) with l < r.

**Eight rows at once.** Rows go in groups of eight, one per lane of a SIMD vector: element p of
the eight rows is one 8-vector (a "vertical" layout), so every compare-exchange of a bitonic
sorting network sorts eight rows in one vector min and one vector max. The network is
data-independent, which is what lets eight rows share it; the compare-exchange and the counting
passes are LLVM vector code written through numba intrinsics.

**Counting inside a network.** Each float becomes an order-preserving integer key, doubled: the
spare low bit is a *tag*. Before each merge stage the tag is set to 1 in the left half of every
block and 0 in the right half; a right element then sorts before an equal left element. After the
merge a right element at position p of its block with q right elements before it has exactly
p - q left elements strictly below it, so a block adds ``sum(p over right elements) - C(n_R, 2)``
increasing pairs. Rows are padded with a key above every real one; positions past a row's length
hold padding after every stage and are left out of the sums. Ties are counted once, at the end.

**Complexity.** The network sorts runs of up to ``NETWORK_MAX`` = 4096 with O(r log^2 r)
compare-exchanges each; longer rows finish with scalar merges, so a row of n costs O(n log n) as
n grows and a T x T matrix O(T^2 log T). Below that length the network wins anyway: one vector
instruction does eight rows' work, with no branches to mispredict.

**Key widths.** Cosine similarities lie in [-1, 1]: float32 values in (-2, 2) fit doubled in
32-bit keys, eight to a 256-bit vector. A group with a larger value, an infinity or a NaN uses
64-bit keys (twice the work, runs up to 512). float64 rows take a scalar merge sort.

**Weighted counts.** :func:`weighted_pair_counts` weights each increasing pair (j, k) by
``weights[k]`` (Zuo et al.'s pooled norm score). It is one row at a time: rank the row by
sorting, then walk it left to right with a Fenwick tree of the ranks seen so far, which gives
each k's count of earlier strictly smaller entries in O(log n): O(n log n) per row.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# OpenMP threads sleep between calls; numba's default workqueue layer contends with PyTorch's
# OpenMP pool and slowed the surrounding tensor ops several-fold in our measurements.
numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]  # type: ignore[attr-defined]

LANES = 8
NETWORK_MAX = 4096  # longest run the network sorts with 32-bit keys; a power of two
_WIDE_SHRINK = 8  # 64-bit keys: runs up to NETWORK_MAX / 8 (twice the work per element)
_NARROW_LIMIT = 0x3FFFFFFF  # float32 magnitude bits below this (|x| < 2) fit doubled in int32
_NARROW_PAD = 0x7FFFFFFF  # above every doubled, tagged int32 key of |x| < 2
_WIDE_PAD = 0x7FFFFFFFFFFFFFFF  # above every doubled, tagged int64 key of a float32
_I32 = ir.IntType(32)
_COUNTS = ir.VectorType(_I32, LANES)  # per-lane counts inside one pass


# ----------------------------------------------------------------------------- vector intrinsics
# ``v`` is a group: a C-contiguous (positions, 8) int32 or int64 array of keys, lane l holding
# row l. Every intrinsic treats position p as one vector; none checks bounds (callers pass arrays
# they allocated). Counts add up in int32 lanes within one pass (at
# most n * run / 2 < 2^31 for runs up to 2^15), then into an int64 array.


def _intp(context, builder, value, ty):
    return context.cast(builder, value, ty, types.intp)


def _vector(scalar_type):
    return ir.VectorType(scalar_type, LANES)


def _constant(scalar_type, value):
    return ir.Constant(_vector(scalar_type), [value] * LANES)


def _splat(builder, scalar):
    """A vector with ``scalar`` in every lane."""
    vector = _vector(scalar.type)
    one = builder.insert_element(ir.Constant(vector, None), scalar, _I32(0))
    return builder.shuffle_vector(one, one, _constant(_I32, 0))


class _Group:
    """Code generation helpers for one group argument."""

    def __init__(self, context, builder, array_type, array):
        self.builder = builder
        self.key = context.get_data_type(array_type.dtype)
        self.data = context.make_array(array_type)(context, builder, array).data

    def at(self, position):
        """Pointer to the vector at ``position`` (an intp)."""
        offset = self.builder.mul(position, ir.Constant(position.type, LANES))
        return self.builder.bitcast(
            self.builder.gep(self.data, [offset]), _vector(self.key).as_pointer()
        )

    def load(self, position):
        return self.builder.load(self.at(position), align=4)

    def constant(self, value):
        return _constant(self.key, value)


def _load_lengths(context, builder, array_type, array):
    """The eight row lengths (an int32 array) as one vector."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.load(builder.bitcast(data, _COUNTS.as_pointer()), align=4)


def _add_to(context, builder, array_type, array, counts):
    """``array[:8] += counts`` for an int64 array and an i32 count vector."""
    wide = _vector(ir.IntType(64))
    data = context.make_array(array_type)(context, builder, array).data
    pointer = builder.bitcast(data, wide.as_pointer())
    total = builder.add(builder.load(pointer, align=8), builder.sext(counts, wide))
    builder.store(total, pointer, align=8)


@intrinsic
def _compare_exchange(typingctx, v, a, b):
    """Lane-wise min of positions ``a`` and ``b`` of ``v`` into ``a``, max into ``b``."""

    def codegen(context, builder, sig, args):
        group = _Group(context, builder, sig.args[0], args[0])
        pa = group.at(_intp(context, builder, args[1], a))
        pb = group.at(_intp(context, builder, args[2], b))
        x, y = builder.load(pa, align=4), builder.load(pb, align=4)
        lower = builder.icmp_signed("<", x, y)
        builder.store(builder.select(lower, x, y), pa, align=4)
        builder.store(builder.select(lower, y, x), pb, align=4)
        return context.get_dummy_value()

    return types.void(v, a, b), codegen


@intrinsic
def _retag(typingctx, v, stop, block):
    """Set the tag (low bit) at positions p < ``stop``: 1 in the left half of every ``block``
    (a power of two), 0 in the right half."""

    def codegen(context, builder, sig, args):
        group = _Group(context, builder, sig.args[0], args[0])
        half = builder.lshr(builder.trunc(_intp(context, builder, args[2], block), _I32), _I32(1))
        with cgutils.for_range(builder, _intp(context, builder, args[1], stop)) as loop:
            left = builder.icmp_unsigned(
                "==", builder.and_(builder.trunc(loop.index, _I32), half), _I32(0)
            )
            tag = _splat(builder, builder.zext(left, group.key))
            untagged = builder.and_(group.load(loop.index), group.constant(-2))
            builder.store(builder.or_(untagged, tag), group.at(loop.index), align=4)
        return context.get_dummy_value()

    return types.void(v, stop, block), codegen


@intrinsic
def _tally_right(typingctx, v, stop, block, lengths, out):
    """``out[l] +=`` the sum of ``p % block`` over positions p < min(stop, lengths[l]) whose tag
    is 0 (``block`` a power of two)."""

    def codegen(context, builder, sig, args):
        group = _Group(context, builder, sig.args[0], args[0])
        lens = _load_lengths(context, builder, sig.args[3], args[3])
        mask = builder.sub(builder.trunc(_intp(context, builder, args[2], block), _I32), _I32(1))
        total = cgutils.alloca_once_value(builder, _constant(_I32, 0))
        with cgutils.for_range(builder, _intp(context, builder, args[1], stop)) as loop:
            p = builder.trunc(loop.index, _I32)
            tag = builder.and_(group.load(loop.index), group.constant(1))
            right = builder.icmp_signed("==", tag, group.constant(0))
            real = builder.icmp_signed("<", _splat(builder, p), lens)
            offset = _splat(builder, builder.and_(p, mask))
            term = builder.select(builder.and_(right, real), offset, _constant(_I32, 0))
            builder.store(builder.add(builder.load(total), term), total)
        _add_to(context, builder, sig.args[4], args[4], builder.load(total))
        return context.get_dummy_value()

    return types.void(v, stop, block, lengths, out), codegen


@intrinsic
def _tally_ties(typingctx, v, stop, lengths, out):
    """``out[l] +=`` the tied pairs among the sorted keys (tags dropped) at positions
    p < min(stop, lengths[l])."""

    def codegen(context, builder, sig, args):
        group = _Group(context, builder, sig.args[0], args[0])
        lens = _load_lengths(context, builder, sig.args[2], args[2])
        zero, one = _constant(_I32, 0), _constant(_I32, 1)
        run = cgutils.alloca_once_value(builder, zero)  # equal neighbours so far in this run
        total = cgutils.alloca_once_value(builder, zero)
        first = ir.Constant(cgutils.intp_t, 0)
        previous = cgutils.alloca_once_value(
            builder, builder.ashr(group.load(first), group.constant(1))
        )
        stop_ = _intp(context, builder, args[1], stop)
        with cgutils.for_range(builder, stop_, start=ir.Constant(cgutils.intp_t, 1)) as loop:
            x = builder.ashr(group.load(loop.index), group.constant(1))
            real = builder.icmp_signed("<", _splat(builder, builder.trunc(loop.index, _I32)), lens)
            tied = builder.and_(builder.icmp_signed("==", x, builder.load(previous)), real)
            count = builder.select(tied, builder.add(builder.load(run), one), zero)
            builder.store(count, run)
            builder.store(builder.add(builder.load(total), count), total)
            builder.store(x, previous)
        _add_to(context, builder, sig.args[3], args[3], builder.load(total))
        return context.get_dummy_value()

    return types.void(v, stop, lengths, out), codegen


# ----------------------------------------------------------------------------------- the network


@numba.njit(cache=True, nogil=True)
def _network_sort(v, lengths, run, out):  # pragma: no cover - compiled
    """Sort each run of ``run`` positions (a power of two) of the group ``v`` in place; add each
    lane's increasing pairs inside runs to ``out``."""
    longest = lengths.max()
    block = 2
    while block <= run:
        half = block // 2
        _retag(v, longest, block)  # type: ignore[call-arg]  # numba supplies typingctx
        for start in range(0, longest, block):
            if start + half >= longest:  # right half all padding: already sorted
                break
            for t in range(min(half, longest - start)):  # flip: merges two ascending halves
                _compare_exchange(v, start + t, start + block - 1 - t)
            step = half // 2
            while step >= 1:
                for sub in range(start, min(start + block, longest), 2 * step):
                    for t in range(step):
                        _compare_exchange(v, sub + t, sub + t + step)
                step //= 2
        _tally_right(v, longest, block, lengths, out)
        for lane in range(LANES):  # minus C(n_R, 2) per block: full blocks, then the partial one
            n = np.int64(lengths[lane])
            out[lane] -= (n // block) * (half * (half - 1) // 2)
            right = min(max(n % block - half, 0), half)
            out[lane] -= right * (right - 1) // 2
        block *= 2


@numba.njit(cache=True, nogil=True)
def _load_group(rows, lengths, v, nan):  # pragma: no cover - compiled
    """Write the doubled keys of up to eight float32 rows into the group ``v``, padded, and flag
    in ``nan`` the lanes holding a NaN. Return False, with ``v`` unusable, if ``v`` is int32 and
    a value is NaN or outside (-2, 2)."""
    narrow = v.itemsize == 4
    pad = _NARROW_PAD if narrow else _WIDE_PAD
    bits = rows.view(np.int32)
    for p in range(v.shape[0]):
        for lane in range(LANES):
            if p < lengths[lane]:
                b = bits[lane, p]
                magnitude = b & 0x7FFFFFFF
                if narrow and magnitude >= _NARROW_LIMIT:
                    return False
                nan[lane] |= magnitude > 0x7F800000
                sign = b >> 31  # 0 or -1; -0.0 and 0.0 both give 0
                v[p, lane] = np.int64((magnitude ^ sign) - sign) << 1
            else:
                v[p, lane] = pad
    return True


@numba.njit(cache=True, nogil=True)
def _count_group(v, lengths, run, increasing, ties):  # pragma: no cover - compiled
    """Sort a loaded group and write its lanes' counts into ``increasing`` and ``ties``."""
    _network_sort(v, lengths, run, increasing)
    longest = lengths.max()
    if run >= longest:
        _tally_ties(v, longest, lengths, ties)  # type: ignore[call-arg]  # numba supplies typingctx
        return
    for lane in range(LANES):  # runs of ``run`` are sorted: merge the rest, row by row
        keys, across = _merge_sort(v[: lengths[lane], lane] >> 1, run)
        increasing[lane] += across
        ties[lane] += _ties(keys)


# ------------------------------------------------------------------------------- scalar merges

_u64 = numba.uint64


@numba.njit(cache=True, nogil=True)
def _merge(src, dst, i, mid, j, hi):  # pragma: no cover - compiled
    """Merge the sorted ``src[i:mid]`` and ``src[j:hi]`` into ``dst[i + j - mid:]``; return the
    pairs (left, right) with left < right. Branch-free: when the left head is below the right
    head it is below every remaining right element."""
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
def _merge_sort(keys, width):  # pragma: no cover - compiled
    """Sort ``keys``, already sorted in runs of ``width``, by bottom-up merges; return the sorted
    array (``keys`` or a new one) and the increasing pairs across runs."""
    n = _u64(keys.shape[0])
    src, dst = keys, np.empty_like(keys)
    increasing = 0
    width = _u64(width)
    while width < n:
        for lo in range(_u64(0), n, width + width):
            mid, hi = min(lo + width, n), min(lo + width + width, n)
            increasing += _merge(src, dst, lo, mid, mid, hi)
        src, dst = dst, src
        width += width
    return src, increasing


@numba.njit(cache=True, nogil=True)
def _ties(x):  # pragma: no cover - compiled
    """Tied pairs in the sorted ``x``."""
    ties = 0
    run = 0
    for t in range(1, x.shape[0]):
        run = run + 1 if x[t] == x[t - 1] else 0
        ties += run
    return ties


@numba.njit(cache=True, nogil=True)
def _scalar_counts(row):  # pragma: no cover - compiled
    """(increasing pairs, tied pairs, has a NaN) of one float64 row, by a plain merge sort."""
    bits = row.view(np.int64)
    keys = np.empty(row.shape[0], np.int64)
    has_nan = False
    for t in range(row.shape[0]):
        sign = bits[t] >> 63  # 0 for positive, -1 for negative; -0.0 and 0.0 both give 0
        keys[t] = ((bits[t] & 0x7FFFFFFFFFFFFFFF) ^ sign) - sign
        has_nan |= row[t] != row[t]
    keys, increasing = _merge_sort(keys, 1)
    return increasing, _ties(keys), has_nan


# --------------------------------------------------------------------------------- the drivers


@numba.njit(cache=True, nogil=True)
def _run_length(longest, cap):  # pragma: no cover - compiled
    """The power of two the network sorts: the longest row's length rounded up, at most ``cap``."""
    run = 1
    while run < min(longest, cap):
        run *= 2
    return run


@numba.njit(cache=True, parallel=True)
def _counts_float32(rows, lengths, network_max, increasing, ties, nan):  # pragma: no cover
    """Fill the counts of float32 rows, eight at a time."""
    R = rows.shape[0]
    for g in numba.prange((R + LANES - 1) // LANES):
        first = g * LANES
        count = min(LANES, R - first)
        lens = np.zeros(LANES, np.int32)
        lens[:count] = lengths[first : first + count]
        longest = lens.max()
        group_increasing, group_ties = np.zeros(LANES, np.int64), np.zeros(LANES, np.int64)
        group_nan = np.zeros(LANES, np.bool_)
        run = _run_length(longest, network_max)
        narrow = np.empty((-(-longest // run) * run, LANES), np.int32)
        if _load_group(rows[first : first + count], lens, narrow, group_nan):
            _count_group(narrow, lens, run, group_increasing, group_ties)
        else:  # large values or NaN: 64-bit keys, which leave the cache sooner: shorter runs
            run = _run_length(longest, network_max // _WIDE_SHRINK)
            wide = np.empty((-(-longest // run) * run, LANES), np.int64)
            _load_group(rows[first : first + count], lens, wide, group_nan)
            _count_group(wide, lens, run, group_increasing, group_ties)
        increasing[first : first + count] = group_increasing[:count]
        ties[first : first + count] = group_ties[:count]
        nan[first : first + count] = group_nan[:count]


@numba.njit(cache=True, parallel=True)
def _counts_float64(rows, lengths, increasing, ties, nan):  # pragma: no cover - compiled
    """Fill the counts of float64 rows, one at a time."""
    for r in numba.prange(rows.shape[0]):
        increasing[r], ties[r], nan[r] = _scalar_counts(rows[r, : lengths[r]])


class PairCounts(NamedTuple):
    """Per row: #{j < k < n: x_j < x_k}, #{j < k < n: x_j == x_k}, and whether x[:n] has a NaN."""

    less: np.ndarray
    equal: np.ndarray
    nan: np.ndarray


def _threads_as_torch() -> None:
    """numba on as many threads as PyTorch. With the OpenMP layer both drive one OpenMP pool:
    starting numba's resizes that pool to numba's default, which would change the thread count
    (and with it the rounding) of every tensor operation that follows."""
    import torch

    threads = torch.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    if torch.get_num_threads() != threads:  # numba's pool has just started
        torch.set_num_threads(threads)


def pair_counts(
    rows: np.ndarray, lengths: np.ndarray, network_max: int = NETWORK_MAX
) -> PairCounts:
    """Count the ordered and tied pairs of each row's first ``lengths[row]`` entries.

    ``rows`` is (R, T) float (float32 is kept, anything else becomes float64); ``lengths`` is
    (R,) int. Exact, O(n log n) per row. The counts of a row flagged in ``nan`` are meaningless.
    ``network_max`` (a power of two up to 2^15) caps the runs the sorting network sorts; tests
    lower it to exercise the merges that follow.
    """
    if network_max & (network_max - 1) or not 1 <= network_max <= 2**15:
        raise ValueError(f"network_max must be a power of two in [1, 32768], got {network_max}")
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    R = len(lengths)
    _threads_as_torch()
    counts = PairCounts(np.zeros(R, np.int64), np.zeros(R, np.int64), np.zeros(R, np.bool_))
    if rows.dtype == np.float32:
        _counts_float32(np.ascontiguousarray(rows), lengths, network_max, *counts)
    else:
        _counts_float64(np.ascontiguousarray(rows, dtype=np.float64), lengths, *counts)
    return counts


# ----------------------------------------------------------------------- position-weighted counts


@numba.njit(cache=True, nogil=True)
def _weighted_less(row, weights):  # pragma: no cover - compiled
    """(sum over j < k with row[j] < row[k] of weights[k], has a NaN) of one row."""
    n = row.shape[0]
    for t in range(n):
        if row[t] != row[t]:
            return 0, True
    order = np.argsort(row)
    ranks = np.empty(n, np.int64)  # 1-based dense ranks: equal values share one
    distinct = 0
    for p in range(n):
        if p == 0 or row[order[p]] != row[order[p - 1]]:
            distinct += 1
        ranks[order[p]] = distinct
    tree = np.zeros(distinct + 1, np.int64)  # Fenwick tree: how many earlier entries per rank
    total = 0
    for k in range(n):
        below = 0  # earlier entries of a strictly smaller rank: ranks 1 .. ranks[k] - 1
        i = ranks[k] - 1
        while i > 0:
            below += tree[i]
            i -= i & -i
        total += below * weights[k]
        i = ranks[k]
        while i <= distinct:
            tree[i] += 1
            i += i & -i
    return total, False


@numba.njit(cache=True, nogil=True)
def _weighted_counts(rows, weights, less, nan):  # pragma: no cover - compiled
    for r in range(rows.shape[0]):
        less[r], nan[r] = _weighted_less(rows[r], weights)


def weighted_pair_counts(rows: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of (R, n) ``rows``: ``sum over j < k with x_j < x_k of weights[k]`` (ties count
    nothing) as int64, and whether the row has a NaN (its sum is then 0 and meaningless).

    ``weights`` is (n,) int. Exact, O(n log n) per row; ``-0.0`` equals ``0.0``.
    """
    rows = np.ascontiguousarray(rows)
    if rows.dtype != np.float32:
        rows = rows.astype(np.float64)
    weights = np.ascontiguousarray(weights, dtype=np.int64)
    if weights.shape != rows.shape[1:]:
        raise ValueError(f"weights of shape {weights.shape} for rows of shape {rows.shape}")
    less, nan = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.bool_)
    _weighted_counts(rows, weights, less, nan)
    return less, nan
