"""Position probes: features against brute force, probes against closed forms and invariances,
the 1/m law, the verdict, the commands and their errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

from helpers import run_cli
from nopelab.config import AnalysisConfig, ModelConfig, ProbeConfig, TrainConfig
from nopelab.errors import ConfigError, UserError
from nopelab.measure import theory
from nopelab.measure.analysis import input_batches
from nopelab.models.transformer import build_model
from nopelab.probing.features import collect, feature_matrix, sorted_similarities
from nopelab.probing.pipeline import collect_for_probes, probe_model, vocab_halves
from nopelab.probing.probes import fit_probe, position_targets, sequence_splits, summarize
from nopelab.probing.signals import verdict
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train

FAST = ProbeConfig(epochs=10, seeds=3)


def _fit(kind: str, X: torch.Tensor, T: int, cfg: ProbeConfig = FAST, n_test: float = 0.25):
    N = X.shape[0]
    y = position_targets(N, T, "position")
    return summarize(fit_probe(kind, X, y, sequence_splits(N, n_test, cfg.seeds, 0), cfg, 0))


# ------------------------------------------------------------------------ features


def test_features_match_their_definitions() -> None:
    h = torch.randn(3, 7, 16)
    h[0, 2] = 5 * h[0, 2]
    norm = feature_matrix(h, "norm")[..., 0]
    variance = feature_matrix(h, "variance")[..., 0]
    cos_last = feature_matrix(h, "cos_last")[..., 0]
    for n in range(3):
        for t in range(7):
            v = h[n, t].double().numpy()
            assert norm[n, t] == pytest.approx(math.log(np.linalg.norm(v)), rel=1e-5)
            assert variance[n, t] == pytest.approx(math.log(np.var(v)), rel=1e-5)
            last = h[n, -1].double().numpy()
            cos = v @ last / np.linalg.norm(v) / np.linalg.norm(last)
            assert cos_last[n, t] == pytest.approx(cos, abs=1e-5)
    combined = feature_matrix(h, "norm+cos_last")
    assert torch.equal(combined, torch.cat([norm[..., None], cos_last[..., None]], -1))


def test_sorted_similarities_against_brute_force() -> None:
    h = torch.randn(2, 9, 8)
    unit = torch.nn.functional.normalize(h, dim=-1)
    got = sorted_similarities(unit, quantiles=100)  # more than T - 1: every other token
    assert got.shape == (2, 9, 8)
    for n in range(2):
        for t in range(9):
            others = [float(unit[n, t] @ unit[n, j]) for j in range(9) if j != t]
            assert got[n, t].tolist() == pytest.approx(sorted(others, reverse=True), abs=1e-6)


def test_cos_row_holds_no_index() -> None:
    """Permuting a sequence's tokens permutes their sorted rows, nothing else: the feature
    knows how similar the other tokens are, not where they sit."""
    h = torch.randn(1, 12, 8)
    order = torch.randperm(12)
    rows = feature_matrix(h, "cos_row")
    permuted = feature_matrix(h[:, order], "cos_row")
    assert torch.allclose(permuted, rows[:, order], atol=1e-6)


def test_memory_mapped_collection_matches_memory() -> None:
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    analysis = AnalysisConfig(seq_len=16, samples=10, batch_size=4, input="tokens")
    model = build_model(cfg, 0)
    keys = [("attn_out", 1), ("resid_post", 2)]
    in_memory = collect(model, keys, input_batches(cfg, analysis), 10, 16, memory_gb=1.0)
    with collect(model, keys, input_batches(cfg, analysis), 10, 16, memory_gb=1e-9) as mapped:
        assert mapped.memory_mapped and not in_memory.memory_mapped
        for key in keys:
            assert torch.equal(mapped[key], in_memory[key])
        folder = Path(mapped.arrays[keys[0]].filename).parent
    assert not folder.exists()  # the files are gone with the context


# ------------------------------------------------------------------------ probes vs closed forms


def test_ridge_matches_the_best_linear_predictor() -> None:
    """Features x = position + N(0, σ²). The best linear predictor shrinks towards the mean,
    ŷ = ȳ + a (x − ȳ) with a = Var(y) / (Var(y) + σ²); its residual at position y is
    N((1 − a)(y − ȳ), a²σ²), whose mean absolute value is a folded normal's mean."""
    N, T, sigma = 400, 20, 1.5
    X = (torch.arange(T, dtype=torch.float64) + sigma * torch.randn(N, T)).unsqueeze(-1)
    result = _fit("linear-reg", X.float(), T)
    y = np.arange(T) - (T - 1) / 2
    a = y.var() / (y.var() + sigma**2)
    mu, s = (1 - a) * np.abs(y), a * sigma
    folded = s * math.sqrt(2 / math.pi) * np.exp(-(mu**2) / (2 * s**2)) + mu * (
        1 - 2 * scipy.stats.norm.cdf(-mu / s)
    )
    assert result["mae"] == pytest.approx(folded.mean(), rel=0.04)
    assert result["r"] > 0.95
    assert result["baseline"] == pytest.approx(np.abs(y).mean(), rel=1e-6)


