"""Position probes: small models that read a token's position from its features.

Four kinds (:data:`~nopelab.config.PROBES`):

- ``linear-cls`` / ``mlp-cls``: classification over the T positions with cross-entropy
  (Haviv et al.); scored by accuracy and mean absolute distance |target − argmax| (MAD);
- ``linear-reg``: ridge regression, solved in closed form with the penalty chosen on a
  validation slice of the training sequences;
- ``mlp-reg``: a one-hidden-layer ReLU MLP regressing position with MSE (Chi et al., Zuo et al.);
  scored by mean absolute error (MAE) and Pearson r.

All seeds of a probe train at once as one batched ensemble (``torch.bmm``), each member on its
own split of sequences, stopping early on a tenth of its training sequences (the weights of
the best validation epoch are kept, so a probe that overfits is not scored at its worst).
``linear-cls`` starts from the closed-form linear discriminant (LDA).
Splits are by whole sequences, so no test token's sequence was seen in training. Regression
predictions are clipped to the range of positions seen in training. The baseline predicts the
middle (the training median), whatever the features.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nopelab.config import ProbeConfig
from nopelab.errors import UserError

ALPHAS = tuple(10.0**k for k in range(-6, 3))  # ridge penalties, times the number of tokens


def position_targets(n_seq: int, seq_len: int, target: str) -> Tensor:
    """``(N, T)`` int64 targets: 0-based position, or distance to the last token."""
    positions = torch.arange(seq_len).expand(n_seq, seq_len)
    return positions if target == "position" else seq_len - 1 - positions


@dataclass(frozen=True)
class Split:
    """Sequence indices for training and testing one ensemble member."""

    train: Tensor
    test: Tensor


def test_count(n_seq: int, test_fraction: float) -> int:
    """How many of ``n_seq`` sequences to hold out; at least 1, and 2 must be left to train."""
    n_test = max(1, round(n_seq * test_fraction))
    if n_seq - n_test < 2:
        raise UserError(
            f"samples: {n_seq} sequences leave fewer than 2 for training; use more --samples"
        )
    return n_test


def sequence_splits(n_seq: int, test_fraction: float, seeds: int, seed: int) -> list[Split]:
    """One random held-out-sequences split per seed; every split has the same sizes."""
    n_test = test_count(n_seq, test_fraction)
    splits = []
    for s in range(seeds):
        order = torch.randperm(n_seq, generator=torch.Generator().manual_seed(seed + 1000 * s))
        splits.append(Split(order[n_test:].sort().values, order[:n_test].sort().values))
    return splits


def fixed_splits(train: Tensor, test: Tensor, seeds: int) -> list[Split]:
    """The same train and test sequences for every seed (e.g. the held-out-vocabulary split)."""
    return [Split(train, test) for _ in range(seeds)]


def fit_probe(
    kind: str,
    features: Tensor,
    targets: Tensor,
    splits: list[Split],
    cfg: ProbeConfig,
    seed: int,
    device: torch.device | str = "cpu",
    label: str = "features",
) -> list[dict[str, float]]:
    """Fit probe ``kind`` on ``features`` ``(N, T, F)`` for ``targets`` ``(N, T)``, once per
    split; return each member's test metrics. ``label`` names the features in errors."""
    N, T, n_feat = features.shape
    flat, y = features.reshape(N * T, n_feat), targets.reshape(-1)
    mean, std = _member_moments(features, splits, label)
    train = torch.stack([_tokens(s.train, T) for s in splits])
    test = torch.stack([_tokens(s.test, T) for s in splits])
    if kind == "linear-reg":
        predict = _ridge(flat, y.double(), mean, std, splits, T, seed)
    else:
        classes = T if kind.endswith("cls") else None
        hidden = cfg.hidden if kind.startswith("mlp") else None
        predict = _train_ensemble(flat, y, mean, std, train, T, classes, hidden, cfg, seed, device)
    predictions = predict(test)  # (E, n_test)
    results = []
    for e in range(len(splits)):
        truth = y[test[e]].double()
        middle = y[train[e]].double().median()
        row = {"baseline": float((truth - middle).abs().mean())}
        seen = y[train[e]].double()
        pred = predictions[e].double().clamp(seen.min(), seen.max())  # positions are bounded
        if kind.endswith("cls"):
            row["mad"] = float((pred - truth).abs().mean())
            row["accuracy"] = float((pred == truth).double().mean())
            row["baseline_accuracy"] = float((truth == middle).double().mean())
        else:
            row["mae"] = float((pred - truth).abs().mean())
            row["r"] = _pearson(pred, truth)
            if kind == "mlp-reg":  # 1 where the probe fell back to the constant
                row["constant"] = float(predict.constant[e])
        results.append(row)
    return results


