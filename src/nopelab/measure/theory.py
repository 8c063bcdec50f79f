"""Closed-form predictions for a randomly initialised, frozen, pre-LN NoPE transformer.

Setting (Chi et al. 2023): every weight matrix has i.i.d. N(0, σ²) entries, no biases, LayerNorm
gain 1, i.i.d. N(0, 1) input vectors, causal attention. Write d = d_model, H heads of size
d_h = d / H, and 1-based positions m.

Derivation sketch (first layer; docs/theory.md gives it in words):

1. LayerNorm output z has per-coordinate mean 0 and second moment 1, so ‖z‖² = d.
2. q = z W_q: given z, each coordinate is N(0, σ²‖z‖²) = N(0, dσ²); the same for k and v.
3. The scaled logit s = q_h·k_h / √d_h sums d_h products of variance (dσ²)² and divides the
   variance by d_h, so Var(s) = τ² := d²σ⁴ whatever H is.
4. With near-uniform causal attention o_m ≈ W_o (1/m) Σ_{i≤m} v_i, whose coordinates have
   variance σ² · d · dσ² / m = d²σ⁴ / m.
5. Softmax corrections, for i.i.d. N(0, τ²) logits: the weights are uneven, which multiplies the
   variance by κ_m = m E[Σ_j a_j²] (→ e^{τ²}); and they favour keys whose input z_j points
   along the query's direction w (s_j = w·z_j, ‖w‖² = τ²), so Σ_j a_j z_j → w rather than 0.
   Splitting each z_j along w and across it gives, per coordinate,

       Var(o_m) = dσ⁴ [ (d − 1) κ_m / m + t_m ],   t_m = E[(Σ_j a_j s_j / τ)²],

   with t_1 = 1, t_m = 1/m for uniform weights and t_m → τ² as m grows: a floor of d³σ⁸.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def _positions(m: ArrayLike) -> np.ndarray:
    m = np.asarray(m, dtype=float)
    if np.any(m < 1):
        raise ValueError(f"positions are 1-based, got min {m.min()}")
    return m


def qkv_variance(d_model: int, sigma: float) -> float:
    """Per-coordinate variance of q, k and v computed from a LayerNorm output: d σ²."""
    return d_model * sigma**2


def logit_variance(d_model: int, sigma: float) -> float:
    """Variance of the scaled logit q·k/√d_h: d_h (dσ²)² / d_h = d² σ⁴, independent of n_heads."""
    return qkv_variance(d_model, sigma) ** 2


def paper_logit_variance(d_model: int, sigma: float, n_heads: int) -> float:
    """d² σ⁴ / H, the scaled-logit variance as one write-up of Chi et al.'s derivation states.

    Kept for comparison only: the 1/√d_h scaling cancels the d_h-term sum, so H drops out
    (see :func:`logit_variance` and docs/theory.md).
    """
    return logit_variance(d_model, sigma) / n_heads


def softmax_concentration(m: ArrayLike, logit_var: float) -> np.ndarray:
    """κ_m = m E[Σ_j a_j²] for a softmax over m i.i.d. N(0, τ²) logits (1 for uniform weights).

    Padé form κ_m ≈ u − u(2u−1)(u−1) / (m + (2u+1)(u−1)), u = e^{τ²}: exact at m = 1, tends
    to e^{τ²} with the exact 1/m slope of the large-m (delta-method) expansion; it errs low.
    Relative error against numerical quadrature, worst over m: 0.06 % at τ² = 0.1, 0.4 % at
    τ² = 0.2, 2.2 % at τ² = 0.42 (m = 2; < 1 % from m = 10), 14 % at τ² = 1.
    """
    m = _positions(m)
    u = np.exp(logit_var)
    return u - u * (2 * u - 1) * (u - 1) / (m + (2 * u + 1) * (u - 1))


def softmax_tilt(m: ArrayLike, logit_var: float) -> np.ndarray:
    """t_m = E[(Σ_j a_j s_j / τ)²] for a softmax over m i.i.d. N(0, τ²) logits s_j.

    The squared attention-weighted mean of the standardised logits: 1 at m = 1, 1/m for uniform
    weights, τ² as m → ∞. Padé form t_m ≈ τ² + e^{τ²}(1 − τ²) / (m + e^{τ²} − 1), exact at
    m = 1 and in its large-m 1/m slope. Relative error, worst over m (at m = 2): 1.4 % at
    τ² = 0.1, 12 % at τ² = 0.42 (< 1 % from m = 30), 25 % at τ² = 1. In :func:`attn_output_variance` it is weighted
    against (d − 1) κ_m, so these errors barely show there.
    """
    m = _positions(m)
    u = np.exp(logit_var)
    return logit_var + u * (1 - logit_var) / (m + u - 1)


def attn_output_variance(
    m: ArrayLike, d_model: int, sigma: float, *, uniform: bool = False
) -> np.ndarray:
    """Per-coordinate variance of the first attention output (after W_o, before the residual add).

    At 1-based position m: dσ⁴ [(d − 1) κ_m / m + t_m] with κ_m = :func:`softmax_concentration`
    and t_m = :func:`softmax_tilt` at τ² = d²σ⁴. This is d²σ⁴ κ_m / m plus the softmax-tilt
    floor (≈ d³σ⁸ at large m), whose relative size is ≈ τ² m / (d κ_m). ``uniform=True``
    assumes uniform attention (κ_m = 1, t_m = 1/m), giving exactly d²σ⁴ / m.
    """
    m = _positions(m)
    if uniform:
        return logit_variance(d_model, sigma) / m
    tau2 = logit_variance(d_model, sigma)
    return (
        d_model
        * sigma**4
        * ((d_model - 1) * softmax_concentration(m, tau2) / m + softmax_tilt(m, tau2))
    )


def cosine_uniform(i: ArrayLike, j: ArrayLike) -> np.ndarray:
    """E cos(y_i, y_j) → √(min(i, j) / max(i, j)) for cumulative means y_m of i.i.d. vectors, d → ∞."""
    i, j = _positions(i), _positions(j)
    return np.sqrt(np.minimum(i, j) / np.maximum(i, j))


def cosine_uniform_residual(
    i: ArrayLike, j: ArrayLike, signal_var: float, residual_var: float
) -> np.ndarray:
    """E cos(h_i, h_j) as d → ∞ for h_m = x_m + y_m, y_m the mean of m i.i.d. vectors.

    x_m i.i.d. with per-coordinate variance r = ``residual_var``; the summands of y have
    per-coordinate variance s = ``signal_var``; all uncorrelated. For i ≠ j:
    (s / max(i, j)) / √((r + s/i)(r + s/j)); i == j gives 1.
    """
    i, j = _positions(i), _positions(j)
    s, r = signal_var, residual_var
    cos = (s / np.maximum(i, j)) / np.sqrt((r + s / i) * (r + s / j))
    return np.where(i == j, 1.0, cos)
