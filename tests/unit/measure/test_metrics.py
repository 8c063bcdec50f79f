"""The metrics (docs/metrics.md) against independent brute-force counts and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nopelab.measure.metrics import (
    AdjacencyCounts,
    adjacency_counts,
    adjacency_score,
    adjacency_score_bruteforce,
    cosine_by_distance,
    cosine_matrix,
    cosine_row_blocks,
    lower_triangle_sums,
    norm_score,
    norm_score_zuo,
    pair_counts,
    position_variance,
    symmetric_from_lower,
)
from nopelab.measure.pair_count import NETWORK_MAX

HYPO = settings(max_examples=60, deadline=None)

# ---------------------------------------------------------------- brute-force references


def triple_loop_adjacency(s: np.ndarray) -> tuple[float, float]:
    """Pure-python count over every triple j < k < i of one (T, T) matrix: (A, signed)."""
    T = len(s)
    concordant = discordant = tied = 0
    for i in range(T):
        for j in range(i):
            for k in range(j + 1, i):
                near, far = float(s[i][k]), float(s[i][j])
                if near > far:
                    concordant += 1
                elif near < far:
                    discordant += 1
                else:
                    tied += 1
    pairs = concordant + discordant + tied
    assert pairs == math.comb(T, 3)
    return concordant / pairs, (concordant - discordant) / pairs


def loop_pair_counts(row: np.ndarray, n: int) -> tuple[int, int]:
    """#{j < k < n: x_j < x_k} and #{j < k < n: x_j == x_k} by double loop."""
    less = equal = 0
    for j in range(n):
        for k in range(j + 1, n):
            less += bool(row[j] < row[k])
            equal += bool(row[j] == row[k])
    return less, equal


def loop_norm_score(norms: np.ndarray) -> tuple[float, float]:
    """Fraction of pairs j < k with ||h_k|| < ||h_j|| (and the signed form), by double loop."""
    T = len(norms)
    shrink = grow = 0
    for j in range(T):
        for k in range(j + 1, T):
            shrink += bool(norms[k] < norms[j])
            grow += bool(norms[k] > norms[j])
    pairs = T * (T - 1) // 2
    return shrink / pairs, (shrink - grow) / pairs


def triple_loop_norm_score_zuo(norms: np.ndarray) -> float:
    """Zuo et al.'s pooled count, literally: rows i = 1..T (1-based), pairs j < k < i with
    ||h_k|| < ||h_j|| (ties fail), summed and divided by sum_i C(i - 1, 2)."""
    T = len(norms)
    hits = pairs = 0
    for i in range(1, T + 1):
        for k in range(1, i):
            for j in range(1, k):
                hits += bool(norms[k - 1] < norms[j - 1])
                pairs += 1
    assert pairs == sum(math.comb(i - 1, 2) for i in range(1, T + 1)) == math.comb(T, 3)
    return hits / pairs


# --------------------------------------------------------------------------- strategies

# Few distinct values force many ties; float32-exact values so the kernel's dtype is irrelevant.
FEW_VALUES = st.sampled_from([-1.0, -0.5, 0.0, 0.25, 1.0])
FLOAT32 = st.floats(-1, 1, width=32, allow_nan=False)


@st.composite
def similarity_batches(draw: st.DrawFn, elements: st.SearchStrategy[float]) -> np.ndarray:
    B = draw(st.integers(1, 3))
    T = draw(st.integers(3, 9))
    return draw(arrays(np.float64, (B, T, T), elements=elements))


# ------------------------------------------------------------------ adjacency: exact counts


@HYPO
@given(similarity_batches(FEW_VALUES))
def test_adjacency_matches_triple_loop_with_ties(s: np.ndarray) -> None:
    fast, brute = adjacency_score(s), adjacency_score_bruteforce(s)
    for b in range(len(s)):
        score, signed = triple_loop_adjacency(s[b])
        assert fast.score[b] == pytest.approx(score, abs=1e-12)
        assert fast.signed[b] == pytest.approx(signed, abs=1e-12)
        assert brute.score[b] == pytest.approx(score, abs=1e-12)
        assert brute.signed[b] == pytest.approx(signed, abs=1e-12)


@HYPO
@given(similarity_batches(FLOAT32))
def test_adjacency_matches_triple_loop_continuous(s: np.ndarray) -> None:
    fast = adjacency_score(torch.from_numpy(s).float())  # torch input path
    for b in range(len(s)):
        score, signed = triple_loop_adjacency(s[b])
        assert fast.score[b] == pytest.approx(score, abs=1e-12)
        assert fast.signed[b] == pytest.approx(signed, abs=1e-12)