@pytest.mark.parametrize("kind", ["linear-cls", "mlp-cls"])
def test_classifiers_are_exact_on_one_hot_positions(kind: str) -> None:
    N, T = 40, 16
    X = torch.eye(T).expand(N, T, T).contiguous()
    result = _fit(kind, X, T, ProbeConfig(epochs=30, lr=1e-2))
    assert result["accuracy"] == 1.0 and result["mad"] == 0.0
    assert result["baseline_accuracy"] == pytest.approx(1 / T, abs=0.02)


def test_mlp_regressor_without_signal_falls_back_to_the_constant() -> None:
    """Pure-noise features: a regressor that cannot beat the training mean on its validation
    tokens predicts the mean, so it is never worse than the baseline by more than the gap
    between mean and median; with a plain signal it never falls back."""
    generator = torch.Generator().manual_seed(0)
    N, T = 60, 16
    targets = position_targets(N, T, "position")
    splits = sequence_splits(N, 0.2, 3, 0)
    cfg = ProbeConfig(epochs=20, seeds=3, hidden=256, lr=3e-3)  # big enough to overfit noise
    noise = torch.randn(N, T, 64, generator=generator)
    results = fit_probe("mlp-reg", noise, targets, splits, cfg, 0)
    assert sum(r["constant"] for r in results) >= 2
    for r in results:
        if r["constant"]:
            assert r["mae"] == pytest.approx(r["baseline"], abs=0.5) and r["r"] == 0.0
    signal = targets[..., None].float() + 0.1 * torch.randn(N, T, 1, generator=generator)
    assert all(r["constant"] == 0 for r in fit_probe("mlp-reg", signal, targets, splits, cfg, 0))


def test_seeds_differ_and_repeat() -> None:
    X = (torch.arange(16.0) + torch.randn(30, 16)).unsqueeze(-1)
    first, again = _fit("mlp-reg", X, 16), _fit("mlp-reg", X, 16)
    assert first == again
    assert first["seeds"] == 3 and first["mae_std"] > 0


# ------------------------------------------------------------------------ models


@pytest.mark.parametrize(
    "encoding, kind",
    [("learned", "linear-cls"), ("sinusoidal", "linear-cls"), ("sinusoidal", "mlp-cls")],
)
def test_plainly_encoded_position_is_recovered_exactly(encoding: str, kind: str) -> None:
    cfg = ModelConfig(d_model=64, n_layers=1, n_heads=2, pos_encoding=encoding, max_seq_len=32)
    analysis = AnalysisConfig(seq_len=32, samples=48, input="tokens", sites=("embed",))
    probe = ProbeConfig(probes=(kind,), epochs=30, lr=1e-2)
    rows = probe_model(build_model(cfg, 0), analysis, probe, progress=False)
    assert rows[0]["accuracy"] >= 0.99 and rows[0]["mad"] <= 0.02


@pytest.mark.slow
def test_bidirectional_nope_stays_at_baseline() -> None:
    """Without a causal mask or encoding every position is exchangeable: nothing to find.
    (cos_last is left out: it singles out the last token, cos = 1, and nothing else.)"""
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2, bidirectional=True)
    analysis = AnalysisConfig(seq_len=24, samples=64, input="tokens", sites=("attn_out",))
    probe = ProbeConfig(
        probes=("linear-cls", "mlp-reg"),
        features=("raw", "norm", "variance", "cos_row"),
        epochs=8,
        seeds=2,
    )
    rows = pd.DataFrame(probe_model(build_model(cfg, 0), analysis, probe, progress=False))
    regression = rows[rows["probe"] == "mlp-reg"]
    assert (regression["mae"] > 0.9 * regression["baseline"]).all()
    assert (regression["r"].abs() < 0.2).all()
    classifier = rows[rows["probe"] == "linear-cls"]
    assert (classifier["accuracy"] < 2.5 / 24).all()