def summarize(results: list[dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of every metric, and its standard deviation as ``NAME_std``."""
    summary: dict[str, float] = {"seeds": len(results)}
    for name in results[0]:
        values = np.array([r[name] for r in results], dtype=float)
        summary[name] = float(values.mean())
        summary[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return summary


def _tokens(sequences: Tensor, T: int) -> Tensor:
    return (sequences[:, None] * T + torch.arange(T)).reshape(-1)


def _member_moments(features: Tensor, splits: list[Split], label: str) -> tuple[Tensor, Tensor]:
    """Per member, the mean and std of every feature over its training tokens ``(E, F)``;
    one pass over the data through per-sequence sums."""
    sums = torch.zeros(features.shape[0], features.shape[2], dtype=torch.float64)
    squares = torch.zeros_like(sums)
    for i in range(0, len(features), 256):
        chunk = features[i : i + 256].double()
        sums[i : i + 256], squares[i : i + 256] = chunk.sum(1), chunk.square().sum(1)
    if not torch.isfinite(sums).all() or not torch.isfinite(squares).all():
        raise UserError(f"{label}: has NaN or infinite values; nothing to probe")
    T = features.shape[1]
    means, stds = [], []
    for split in splits:
        n = len(split.train) * T
        mean = sums[split.train].sum(0) / n
        var = (squares[split.train].sum(0) / n - mean.square()).clamp_min(0)
        std = var.sqrt()
        if not (std > 1e-12 * (mean.abs() + 1)).any():
            raise UserError(f"{label}: is constant over every token; nothing to probe")
        means.append(mean)
        stds.append(torch.where(std > 1e-12 * (mean.abs() + 1), std, torch.ones_like(std)))
    return torch.stack(means).float(), torch.stack(stds).float()


def _pearson(a: Tensor, b: Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = a.norm() * b.norm()
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0  # constant: 0


def _ridge(flat, y, mean, std, splits, T, seed):
    """Closed-form ridge per member; the penalty is picked on 10% of its training sequences.

    The normal equations are summed chunk by chunk in float64, so the memory is O(F²) whatever
    the number of tokens."""
    y = y.double()
    weights = []
    for e, split in enumerate(splits):
        order = split.train[torch.randperm(len(split.train), generator=_gen(seed + e))]
        n_val = max(1, len(order) // 10)
        rows = _StandardRows(flat, y, mean[e], std[e], T)
        fit, val = rows.sums(order[n_val:]), rows.sums(order[:n_val])
        y_mean = fit.y / fit.n
        vals, vecs = torch.linalg.eigh(fit.gram)
        projected = vecs.T @ (fit.xy - y_mean * fit.x)
        candidates = torch.stack([vecs @ (projected / (vals + a * fit.n)) for a in ALPHAS], 1)
        errors = torch.zeros(len(ALPHAS), dtype=torch.float64)
        for X, target in rows.chunks(order[:n_val]):
            errors += (X @ candidates + y_mean - target[:, None]).abs().sum(0)
        alpha = ALPHAS[int(errors.argmin())]
        n, y_mean = fit.n + val.n, (fit.y + val.y) / (fit.n + val.n)
        gram = fit.gram + val.gram + alpha * n * torch.eye(len(fit.gram), dtype=torch.float64)
        w = torch.linalg.solve(gram, fit.xy + val.xy - y_mean * (fit.x + val.x))
        weights.append((rows, w, y_mean))

    def predict(tokens: Tensor) -> Tensor:
        return torch.stack(
            [rows.standard(tokens[e]) @ w + b for e, (rows, w, b) in enumerate(weights)]
        )

    return predict


@dataclass(frozen=True)
class _Sums:
    """Sums over tokens for the normal equations: XᵀX, Xᵀy, X, y and the token count."""

    gram: Tensor
    xy: Tensor
    x: Tensor
    y: float
    n: int


@dataclass(frozen=True)
class _StandardRows:
    """One member's standardised features, read a few sequences at a time."""

    flat: Tensor  # (N * T, F)
    y: Tensor  # (N * T,) float64
    mean: Tensor
    std: Tensor
    T: int

    def standard(self, tokens: Tensor) -> Tensor:
        return (self.flat[tokens].double() - self.mean.double()) / self.std.double()

    def chunks(self, sequences: Tensor, size: int = 32) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(0, len(sequences), size):
            tokens = _tokens(sequences[i : i + size], self.T)
            yield self.standard(tokens), self.y[tokens]

    def sums(self, sequences: Tensor) -> _Sums:
        F_ = self.flat.shape[1]
        gram = torch.zeros(F_, F_, dtype=torch.float64)
        xy, x = torch.zeros(F_, dtype=torch.float64), torch.zeros(F_, dtype=torch.float64)
        total, n = 0.0, 0
        for X, target in self.chunks(sequences):
            gram += X.T @ X
            xy += X.T @ target
            x += X.sum(0)
            total, n = total + float(target.sum()), n + len(target)
        return _Sums(gram, xy, x, total, n)


class Ensemble(nn.Module):
    """E independent linear or one-hidden-layer ReLU probes, evaluated with batched matmuls."""

    def __init__(self, E: int, n_in: int, n_out: int, hidden: int | None, generator):
        super().__init__()
        sizes = [n_in, n_out] if hidden is None else [n_in, hidden, n_out]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's default initialisation
            w = (torch.rand(E, fan_in, fan_out, generator=generator) * 2 - 1) * bound
            b = (torch.rand(E, 1, fan_out, generator=generator) * 2 - 1) * bound
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: Tensor) -> Tensor:  # (E, B, n_in) -> (E, B, n_out)
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < len(self.weights) - 1:
                x = F.relu(x)
        return x


def _train_ensemble(flat, y, mean, std, train, T, classes, hidden, cfg, seed, device):
    """Minibatch AdamW on every member at once; each member shuffles its own tokens.

    A linear classifier starts from linear discriminant analysis, other probes from random
    weights. With at least 5 training sequences, the last tenth of each member's training
    sequences is held out for early stopping: every member keeps the weights of its best
    validation epoch (or the discriminant, where it did better).
    A regressor whose best validation loss is still worse than predicting the training mean
    falls back to that constant (``predict.constant`` says which members did).
    """
    E = train.shape[0]
    n_val = (train.shape[1] // T) // 10 * T
    train, val = train[:, : train.shape[1] - n_val], train[:, train.shape[1] - n_val :]
    n_train = train.shape[1]
    generator = _gen(seed)
    inputs = _inputs_of(flat, mean, std, device)
    model = Ensemble(E, flat.shape[1], classes or 1, hidden, generator).to(device)
    informed_start = bool(classes) and hidden is None
    if informed_start:
        _discriminant_start(model, inputs, y, train, classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    y_float = y.double()
    y_mean = torch.stack([y_float[t].mean() for t in train]).float().to(device)[:, None]
    y_std = (
        torch.stack([y_float[t].std() for t in train]).float().clamp_min(1e-6).to(device)[:, None]
    )

    def losses(tokens: Tensor) -> Tensor:  # (E,) summed over each member's tokens
        out, target = model(inputs(tokens)), y[tokens].to(device)
        if classes:
            return F.cross_entropy(out.transpose(1, 2), target, reduction="none").sum(1)
        z = (target.float() - y_mean) / y_std
        return (out.squeeze(-1) - z).square().sum(1)

    best_loss = torch.full((E,), float("inf"), device=device)
    best = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def keep_best() -> None:  # per member, the weights with the lowest validation loss so far
        model.eval()
        loss = sum(losses(val[:, i : i + 4096]) for i in range(0, n_val, 4096))
        better = loss < best_loss
        best_loss.copy_(torch.where(better, loss, best_loss))
        for kept, p in zip(best, model.parameters(), strict=True):
            kept[better] = p[better]

    if n_val and informed_start:
        keep_best()  # the discriminant is a candidate too
    for _ in range(cfg.epochs):
        model.train()
        order = train.gather(1, torch.rand(E, n_train, generator=generator).argsort(dim=1))
        for start in range(0, n_train, cfg.batch_size):
            tokens = order[:, start : start + cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            (losses(tokens).sum() / tokens.shape[1]).backward()  # each member's own mean loss
            optimizer.step()
        if n_val:
            keep_best()
    constant = torch.zeros(E, dtype=torch.bool, device=device)
    if n_val:
        with torch.no_grad():
            for kept, p in zip(best, model.parameters(), strict=True):
                p.copy_(kept)
            if not classes:  # the constant predicts z = 0: its loss is the sum of z²
                z = (y[val].to(device).float() - y_mean) / y_std
                constant = best_loss > z.square().sum(1)
    model.eval()

    @torch.no_grad()
    def predict(tokens: Tensor) -> Tensor:
        outs = []
        for start in range(0, tokens.shape[1], 4096):
            out = model(inputs(tokens[:, start : start + 4096]))
            if classes:
                outs.append(out.argmax(-1))
            else:  # a member that fell back predicts z = 0, the training mean
                outs.append(out.squeeze(-1).masked_fill(constant[:, None], 0.0) * y_std + y_mean)
        return torch.cat(outs, dim=1).cpu()

    predict.constant = constant.cpu()  # type: ignore[attr-defined]  # which members fell back
    return predict


def _inputs_of(flat: Tensor, mean: Tensor, std: Tensor, device) -> Callable[[Tensor], Tensor]:
    """Standardised probe inputs ``(E, n, F)`` for token indices ``(E, n)``, each member with
    its own training moments ``mean``, ``std`` ``(E, F)``."""
    mean, std = mean.to(device)[:, None], std.to(device)[:, None]

    def inputs(tokens: Tensor) -> Tensor:
        x = flat[tokens.reshape(-1)].float().reshape(*tokens.shape, -1).to(device)
        return (x - mean) / std

    return inputs


@torch.no_grad()
def _discriminant_start(
    model: Ensemble, inputs: Callable, y: Tensor, train: Tensor, classes: int
) -> None:
    """Start a linear classifier from linear discriminant analysis (class means, one shared
    covariance), its logits scaled by the power of two with the lowest training cross-entropy.

    The cross-entropy is convex in the weights, but minibatch AdamW from a random start crawls
    where neighbouring classes sit close together (sinusoidal positions: 0.72 accuracy after
    30 epochs at the embedding of a 64-d model); from this start it reaches 1.0.
    """
    for e in range(train.shape[0]):
        x = inputs(train[e : e + 1])[0]  # (n, F), float32
        target = y[train[e]].to(x.device)
        counts = torch.bincount(target, minlength=classes).to(x)
        means = torch.zeros(classes, x.shape[1], dtype=x.dtype, device=x.device)
        means.index_add_(0, target, x)
        means /= counts.clamp_min(1)[:, None]
        within = x - means[target]
        covariance = (within.T @ within).double() / len(x)  # the solve in float64
        covariance += 1e-3 * torch.eye(len(covariance)).to(covariance)  # inputs: unit variance
        w = torch.linalg.solve(covariance, means.T.double()).to(x)  # (F, C)
        b = -0.5 * (means * w.T).sum(1) + counts.clamp_min(0.5).log()
        logits = x @ w + b
        losses = [F.cross_entropy(logits * 2.0**k, target) for k in range(-6, 6)]
        scale = 2.0 ** (int(torch.stack(losses).argmin()) - 6)
        model.weights[0][e] = w * scale
        model.biases[0][e, 0] = b * scale


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