def test_adjacency_only_uses_entries_below_the_diagonal() -> None:
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 12, 12))
    changed = s.copy()
    changed[:, np.triu_indices(12)[0], np.triu_indices(12)[1]] = rng.standard_normal(78)
    np.testing.assert_array_equal(adjacency_score(s).score, adjacency_score(changed).score)


def test_adjacency_perfect_reversed_and_constant() -> None:
    T = 10
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    nearer_more_similar = -np.abs(i - j).astype(float)[None]
    res = adjacency_score(nearer_more_similar)
    assert res.score[0] == 1.0 and res.signed[0] == 1.0
    res = adjacency_score(-nearer_more_similar)
    assert res.score[0] == 0.0 and res.signed[0] == -1.0
    res = adjacency_score(np.ones((1, T, T)))  # all ties: failures for A, zero for signed
    assert res.score[0] == 0.0 and res.signed[0] == 0.0


def test_adjacency_keeps_float64_resolution() -> None:
    """Entries that differ only beyond float32 precision must not become ties."""
    T = 8
    j = np.arange(T)
    s = np.broadcast_to(1.0 - 1e-10 * (T - j), (1, T, T)).copy()  # S_ij increases with j
    assert adjacency_score(s).score[0] == 1.0
    assert adjacency_score(torch.from_numpy(s)).score[0] == 1.0


# ------------------------------------------------------------- adjacency: statistical laws


def test_iid_gaussian_vectors_score_one_half() -> None:
    """For i.i.d. vectors S_ij and S_ik (j < k < i) are exchangeable and ties have probability 0,
    so E[A] = 1/2 and E[signed] = 0 exactly. Tolerance: 4 standard errors of the mean over
    samples (std over samples / sqrt(B))."""
    gen = torch.Generator().manual_seed(0)
    B, T, d = 400, 32, 64
    res = adjacency_score(cosine_matrix(torch.randn(B, T, d, generator=gen)))
    se = res.score.std(ddof=1) / math.sqrt(B)
    assert 0.005 < res.score.std() < 0.05  # per-sample scores do vary
    assert abs(res.score.mean() - 0.5) < 4 * se
    assert abs(res.signed.mean()) < 4 * res.signed.std(ddof=1) / math.sqrt(B)
    np.testing.assert_allclose(res.signed, 2 * res.score - 1, atol=1e-12)  # no ties


def cumulative_means(x: torch.Tensor) -> torch.Tensor:
    """y_m = (1/m) sum_{i<=m} x_i along dim 1 (uniform causal attention)."""
    m = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)
    return x.cumsum(dim=1) / m[:, None]


def test_cumulative_means_of_orthogonal_vectors_score_exactly_one() -> None:
    """For orthogonal x_l (any nonzero norms), with N_m = sum_{l<=m} ||x_l||^2,
    cos(y_i, y_j) = sqrt(N_j / N_i) for j <= i: strictly increasing in j, so A = 1 exactly.
    ||y_m|| = sqrt(N_m) / m strictly decreases when the norms are equal (then the norm score
    is 1), but not for arbitrary norms: a long x_{m+1} can lengthen the mean."""
    T, d = 24, 40
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    norms = 0.5 + torch.rand(2, T, generator=gen, dtype=torch.float64)
    x = basis[:T][None] * norms[..., None]  # (2, T, d), rows orthogonal
    y = cumulative_means(x)
    s = cosine_matrix(y)
    n = (norms**2).cumsum(dim=1)
    expected = (
        torch.minimum(n[:, :, None], n[:, None]) / torch.maximum(n[:, :, None], n[:, None])
    ).sqrt()
    torch.testing.assert_close(s, expected, atol=1e-12, rtol=0)
    res = adjacency_score(s)
    np.testing.assert_array_equal(res.score, [1.0, 1.0])
    np.testing.assert_array_equal(res.signed, [1.0, 1.0])
    equal_norms = cumulative_means(basis[:T][None] * 0.7)
    np.testing.assert_array_equal(adjacency_score(cosine_matrix(equal_norms)).score, [1.0])
    np.testing.assert_array_equal(norm_score(equal_norms.norm(dim=-1)).score, [1.0])


