"""Limits before work: memory estimates against what the machine has, bounded integer flags."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import nopelab.limits as limits
from helpers import run_cli
from nopelab.config import AnalysisConfig, InterventionConfig, ModelConfig
from nopelab.encodings import NAMES
from nopelab.errors import UserError
from nopelab.models.transformer import Transformer


@pytest.mark.parametrize(
    ("pos_encoding", "bias", "norm", "mlp", "tie", "norm_position"),
    [
        *itertools.product(
            NAMES,
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
    for seq_len, sites in ((512, ("embed",)), (1024, ("embed",)), (1024, ("embed", "attn_out"))):
        limits.check_analysis(model, AnalysisConfig(seq_len=seq_len, sites=sites))
    assert needs[0] < needs[1] < needs[2]
    # up to 1024 positions doubling T quadruples the statistics: the T x T sums dominate
    statistics = [n - 4 * limits.parameter_count(model) for n in needs[:2]]
    assert 3 < statistics[1] / statistics[0] <= 4
    needs.clear()
    # beyond, the kept matrix stops growing: memory is linear in T (a constant, then the
    # activations and the per-position vectors), so doubling T again doubles the increase
    for seq_len in (8192, 16384, 32768):
        limits.check_analysis(model, AnalysisConfig(seq_len=seq_len, batch_size=1))
    assert (needs[2] - needs[1]) / (needs[1] - needs[0]) == pytest.approx(2, rel=0.05)
    needs.clear()
    for layers in (2, 4):
        limits.check_training(ModelConfig(d_model=32, n_layers=layers, n_heads=2), 8, 64)
    assert needs[1] > needs[0]


@pytest.mark.parametrize("pos_encoding", ["none", "alibi", "t5"])
def test_attention_entropy_needs_a_chunk_not_the_matrix(
    pos_encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attention statistics rebuild the logits a chunk of query rows at a time: what they
    add stays at one chunk (its bound, once T is long enough), not a T x T matrix per head.
    A position bias (ALiBi, T5) keeps its T x T term: the fused kernel takes it as a mask."""
    activations: list[int] = []
    monkeypatch.setattr(
        limits, "_check", lambda doing, parts: activations.append(parts["activations"][0])
    )
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2, pos_encoding=pos_encoding)
    for seq_len in (8192, 16384, 32768):
        for entropy in (False, True):
            analysis = AnalysisConfig(
                seq_len=seq_len, batch_size=1, sites=("attn_out", "attention")[: 1 + entropy]
            )
            limits.check_analysis(model, analysis)
    added = [
        with_ - without for without, with_ in zip(activations[::2], activations[1::2], strict=True)
    ]
    assert added == [limits.ATTENTION_CHUNK * 2**22] * 3
    matrix = 4 * 2 * 32768**2  # float32, 2 heads
    assert (activations[-2] > matrix) == (pos_encoding in ("alibi", "t5"))


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
    corpus.write_text("abcabc " * 10)  # 70 bytes, the last 4 (5 %) held out: the BPE learns
    args = ["train", "--corpus", str(corpus), "--tokenizer", "bpe", "--bpe-vocab", "400"]  # on 66
    assert run_cli([*args, "--out", str(tmp_path / "o")], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert err == "nopelab: error: --bpe-vocab: a corpus of 66 bytes yields at most 322 BPE " \
        "tokens, got 400"  # fmt: skip
    assert not (tmp_path / "o").exists()


def _intervention_parts(monkeypatch: pytest.MonkeyPatch, **fields: object) -> dict[str, int]:
    parts: dict[str, int] = {}
    monkeypatch.setattr(
        limits, "_check", lambda doing, p: parts.update({k: size for k, (size, _) in p.items()})
    )
    model = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    limits.check_interventions(model, InterventionConfig(**fields), 64, 2, memory_gb=4.0)
    return parts


def test_intervention_estimates_grow_with_what_they_count(monkeypatch) -> None:
    small = _intervention_parts(monkeypatch, fit_samples=64)
    double = _intervention_parts(monkeypatch, fit_samples=128)
    assert double == {name: 2 * size for name, size in small.items()}
    scalar = _intervention_parts(monkeypatch, fit_samples=64, concept="scalar")
    assert scalar["fitting of an edit"] < small["fitting of an edit"]  # 1 class, not 64
    norms = _intervention_parts(monkeypatch, interventions=("equalize-norm", "shuffle-norm"))
    assert norms["fitting of an edit"] < scalar["fitting of an edit"]
    beyond = _intervention_parts(monkeypatch, fit_samples=10**6)
    assert beyond["fit set"] == 0  # beyond --memory-gb the fit set is memory-mapped


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "concept"),
    [("leace", "onehot"), ("leace-rotated", "scalar"), ("shuffle-norm", "onehot")],
)
def test_the_fitting_estimate_is_the_measured_peak(name: str, concept: str, monkeypatch) -> None:
    """The peak resident memory of fitting one edit on 1024 x 64 tokens of width 32, measured
    in a fresh process (Linux: the peak is reset before the fit), against the estimate."""
    code = (
        "import re, torch\n"
        "from nopelab.probing.interventions import fit_intervention\n"
        "status = lambda key: int(re.search(key + r':\\s+(\\d+)', "
        "open('/proc/self/status').read()).group(1)) * 1024\n"
        "acts = torch.randn(1024, 64, 32)\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "before = status('VmRSS')\n"
        f"fit_intervention({name!r}, acts, {concept!r})\n"
        "print(status('VmHWM') - before)\n"
    )
    measured = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout)  # fmt: skip
    parts = _intervention_parts(
        monkeypatch, fit_samples=1024, interventions=(name,), concept=concept
    )
    assert 0.85 < parts["fitting of an edit"] / measured < 1.15


def test_an_intervention_that_cannot_fit_is_refused(
    finished_run: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "o"
    args = ["intervene", str(finished_run), "--fit-samples", "100000000", "--out", str(out)]
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nopelab: error: --fit-samples or --seq-len: intervening needs about")
    assert not out.exists()