def test_causal_nope_layer_one_variance_follows_the_one_over_m_law() -> None:
    """Chi et al.'s setting: a variance-only probe in layer 1 does as well as inverting the
    closed-form variance curve, Var(o_m) ∝ 1/m, with no fitting at all."""
    T, d, N = 64, 128, 128
    cfg = ModelConfig(d_model=d, n_layers=1, n_heads=4, init_std=0.02)
    analysis = AnalysisConfig(seq_len=T, samples=N, input="random")
    acts = collect(build_model(cfg, 0), [("attn_out", 1)], input_batches(cfg, analysis), N, T)
    X = feature_matrix(acts[("attn_out", 1)], "variance")
    splits = sequence_splits(N, 0.25, 3, 0)
    probe = summarize(fit_probe("mlp-reg", X, position_targets(N, T, "position"), splits, FAST, 0))
    curve = np.log(theory.attn_output_variance(np.arange(1, T + 1), d, 0.02))
    inverted = np.abs(X[..., 0].numpy()[..., None] - curve).argmin(-1)  # position 0-based
    law = np.mean([np.abs(inverted[s.test.numpy()] - np.arange(T)).mean() for s in splits])
    assert law < 0.4 * probe["baseline"]  # the law itself locates tokens
    assert probe["mae"] == pytest.approx(law, rel=0.25)


def test_vocab_split_uses_disjoint_tokens() -> None:
    train_ids, test_ids = vocab_halves(96, 0)
    assert set(train_ids.tolist()).isdisjoint(test_ids.tolist())
    assert sorted(train_ids.tolist() + test_ids.tolist()) == list(range(96))
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, tie_embeddings=False)
    model = build_model(cfg, 0)
    analysis = AnalysisConfig(seq_len=8, samples=20, input="tokens", sites=("embed",))
    acts, splits = collect_for_probes(
        model, [("embed", 0)], analysis, ProbeConfig(split="vocab"), progress=False
    )
    # NoPE: the embed site is the token embedding, so each row names its token
    table = model.embed.weight.detach()
    vectors = acts[("embed", 0)].reshape(-1, 32)
    ids = torch.cdist(vectors, table).argmin(-1).reshape(20, 8)
    assert set(ids[splits[0].train].flatten().tolist()) <= set(train_ids.tolist())
    assert set(ids[splits[0].test].flatten().tolist()) <= set(test_ids.tolist())
    with pytest.raises(ConfigError, match="split"):
        collect_for_probes(model, [("embed", 0)], AnalysisConfig(), ProbeConfig(split="vocab"))


def test_bad_features_and_places_are_user_errors() -> None:
    y = position_targets(10, 8, "position")
    splits = sequence_splits(10, 0.2, 2, 0)
    with pytest.raises(UserError, match="NaN"):
        fit_probe("mlp-reg", torch.full((10, 8, 3), float("nan")), y, splits, FAST, 0)
    with pytest.raises(UserError, match="constant"):
        fit_probe("linear-cls", torch.ones(10, 8, 3), y, splits, FAST, 0)
    with pytest.raises(UserError, match="samples"):
        sequence_splits(2, 0.5, 3, 0)
    model = build_model(ModelConfig(d_model=32, n_layers=2, n_heads=2), 0)
    with pytest.raises(ConfigError, match=r"probe\.layers"):
        probe_model(model, AnalysisConfig(sites=("attn_out",)), ProbeConfig(layers=(3,)))
    with pytest.raises(ConfigError, match="features"):
        ProbeConfig(features=("norm+norm",))


# ------------------------------------------------------------------------ verdict and commands