def test_cumulative_means_of_gaussians_approach_one_only_as_d_grows() -> None:
    """Closed forms say cumulative means give A = 1; for i.i.d. Gaussian x at finite d this
    holds only in the limit (the vectors are merely nearly orthogonal). Measured (seeded,
    T = 32, 64 samples): mean A ≈ 0.79 at d=4, 0.93 at d=16, 0.985 at d=64, ≈ 1 at d=1024.
    Bounds below leave a margin of more than 5 standard errors around those values."""
    gen = torch.Generator().manual_seed(0)
    T, B = 32, 64
    means = {}
    for d in (4, 16, 64, 1024):
        res = adjacency_score(cosine_matrix(cumulative_means(torch.randn(B, T, d, generator=gen))))
        means[d] = res.score.mean()
        if d <= 64:
            assert res.score.min() < 1.0  # not exactly 1 at finite d
    assert 0.70 < means[4] < 0.88
    assert 0.90 < means[16] < 0.97
    assert 0.97 < means[64] < 0.995
    assert means[1024] > 0.998
    assert means[4] < means[16] < means[64] < means[1024]


def test_cumulative_means_mean_cosine_is_sqrt_ratio() -> None:
    """E cos(y_i, y_j) -> sqrt(min/max) as d grows. d=2048, 32 samples: per-entry std of the
    cosine is ≤ 0.03, so the sample mean is within ~0.005 plus an O(1/d) bias; tolerance 0.02."""
    gen = torch.Generator().manual_seed(1)
    T, d, B = 16, 2048, 32
    s = cosine_matrix(cumulative_means(torch.randn(B, T, d, generator=gen, dtype=torch.float64)))
    m = torch.arange(1, T + 1, dtype=torch.float64)
    expected = (torch.minimum(m[:, None], m[None]) / torch.maximum(m[:, None], m[None])).sqrt()
    torch.testing.assert_close(s.mean(dim=0), expected, atol=0.02, rtol=0)
    assert (s.mean(dim=0) - expected).abs().max() > 1e-4  # a statistical, not an exact, law


# --------------------------------------------------------------------- norm score, counts


@HYPO
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(2, 12)),
        elements=st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0]),
    )
)
def test_norm_score_matches_pair_loop(norms: np.ndarray) -> None:
    res = norm_score(norms)
    for b in range(len(norms)):
        score, signed = loop_norm_score(norms[b])
        assert res.score[b] == pytest.approx(score, abs=1e-12)
        assert res.signed[b] == pytest.approx(signed, abs=1e-12)


def test_norm_score_direction() -> None:
    shrinking = np.array([[5.0, 4.0, 3.0, 2.0, 1.0]])
    assert norm_score(shrinking).score[0] == 1.0 and norm_score(shrinking).signed[0] == 1.0
    assert norm_score(shrinking[:, ::-1].copy()).score[0] == 0.0
    assert norm_score(torch.ones(1, 5)).score[0] == 0.0  # ties fail


# ------------------------------------------------------------ Zuo et al.'s pooled norm score


@HYPO
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(3, 14)),
        elements=st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0]),
    )
)
def test_norm_score_zuo_matches_triple_loop_with_ties(norms: np.ndarray) -> None:
    res = norm_score_zuo(norms)
    assert res.shape == (len(norms),)
    for b in range(len(norms)):
        assert res[b] == pytest.approx(triple_loop_norm_score_zuo(norms[b]), abs=1e-12)


@HYPO
@given(
    arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(3, 14)),
        elements=st.floats(0, 10, width=32, allow_nan=False),
    )
)
def test_norm_score_zuo_matches_triple_loop_continuous(norms: np.ndarray) -> None:
    res = norm_score_zuo(torch.from_numpy(norms))  # torch, float32 input path
    for b in range(len(norms)):
        assert res[b] == pytest.approx(triple_loop_norm_score_zuo(norms[b]), abs=1e-12)


def test_norm_score_zuo_direction_and_ties() -> None:
    shrinking = np.array([[5.0, 4.0, 3.0, 2.0, 1.0]])
    assert norm_score_zuo(shrinking)[0] == 1.0
    assert norm_score_zuo(shrinking[:, ::-1].copy())[0] == 0.0
    assert norm_score_zuo(torch.ones(1, 5))[0] == 0.0  # ties fail
    assert norm_score_zuo(np.array([[2.0, 2.0, 1.0, 1.0]]))[0] == 0.5  # by hand: 2 of 4


