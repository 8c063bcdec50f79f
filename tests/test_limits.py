"""Limits before work: memory estimates against what the machine has, bounded integer flags."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import nopelab.limits as limits
from conftest import run_cli
from nopelab.config import AnalysisConfig, ModelConfig
from nopelab.errors import UserError
from nopelab.models.transformer import Transformer


@pytest.mark.parametrize(
    ("pos_encoding", "bias", "norm", "mlp", "tie", "norm_position"),
    [
        *itertools.product(
            ["none", "learned", "sinusoidal", "rope", "alibi"],
            [False, True],
            ["layernorm", "rmsnorm"],
            ["gelu", "swiglu"],
            [True],
            ["pre"],
        ),
        ("learned", True, "layernorm", "gelu", False, "post"),
        ("none", False, "rmsnorm", "swiglu", False, "pre"),
    ],
)
def test_parameter_count_matches_the_built_model(
    pos_encoding: str, bias: bool, norm: str, mlp: str, tie: bool, norm_position: str
) -> None:
    cfg = ModelConfig(
        vocab_size=37, d_model=24, n_layers=3, n_heads=2, max_seq_len=19, mlp_ratio=3,
        pos_encoding=pos_encoding, bias=bias, norm=norm, mlp=mlp, tie_embeddings=tie,
        norm_position=norm_position,
    )  # fmt: skip
    model = Transformer(cfg)
    assert limits.parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_estimates_grow_with_what_they_count(monkeypatch: pytest.MonkeyPatch) -> None:
    needs: list[int] = []

    def record(doing: str, parts: dict[str, tuple[int, str]]) -> None:
        needs.append(sum(size for size, _ in parts.values()))

    monkeypatch.setattr(limits, "_check", record)
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    for seq_len, sites in ((1024, ("embed",)), (2048, ("embed",)), (2048, ("embed", "attn_out"))):
        limits.check_analysis(model, AnalysisConfig(seq_len=seq_len, sites=sites))
    assert needs[0] < needs[1] < needs[2]
    # doubling T quadruples the statistics: the T x T terms dominate at this size
    statistics = [n - 4 * limits.parameter_count(model) for n in needs[:2]]
    assert 3 < statistics[1] / statistics[0] <= 4
    needs.clear()
    for layers in (2, 4):
        limits.check_training(ModelConfig(d_model=32, n_layers=layers, n_heads=2), 8, 64)
    assert needs[1] > needs[0]


def test_a_model_that_does_not_fit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    model, analysis = ModelConfig(d_model=32, n_layers=2, n_heads=2), AnalysisConfig(seq_len=64)
    limits.check_analysis(model, analysis)  # fits on any machine
    monkeypatch.setattr(limits, "available_memory", lambda: 2**20)
    with pytest.raises(UserError, match=r"analysing needs about .* 1 MiB is available"):
        limits.check_analysis(model, analysis)
    with pytest.raises(UserError, match=r"^--layers, --d-model or --vocab-size: training needs"):
        limits.check_training(ModelConfig(n_layers=20, d_model=1024, n_heads=8), 1, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["analyze", "--layers", "1000000000"], "--layers, --d-model or --vocab-size: analysing"),
        (["analyze", "--d-model", "1000000000", "--heads", "1"], "--layers, --d-model or"),
        (["analyze", "--seq-len", "2000000"], "--seq-len or --sites: analysing needs about"),
        (["probe", "--layers", "1000000000"], "--layers, --d-model or --vocab-size: analysing"),
        (["train", "--task", "add", "--layers", "100000"], "training needs about"),
        (["train", "--task", "add", "--seq-len", "1000000"], "--batch-size, --seq-len or"),
        (["analyze", "--samples", "99999999999999999999999"], "--samples: must be at most"),
        (["train", "--task", "add", "--steps", "1e9"], "--steps"),
        (["train", "--task", "add", "--steps", "10000000000"], "--steps: must be at most"),
        (
            ["train", "--corpus", "default", "--tokenizer", "bpe", "--bpe-vocab", "1000000000"],
            "--bpe-vocab: must be in",
        ),
    ],
)
def test_limits_are_one_line_before_any_work(
    args: list[str], message: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli([*args, "--device", "cpu", "--out", str(tmp_path / "o")], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_bpe_larger_than_its_corpus_allows_is_refused(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("abcabc " * 10)  # 70 bytes: at most 256 + 70 tokens
    args = ["train", "--corpus", str(corpus), "--tokenizer", "bpe", "--bpe-vocab", "400"]
    assert run_cli([*args, "--out", str(tmp_path / "o")], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert err == "nopelab: error: --bpe-vocab: a corpus of 70 bytes yields at most 326 BPE " \
        "tokens, got 400"  # fmt: skip
    assert not (tmp_path / "o").exists()
