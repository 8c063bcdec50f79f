"""Interventions: norm equalisation keeps every direction, LEACE leaves linear probes at chance,
the controls match their interventions without aiming at position, the hooks undo cleanly,
impossible places are one-line errors, and a trained run yields rows, a verdict and files."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from helpers import run_cli
from nopelab.config import (
    AnalysisConfig,
    CorpusConfig,
    InterventionConfig,
    ModelConfig,
    ProbeConfig,
    TrainConfig,
)
from nopelab.errors import ConfigError, UserError
from nopelab.models.transformer import Transformer
from nopelab.probing.features import collect
from nopelab.probing.interventions import (
    applied,
    edit_size,
    fit_intervention,
    run_interventions,
    verdict,
    write_interventions,
)
from nopelab.probing.probes import fit_probe, position_targets, sequence_splits, summarize
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train

T, D = 12, 48
PROBE = ProbeConfig(seeds=2, epochs=20)


def synthetic(n: int, seed: int) -> torch.Tensor:
    """``(n, T, D)`` activations that carry position twice: linearly, as a mean vector per
    position, and non-linearly, as a scale shrinking like 1/sqrt(t + 1)."""
    means = 0.5 * torch.randn(T, D, generator=torch.Generator().manual_seed(99))
    noise = torch.randn(n, T, D, generator=torch.Generator().manual_seed(seed))
    return (means + noise) * (torch.arange(T) + 1.0).rsqrt()[:, None]


def probe(kind: str, acts: torch.Tensor) -> dict[str, float]:
    N = len(acts)
    targets = position_targets(N, T, "position")
    return summarize(fit_probe(kind, acts, targets, sequence_splits(N, 0.2, 2, 0), PROBE, 0))


def cosines(h: torch.Tensor) -> torch.Tensor:
    unit = F.normalize(h.double(), dim=-1)
    return unit @ unit.transpose(1, 2)


def rank(intervention) -> int:
    return int(torch.linalg.matrix_rank(intervention.left.double() @ intervention.right.double()))


# ------------------------------------------------------------------------ the norm pair


def test_equalize_norm_keeps_every_cosine_and_equalises_the_norms() -> None:
    fit, acts = synthetic(64, 1), synthetic(8, 2)
    assert acts.norm(dim=-1).std() > 0.2 * acts.norm(dim=-1).mean()  # norms differ to start with
    edited = fit_intervention("equalize-norm", fit)(acts)
    assert torch.allclose(cosines(edited), cosines(acts), atol=1e-6)
    common = float(fit.double().norm(dim=-1).mean())
    assert torch.allclose(edited.norm(dim=-1), torch.full((8, T), common), rtol=1e-5)


def test_shuffle_norm_rescales_like_equalize_norm_but_not_by_position() -> None:
    fit, acts = synthetic(128, 1), synthetic(64, 2)
    equalize, shuffle = (fit_intervention(name, fit) for name in ("equalize-norm", "shuffle-norm"))
    norms = acts.norm(dim=-1)
    equal_factors = equalize(acts).norm(dim=-1) / norms
    shuffle_factors = shuffle(acts).norm(dim=-1) / norms
    fit_factors = float(fit.norm(dim=-1).mean()) / fit.norm(dim=-1)
    quantiles = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
    assert torch.allclose(
        shuffle_factors.flatten().quantile(quantiles),
        fit_factors.flatten().quantile(quantiles),
        rtol=0.08,
    )
    position = torch.arange(T).expand(64, T).flatten().double()

    def correlation(factors: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([factors.flatten().double(), position]))[0, 1])

    assert correlation(equal_factors) > 0.8  # equalising undoes the position-dependent scale
    assert abs(correlation(shuffle_factors)) < 0.1
    assert edit_size(shuffle, acts) == pytest.approx(edit_size(equalize, acts), rel=0.1)


# ------------------------------------------------------------------------ the LEACE pair


def test_leace_without_its_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "concept_erasure", None)  # as if it were not installed
    with pytest.raises(UserError, match=r"--intervention leace needs the 'interventions' extra"):
        fit_intervention("leace", synthetic(16, 1), "onehot")
    fit_intervention("equalize-norm", synthetic(16, 1))  # the norm edits need no extra


def test_leace_leaves_a_linear_probe_at_chance_but_not_an_mlp() -> None:
    fit, acts = synthetic(256, 1), synthetic(64, 2)
    before = probe("linear-cls", acts)
    assert before["accuracy"] > 5 / T
    leace = fit_intervention("leace", fit, "onehot")
    assert rank(leace) == T - 1
    erased = leace(acts)
    linear = probe("linear-cls", erased)
    assert linear["accuracy"] < 1.6 / T  # chance is 1/T
    assert linear["mad"] > 0.9 * linear["baseline"]
    # The scale 1/sqrt(t + 1) is not linear information: an MLP regressor still reads it.
    mlp = probe("mlp-reg", erased)
    assert mlp["r"] > 0.3
    assert mlp["mae"] < 0.95 * mlp["baseline"]


def test_shuffled_leace_has_the_same_rank_and_leaves_position_alone() -> None:
    fit, acts = synthetic(256, 1), synthetic(64, 2)
    control = fit_intervention("leace-shuffled", fit, "onehot")
    assert rank(control) == T - 1
    assert edit_size(control, acts) > 0.05  # it does edit the activations
    assert probe("linear-cls", control(acts))["accuracy"] > 5 / T
    # Shuffled labels give a cross-covariance of pure noise with small singular values; the
    # control must still remove T - 1 directions when T is close to d (T = 32, d = 40 here).
    noise = torch.randn(64, 32, 40)
    assert (
        rank(fit_intervention("leace-shuffled", noise))
        == rank(fit_intervention("leace", noise))
        == 31
    )


def test_scalar_leace_leaves_linear_regression_at_the_baseline() -> None:
    fit, acts = synthetic(256, 1), synthetic(64, 2)
    assert probe("linear-reg", acts)["r"] > 0.5
    leace = fit_intervention("leace", fit, "scalar")
    assert rank(leace) == 1
    erased = probe("linear-reg", leace(acts))
    assert abs(erased["r"]) < 0.2
    assert erased["mae"] > 0.95 * erased["baseline"]


# ------------------------------------------------------------------------ hooks and places

MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64)


@pytest.mark.parametrize("site", ["attn_out", "attn_heads"])
def test_hooks_edit_the_site_and_come_off_exactly(site: str) -> None:
    model = Transformer(MODEL).eval()
    idx = torch.randint(96, (4, 16))
    key = (site, 1)
    with torch.no_grad():
        original = model(idx)
    site = collect(model, [key], iter([{"idx": idx}]), 4, 16)[key].clone()
    for name in ("equalize-norm", "leace"):
        intervention = fit_intervention(name, site)
        with applied(model, *key, intervention), torch.no_grad():
            edited_site = collect(model, [key], iter([{"idx": idx}]), 4, 16)[key]
            assert torch.allclose(edited_site, intervention(site), atol=1e-6)
            edited = model(idx)
            assert not torch.allclose(edited, original, atol=1e-3)
            # the edit ignores the position index, so a prefix sees the same edit
            assert torch.allclose(model(idx[:, :7]), edited[:, :7], atol=1e-5)
        with torch.no_grad():
            assert torch.equal(model(idx), original)


@pytest.mark.parametrize(
    ("site", "layer", "field"),
    [("embed", 1, "layers"), ("attn_out", 0, "layers"), ("mlp_out", 3, "layers"), ("x", 1, "site")],
)
def test_an_impossible_place_is_a_config_error(site: str, layer: int, field: str) -> None:
    model = Transformer(MODEL)
    with pytest.raises(ConfigError) as info, applied(model, site, layer, lambda h: h):
        pass
    assert info.value.field == field
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------ a trained run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = TrainRun(
        model=MODEL,
        train=TrainConfig(
            steps=20,
            batch_size=8,
            seq_len=32,
            lr=3e-3,
            warmup=4,
            eval_every=20,
            checkpoint_every=20,
            eval_samples=32,
            device="cpu",
        ),
        task=TaskConfig(name="copy", max_len=5, train_size=2000, test_size=64),
    )
    out = tmp_path_factory.mktemp("run") / "copy"
    train(run, out, progress=False)
    return out


ANALYSIS = AnalysisConfig(seq_len=16, samples=12, batch_size=4, device="cpu")
FAST = ProbeConfig(seeds=1, epochs=2)
RIDGE = ProbeConfig(seeds=1, probes=("linear-reg",))  # closed form: the fastest probe


def test_run_interventions_rows_verdict_and_files(trained: Path, tmp_path: Path) -> None:
    cfg = InterventionConfig(fit_samples=16, eval_samples=32)
    rows = run_interventions(trained, cfg, FAST, ANALYSIS, progress=False)
    frame = pd.DataFrame(rows)
    assert len(frame) == 2 * 6  # layers 1 and 2: unmodified plus five interventions
    assert list(frame["intervention"][:6]) == ["none", *cfg.interventions]
    controls = dict(zip(frame["intervention"], frame["control_of"], strict=True))
    assert controls["shuffle-norm"] == "equalize-norm" and controls["leace-shuffled"] == "leace"
    assert controls["leace-rotated"] == "leace"
    for _, group in frame.groupby("layer"):
        size = group.set_index("intervention")["size"]
        assert size["leace-rotated"] == pytest.approx(size["leace"], rel=1e-3)
    assert (frame["metric"] == "accuracy").all()
    for _, group in frame.groupby("layer"):
        base = group[group["intervention"] == "none"].iloc[0]
        assert base["size"] == 0 and base["delta"] == 0
        edits = group[group["intervention"] != "none"]
        assert (edits["size"] > 0).all()
        assert edits["delta"].tolist() == pytest.approx(
            (edits["accuracy"] - base["accuracy"]).tolist()
        )
        p = edits["accuracy"].iloc[0]
        assert edits["se"].iloc[0] == pytest.approx(math.sqrt(p * (1 - p) / 32))
    for where in ("site", "final"):
        for column in ("linear-cls_raw_mad", "linear-cls_raw_accuracy", "mlp-reg_raw_mae"):
            assert frame[f"{where}_{column}"].notna().all()
    # the final probe of the unmodified model is the same whichever layer's row holds it
    unmodified = frame[frame["intervention"] == "none"]
    assert unmodified["final_mlp-reg_raw_mae"].nunique() == 1

    summary = write_interventions(tmp_path, rows, config={"intervention": {"site": "attn_out"}})
    for name in ("interventions.parquet", "summary.json", "summary.md", "interventions.png"):
        assert (tmp_path / name).is_file()
    stored = json.loads((tmp_path / "summary.json").read_text())
    assert stored["verdict"] == json.loads(json.dumps(summary["verdict"]))
    assert [v["layer"] for v in stored["verdict"]] == [1, 2]
    assert all(
        v["depends_on"] in ("norm", "position", "norm+position", "position+norm", "neither")
        for v in stored["verdict"]
    )
    assert len(pd.read_parquet(tmp_path / "interventions.parquet")) == 12


def test_the_last_residual_norm_does_not_matter(trained: Path) -> None:
    """The final LayerNorm undoes any rescaling of the last residual stream, so equalising its
    norms leaves the behaviour as it was."""
    cfg = InterventionConfig(
        site="resid_post", layers=(2,), interventions=("equalize-norm",), eval_samples=32
    )
    rows = run_interventions(trained, cfg, RIDGE, ANALYSIS, progress=False)
    base, edited = rows
    assert edited["size"] > 0.02
    assert edited["delta"] == 0
    assert edited["loss"] == pytest.approx(base["loss"], rel=1e-3)


def test_verdict_counts_an_effect_only_beyond_its_margin() -> None:
    def row(name: str, size: float, delta: float, se: float) -> dict:
        return {"layer": 1, "site": "attn_out", "metric": "accuracy", "intervention": name,
                "size": size, "delta": delta, "se": se}  # fmt: skip

    rows = [
        row("none", 0.0, 0.0, 0.01),
        row("equalize-norm", 0.3, -0.30, 0.02),
        row("shuffle-norm", 0.3, -0.05, 0.02),  # norm effect 0.25 > margin 2·sqrt(2)·0.02
        row("leace", 0.4, -0.06, 0.02),
        row("leace-shuffled", 0.1, -0.04, 0.02),  # position effect 0.02 < margin
    ]
    (entry,) = verdict(rows)
    assert entry["norm_effect"] == pytest.approx(0.25)
    assert entry["norm_margin"] == pytest.approx(2 * math.sqrt(2) * 0.02)
    assert entry["position_effect"] == pytest.approx(0.02)
    assert entry["norm_size_ratio"] == pytest.approx(1.0)
    assert entry["position_size_ratio"] == pytest.approx(4.0)
    assert entry["depends_on"] == "norm"
    loss_rows = [r | {"metric": "loss", "delta": -r["delta"]} for r in rows]  # loss rises
    assert verdict(loss_rows)[0]["depends_on"] == "norm"
    both = [*rows[:3], rows[3] | {"delta": -0.9}, rows[4]]  # position effect 0.86
    assert verdict(both)[0]["depends_on"] == "position+norm"
    # a size-matched control that harms as much as LEACE: measured against it, no effect
    rotated = [*both, row("leace-rotated", 0.4, -0.88, 0.02)]
    (entry,) = verdict(rotated)
    assert entry["position_control"] == "leace-rotated"
    assert entry["position_effect"] == pytest.approx(0.02)
    assert entry["position_size_ratio"] == pytest.approx(1.0)
    assert entry["depends_on"] == "norm"


def test_rotated_control_moves_as_far_as_leace_and_erases_nothing() -> None:
    """leace-rotated: every token's edit has LEACE's length, yet position stays linearly
    decodable, because h -> h + Q(f(h) - h) is invertible."""
    generator = torch.Generator().manual_seed(0)
    N, T, d = 48, 12, 16
    position = torch.arange(T, dtype=torch.float32)[None, :, None]
    direction = torch.randn(d, generator=generator)
    acts = torch.randn(N, T, d, generator=generator) + position * direction / T * 4
    leace = fit_intervention("leace", acts, "scalar")
    rotated = fit_intervention("leace-rotated", acts, "scalar")
    h = acts.reshape(-1, d)
    torch.testing.assert_close(
        (rotated(h) - h).norm(dim=-1), (leace(h) - h).norm(dim=-1), rtol=1e-4, atol=1e-5
    )
    assert edit_size(rotated, acts) == pytest.approx(edit_size(leace, acts), rel=1e-4)
    y = position.expand(N, T, 1).reshape(-1)

    def r2(x: torch.Tensor) -> float:  # in-sample linear fit of position
        design = torch.cat([x, torch.ones(len(x), 1)], 1).double()
        fit = torch.linalg.lstsq(design, y.double()[:, None]).solution
        residual = y.double() - (design @ fit)[:, 0]
        return float(1 - residual.var() / y.double().var())

    assert r2(h) > 0.5
    assert r2(leace(h)) < 0.05  # erased (up to LEACE's covariance shrinkage)
    assert r2(rotated(h)) == pytest.approx(r2(h), abs=1e-4)  # nothing lost


def test_an_impossible_layer_fails_before_any_work(trained: Path) -> None:
    with pytest.raises(ConfigError, match="layers"):
        run_interventions(trained, InterventionConfig(layers=(3,)), FAST, ANALYSIS)
    with pytest.raises(ConfigError, match="embed"):
        run_interventions(trained, InterventionConfig(site="embed", layers=(1,)), FAST, ANALYSIS)


def test_a_fit_set_beyond_the_memory_is_refused_before_any_work(trained: Path, monkeypatch) -> None:
    def no_work(*args, **kwargs):
        raise AssertionError("the data were read before the memory check")

    monkeypatch.setattr("nopelab.probing.interventions.make_source", no_work)
    with pytest.raises(UserError, match=r"^--fit-samples or --seq-len: intervening needs about"):
        run_interventions(trained, InterventionConfig(fit_samples=10**8), FAST, ANALYSIS)


def test_a_text_run_is_judged_by_its_loss(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    words = ["alpha", "beta", "gamma", "delta"]
    corpus.write_text(" ".join(words[i % 7 % 4] for i in range(4000)))
    run = TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=256),
        train=TrainConfig(
            steps=10,
            batch_size=8,
            seq_len=32,
            warmup=2,
            eval_every=10,
            eval_tokens=512,
            device="cpu",
        ),
        corpus=CorpusConfig(source=str(corpus)),
    )
    train(run, tmp_path / "text", progress=False)
    cfg = InterventionConfig(layers=(1,), interventions=("equalize-norm", "shuffle-norm"))
    rows = run_interventions(
        tmp_path / "text", cfg, RIDGE, ANALYSIS, eval_tokens=256, progress=False
    )
    assert [r["metric"] for r in rows] == ["loss"] * 3
    assert {"loss", "perplexity"} <= set(rows[0])
    assert rows[1]["delta"] == pytest.approx(rows[1]["loss"] - rows[0]["loss"])
    assert rows[0]["se"] == rows[1]["se"] > 0  # the unmodified model's spread over windows
    (entry,) = verdict(rows)
    assert "position_effect" not in entry and entry["norm_margin"] > 0


def test_intervene_command(trained: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "edit"
    base = ["intervene", str(trained), "--seq-len", "16", "--samples", "12", "--fit-samples",
            "16", "--eval-samples", "16", "--probes", "linear-reg", "--probe-seeds", "1"]  # fmt: skip
    assert run_cli([*base, "--at-layers", "2", "--out", str(out)], monkeypatch) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {row["layer"] for row in summary["rows"]} == {2}
    assert [v["layer"] for v in summary["verdict"]] == [2]
    assert json.loads((out / "config.json").read_text())["intervention"]["layers"] == [2]
    capsys.readouterr()  # the run's progress lines
    bad = tmp_path / "bad"
    for args, message in (
        (["--at-layers", "5"], "layers: the model has no layer 5"),
        (["--site", "attn"], "site: unknown value 'attn'"),
        (["--interventions", "erase"], "interventions: unknown value 'erase'"),
    ):
        assert run_cli([*base, *args, "--out", str(bad)], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err
        assert not bad.exists()