def test_norm_score_zuo_weights_early_pairs() -> None:
    """Both rows have one shrinking pair of six, so the plain norm score is 1/6 for both.
    Zuo's pooled count, by hand (T = 4, denominator sum_i C(i - 1, 2) = 0 + 0 + 1 + 3 = 4):
    [2, 1, 3, 4]: the pair (1, 2) shrinks and is read by rows i = 3 and 4: 2/4 = 1/2;
    [1, 2, 4, 3]: the pair (3, 4) shrinks but no row i > 4 reads it: 0/4 = 0."""
    norms = np.array([[2.0, 1.0, 3.0, 4.0], [1.0, 2.0, 4.0, 3.0]])
    np.testing.assert_allclose(norm_score(norms).score, [1 / 6, 1 / 6], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(norm_score_zuo(norms), [0.5, 0.0])


def test_norm_score_zuo_pools_the_plain_score_of_every_prefix() -> None:
    """Row i reads the first i - 1 norms, so Zuo's score is the C(i - 1, 2)-weighted mean of
    the plain norm score of those prefixes (an independent path: the unweighted pair counter).
    Long rows with many ties, float32 and float64."""
    rng = np.random.default_rng(5)
    T = 300
    for norms in (
        rng.integers(0, 20, size=(3, T)).astype(np.float32),
        np.abs(rng.standard_normal((3, T))) + np.linspace(1, 0, T),
    ):
        pooled = sum(
            math.comb(i - 1, 2) * norm_score(norms[:, : i - 1]).score for i in range(3, T + 1)
        )
        np.testing.assert_allclose(norm_score_zuo(norms), pooled / math.comb(T, 3), rtol=1e-12)


def test_norm_score_zuo_keeps_float64_resolution_and_nan_per_sample() -> None:
    shrinking = 1.0 + 1e-12 * np.arange(8.0)[::-1]  # a tie in float32
    assert norm_score_zuo(shrinking[None].copy())[0] == 1.0
    norms = np.abs(np.random.default_rng(0).standard_normal((3, 9)))
    clean = norm_score_zuo(norms)
    norms[0, 4] = np.nan
    norms[2, 8] = np.nan  # last position: weight 0, yet NaN like the plain norm score
    res = norm_score_zuo(norms)
    assert np.isnan(res[0]) and np.isnan(res[2]) and res[1] == clean[1]
    assert np.isnan(norm_score(norms).score[2])


@st.composite
def rows_and_lengths(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Up to 20 rows (several groups of eight) with ties, signed zeros, values inside and
    outside (-2, 2) (32- and 64-bit keys), infinities and NaN."""
    R = draw(st.integers(1, 20))
    T = draw(st.integers(1, 40))
    extra = draw(st.sampled_from([[], [7.5], [7.5, -np.inf, np.inf], [np.nan]]))
    values = [-1.5, -0.0, 0.0, 0.25, 1.0, *extra]
    rows = draw(arrays(np.float64, (R, T), elements=st.sampled_from(values)))
    lengths = draw(arrays(np.int64, (R,), elements=st.integers(0, T)))
    return rows, lengths


@HYPO
@given(rows_and_lengths(), st.sampled_from([np.float32, np.float64]), st.sampled_from([2, 8]))
def test_pair_counts_match_double_loop(
    data: tuple[np.ndarray, np.ndarray], dtype: type, network_max: int
) -> None:
    """Every path: 32/64-bit keys, runs of 2 or 8 then merges, the float64 merge sort."""
    rows, lengths = data
    rows = rows.astype(dtype)
    before = rows.copy()
    for cap in (network_max, NETWORK_MAX):
        less, equal, nan = pair_counts(rows, lengths, cap)
        for r in range(len(rows)):
            n = int(lengths[r])
            assert nan[r] == np.isnan(rows[r, :n]).any()
            if not nan[r]:  # a NaN row's counts are meaningless; its neighbours' are exact
                assert (less[r], equal[r]) == loop_pair_counts(rows[r], n)
    np.testing.assert_array_equal(rows, before)  # input is not sorted in place


@pytest.mark.parametrize("values", ["ties", "cosines", "wide"])
@pytest.mark.parametrize("network_max", [16, NETWORK_MAX])
def test_pair_counts_long_rows(values: str, network_max: int) -> None:
    """Rows of up to 700 in one group, lengths off every power of two; with a cap of 16 the
    network sorts runs of 16 (64-bit keys: 2) and merges finish them."""
    rng = np.random.default_rng(3)
    shape = (9, 700)
    rows = {
        "ties": rng.integers(-8, 8, size=shape) / 8,
        "cosines": np.tanh(rng.standard_normal(shape)),
        "wide": 100 * rng.standard_normal(shape),
    }[values].astype(np.float32)
    lengths = np.array([700, 1, 0, 257, 128, 513, 699, 2, 300])
    less, equal, _ = pair_counts(rows, lengths, network_max)
    for r in range(len(rows)):
        n = lengths[r]
        x = rows[r, :n].astype(np.float64)
        upper = np.triu(np.ones((n, n), dtype=bool), k=1)
        assert less[r] == ((x[:, None] < x[None, :]) & upper).sum()
        assert equal[r] == ((x[:, None] == x[None, :]) & upper).sum()


def test_pair_counts_every_zero_one_row() -> None:
    """By the 0-1 principle, a comparator network that sorts every 0-1 input sorts every input:
    all 2^n rows of 0s and 1s for n = 1..10, grouped with other lengths."""
    rows, lengths = [], []
    for n in range(1, 11):
        for code in range(2**n):
            rows.append([(code >> bit) & 1 for bit in range(n)] + [0] * (10 - n))
            lengths.append(n)
    rows = np.array(rows, dtype=np.float32) - 0.5
    for network_max in (2, 4, 16):
        less, equal, _ = pair_counts(rows, np.array(lengths), network_max)
        for r in range(len(rows)):
            assert (less[r], equal[r]) == loop_pair_counts(rows[r], lengths[r])


def test_pair_counts_float64_keeps_differences_below_float32_precision() -> None:
    rows = np.array([[1.0, 1.0 + 1e-12, 1.0, -1e-300, 0.0]])
    less, equal, _ = pair_counts(rows, np.array([5]))
    assert (less[0], equal[0]) == loop_pair_counts(rows[0], 5) == (2, 1)


def test_nan_gives_nan_score_for_its_sample_only() -> None:
    rng = np.random.default_rng(0)
    s = rng.standard_normal((3, 12, 12))
    clean = adjacency_score(s)
    s[1, 7, 2] = np.nan  # below the diagonal: read by the score
    s[2, 2, 7] = np.nan  # above it: never read
    res = adjacency_score(s)
    assert np.isnan(res.score[1]) and np.isnan(res.signed[1])
    np.testing.assert_array_equal(res.score[[0, 2]], clean.score[[0, 2]])
    norms = np.abs(rng.standard_normal((2, 9)))
    norms[0, 4] = np.nan
    by_norm = norm_score(norms)
    assert np.isnan(by_norm.score[0]) and not np.isnan(by_norm.score[1])


# ----------------------------------------------------------- cosine, variance, distance


def test_cosine_matrix_direct_formula() -> None:
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, 7, 5))
    h[1, 2] = 0.0  # a zero vector gives cosine 0
    s = cosine_matrix(torch.from_numpy(h)).numpy()
    for b in range(3):
        for i in range(7):
            for j in range(7):
                ni, nj = np.sqrt(h[b, i] @ h[b, i]), np.sqrt(h[b, j] @ h[b, j])
                expected = 0.0 if ni == 0 or nj == 0 else (h[b, i] @ h[b, j]) / (ni * nj)
                assert s[b, i, j] == pytest.approx(expected, abs=1e-12)
    assert np.allclose(np.diagonal(s[0]), 1.0, atol=1e-12)


def test_cosine_matrix_scale_invariance() -> None:
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64)
    scale = torch.rand(2, 6, 1, generator=gen, dtype=torch.float64) * 100 + 0.01
    torch.testing.assert_close(cosine_matrix(h * scale), cosine_matrix(h), atol=1e-12, rtol=0)


def test_position_variance_direct_formula() -> None:
    rng = np.random.default_rng(1)
    h = rng.standard_normal((2, 5, 9)) * 3 + 1
    v = position_variance(torch.from_numpy(h)).numpy()
    for b in range(2):
        for t in range(5):
            row = h[b, t]
            mean = sum(row) / len(row)
            assert v[b, t] == pytest.approx(sum((x - mean) ** 2 for x in row) / len(row), rel=1e-12)


def test_position_variance_of_cumulative_means_shrinks_like_one_over_m() -> None:
    """x ~ N(0, σ²) i.i.d.: E v_m = σ²/m · (d−1)/d (the mean over coordinates is subtracted).
    With B·d = 65536 coordinates per position the relative sampling error is about
    sqrt(2/(B·d)) ≈ 0.6%; tolerance 4%."""
    gen = torch.Generator().manual_seed(2)
    B, T, d, sigma = 256, 16, 256, 1.7
    v = position_variance(cumulative_means(sigma * torch.randn(B, T, d, generator=gen))).mean(0)
    m = torch.arange(1, T + 1, dtype=torch.float32)
    torch.testing.assert_close(v, sigma**2 / m * (d - 1) / d, rtol=0.04, atol=0)


def test_cosine_by_distance_matches_loop() -> None:
    rng = np.random.default_rng(2)
    T = 9
    s = rng.standard_normal((T, T))
    out = cosine_by_distance(s)
    assert out.shape == (T,)
    for k in range(T):
        entries = [s[i, i - k] for i in range(k, T)]
        assert out[k] == pytest.approx(sum(entries) / len(entries), rel=1e-12)


@pytest.mark.parametrize(("T", "min_block"), [(5, 128), (37, 8), (130, 16), (64, 64)])
def test_cosine_row_blocks_tile_the_lower_triangle(T: int, min_block: int) -> None:
    h = torch.randn(3, T, 12, generator=torch.Generator().manual_seed(T), dtype=torch.float64)
    full = cosine_matrix(h)
    lower = torch.zeros_like(full)
    next_row = 0
    for start, block in cosine_row_blocks(h, min_block):
        stop = block.shape[-1]
        assert start == next_row and block.shape == (3, stop - start, stop)
        torch.testing.assert_close(block, full[:, start:stop, :stop])
        lower[:, start:stop, :stop] = block
        next_row = stop
    assert next_row == T
    torch.testing.assert_close(symmetric_from_lower(lower), full)
    given_norms = cosine_row_blocks(h, min_block, norms=h.norm(dim=-1))
    for (_, block), (_, again) in zip(cosine_row_blocks(h, min_block), given_norms, strict=True):
        torch.testing.assert_close(again, block, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lower_triangle_sums_equal_loops_over_the_matrix(dtype) -> None:
    """Row blocks (of 6 rows, then the last 5) of two 17 x 17 matrices, squares of 3."""
    T, block = 17, 3
    s = np.random.default_rng(0).normal(size=(2, T, T)).astype(dtype)
    K = -(-T // block)
    squares, distances, diagonal = np.zeros((K, K)), np.zeros(T), np.zeros(K)
    for start in (0, 6, 12):
        stop = min(start + 6, T)
        lower_triangle_sums(s[:, start:stop, :stop], start, block, squares, distances, diagonal)
    want_squares, want_distances, want_diagonal = np.zeros((K, K)), np.zeros(T), np.zeros(K)
    for b in range(2):
        for i in range(T):
            want_diagonal[i // block] += s[b, i, i]
            for j in range(i + 1):
                want_squares[i // block, j // block] += s[b, i, j]
                want_distances[i - j] += s[b, i, j]
    np.testing.assert_allclose(squares, want_squares, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(distances, want_distances, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(diagonal, want_diagonal, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="starts at a square"):
        lower_triangle_sums(s[:, 4:8, :8], 4, block, squares, distances, diagonal)


def test_adjacency_counts_add_up_over_row_blocks() -> None:
    h = torch.randn(2, 150, 16, generator=torch.Generator().manual_seed(1))
    h[1, 100] = float("nan")
    counts = AdjacencyCounts.zeros(2)
    for start, block in cosine_row_blocks(h, min_block=16):
        counts += adjacency_counts(block, start)
    whole = adjacency_score(cosine_matrix(h))
    np.testing.assert_array_equal(counts.scores(150).score, whole.score)
    np.testing.assert_array_equal(counts.scores(150).signed, whole.signed)
    assert np.isnan(whole.score[1]) and not np.isnan(whole.score[0])


def test_counting_pairs_keeps_numba_on_torch_threads() -> None:
    """numba and PyTorch share one OpenMP pool, and numba's parallel calls resize it to numba's
    count: kept at PyTorch's, a one-thread training run after an analysis stays on one thread
    (tests/e2e: a reproduction in one process gives the numbers of its one-thread workers)."""
    import numba

    before = torch.get_num_threads(), numba.get_num_threads()
    try:
        torch.set_num_threads(1)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # numba's default
        pair_counts(np.random.rand(64, 32).astype(np.float32), np.full(64, 32))
        assert (torch.get_num_threads(), numba.get_num_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])