def test_verdict_picks_the_lowest_error_and_weighs_the_spread() -> None:
    def row(features: str, mae: float, std: float, layer: int = 1) -> dict:
        return {"model": "m", "state": "init", "site": "attn_out", "layer": layer,
                "probe": "mlp-reg", "features": features, "mae": mae, "mae_std": std,
                "baseline": 16.0}  # fmt: skip

    rows = [row("variance", 4, 0.1), row("norm", 6, 0.1), row("cos_last", 9, 0.1),
            row("cos_row", 8, 0.1), row("raw", 1, 0.1)]  # fmt: skip
    rows += [row("variance", 5, 1.0, 2), row("norm", 5.5, 1.0, 2), row("cos_row", 5.2, 1, 2)]
    table = verdict(rows).set_index("layer")
    assert table.loc[1, "winner"] == "variance" and table.loc[1, "decisive"]
    assert table.loc[1, "similarity_mae"] == 8 and table.loc[1, "similarity_features"] == "cos_row"
    assert table.loc[2, "winner"] == "variance" and not table.loc[2, "decisive"]


@pytest.mark.slow
def test_probe_command_writes_a_documented_run(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "probe"
    args = ["probe", "--d-model", "32", "--layers", "2", "--heads", "2", "--seq-len", "16",
            "--samples", "24", "--input", "tokens", "--features", "raw,variance",
            "--probes", "linear-cls,mlp-reg", "--epochs", "3", "--seed", "1", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    for name in ("config.json", "probes.parquet", "summary.json", "summary.md", "probes.png"):
        assert (out / name).is_file()
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 3 * 2 * 2  # (embed 0, resid_post 1, 2) x features x probes
    for row in rows:
        assert {"layer", "site", "probe", "features", "baseline", "seeds"} <= set(row)
        metric = "mad" if row["probe"] == "linear-cls" else "mae"
        assert {metric, f"{metric}_std"} <= set(row)
        assert ("accuracy" in row) == (row["probe"] == "linear-cls")
    again = tmp_path / "again"
    assert run_cli([*args[:-1], str(again)], monkeypatch) == 0
    assert pd.read_parquet(out / "probes.parquet").equals(pd.read_parquet(again / "probes.parquet"))


@pytest.mark.parametrize("probe", ["linear-cls", "linear-reg"])
def test_a_probe_run_with_one_kind_of_probe(probe: str, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "probe"
    args = ["probe", "--d-model", "16", "--layers", "1", "--heads", "2", "--seq-len", "8",
            "--samples", "16", "--input", "tokens", "--features", "raw", "--sites", "embed",
            "--probes", probe, "--epochs", "2", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    table = (out / "summary.md").read_text().split("## Probes", 1)[1]
    assert f"| {probe} |" in table and "nan ±" not in table


def test_compare_signals_on_a_trained_run(tmp_path: Path, monkeypatch) -> None:
    run = TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64),
        train=TrainConfig(steps=4, batch_size=8, seq_len=32, eval_every=4, device="cpu"),
        task=TaskConfig(name="copy", max_len=5, train_size=500, test_size=50),
    )
    train(run, tmp_path / "run", progress=False)
    out = tmp_path / "signals"
    args = ["compare-signals", str(tmp_path / "run"), "--seq-len", "32", "--samples", "16",
            "--epochs", "2", "--probe-seeds", "2", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    table = pd.read_parquet(out / "verdict.parquet")
    assert sorted(set(table["state"])) == ["init", "trained"]
    assert set(table["site"]) == {"attn_out", "resid_post"} and set(table["layer"]) == {1, 2}
    assert set(table["winner"]) <= {"variance", "norm", "similarity"}
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["verdict"]) == len(table)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--features", "raw,spin"], "features: unknown value 'spin'"),
        (["--probe-layers", "7"], "--probe-layers: layer 7 does not exist"),
        (["--split", "vocab"], "split: vocab builds sequences from token ids"),
        (["--sites", "attn"], "sites: unknown value 'attn'"),
        (["--samples", "2"], "samples:"),
        (["--probes", "svm"], "probes: unknown value 'svm'"),
    ],
)
def test_bad_probe_input_is_one_line_exit_2(args, message, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "out"
    base = ["probe", "--d-model", "32", "--layers", "2", "--heads", "2", "--seq-len", "8"]
    assert run_cli([*base, *args, "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists() and not list(tmp_path.iterdir())
