"""The reproduce commands end to end at smoke scale: files, and the papers' qualitative claims."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_matches_reference, reproduce
from nopelab.config import ModelConfig, RunConfig, TrainConfig
from nopelab.errors import UserError
from nopelab.experiments import EXPERIMENTS
from nopelab.experiments import train_and_measure as trained_module
from nopelab.experiments.chi2023 import pretrained as chi2023_pretrained
from nopelab.experiments.train_and_measure import (
    check_trained,
    lm_runs,
    stage_folder,
    train_into,
    training_job,
)
from nopelab.models.transformer import Transformer
from nopelab.runtime.jobs import DONE, run_jobs
from nopelab.runtime.rundir import write_marker
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train
from nopelab.training.trained import load_trained


@pytest.mark.reference
@pytest.mark.slow
def test_chi2023_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "chi"
    reproduce(["chi2023", "--out", str(out)], monkeypatch)
    table = pd.read_parquet(out / "theory.parquet")
    assert list(table["m"]) == [1, 2, 4, 8, 16, 32, 64]
    # d = 64 is small, so allow 35%; the 1/m trend itself must be there (64x over the sequence)
    assert table["measured_over_corrected"].between(0.65, 1.35).all()
    rows = json.loads((out / "summary.json").read_text())["rows"]
    first = next(r for r in rows if r["site"] == "attn_out" and r["layer"] == 1)
    assert 30 < first["variance_ratio"] < 100
    text = (out / "summary.md").read_text()
    assert "d²σ⁴" in text and "first/last" in text
    for name in ("variance.png", "attention.png", "attention.parquet", "cosine.npz"):
        assert (out / name).exists()
    # layer 1's attention in summary.json, as summary.md writes it: d = 64, sigma = 0.02, 4 heads
    attention = json.loads((out / "summary.json").read_text())["layer1_attention"]
    assert attention["logit_variance_theory"] == pytest.approx(64**2 * 0.02**4)
    assert attention["logit_variance_paper"] == pytest.approx(64**2 * 0.02**4 / 4)
    assert attention["logit_variance"] == pytest.approx(64**2 * 0.02**4, rel=0.1)
    assert 0.99 < attention["entropy_ratio_min"] <= attention["entropy_ratio_last"] <= 1
    assert f"{attention['logit_variance']:.4g}; our derivation" in text
    assert_matches_reference(out, "chi2023-random-init")

    # the position probes on the frozen random model
    probes = pd.read_parquet(out / "probes.parquet")
    T, L = 64, 3
    for _, rows in probes.groupby(["site", "features"]):
        assert sorted(rows["layer"]) == list(range(1, L + 1))  # one probe row per layer
    assert set(probes.groupby(["site", "features"]).groups) == {
        (site, features) for site in ("resid_post", "attn_out") for features in ("raw", "variance")
    }
    assert (probes["probe"] == "mlp-reg").all()
    assert probes["baseline"].between(0.9 * T / 4, 1.1 * T / 4).all()  # predict the middle
    assert (probes["seeds"] >= 3).all() and probes[["mae_std", "r"]].notna().all().all()
    assert "Position probes on the frozen random model" in text and "T/4 = 16" in text
    assert "beats the baseline" in text
    assert (out / "probes.png").stat().st_size > 0


@pytest.mark.reference
@pytest.mark.slow
def test_the_main_job_keeps_its_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's main job, ``nopelab reproduce chi2023`` at its default scale, gives the
    numbers stored when its tables were written into the README (a few minutes)."""
    from nopelab.cli import main

    out = tmp_path / "chi2023"
    args = ["nopelab", "reproduce", "chi2023", "--device", "cpu", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", args)
    main()
    assert_matches_reference(out, "chi2023-random-init-small")


@pytest.mark.reference
@pytest.mark.slow
def test_zuo2025_random_init_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "zuo"
    reproduce(["zuo2025", "--part", "random-init", "--out", str(out)], monkeypatch)
    scores = pd.read_parquet(out / "scores.parquet")
    attn = scores[scores["site"] == "attn_out"].set_index(["run", "layer"])["adjacency_mean"]
    # Zuo et al.: causal models show the adjacency pattern at small init; bidirectional cannot
    assert attn["causal-nope"].min() > 0.8
    assert attn["causal-learned"].min() > 0.8
    assert abs(attn["bidirectional-nope"] - 0.5).max() < 0.1
    # large init makes attention peaked and washes the pattern out
    assert attn["init-normal-2"].max() < attn["init-normal-0.02"].min()
    assert len(scores["run"].unique()) == 3 + 13
    for name in (
        "heatmaps.png",
        "heatmaps_init.png",
        "score_vs_sigma.png",
        "scores.png",
        "summary.md",
    ):
        assert (out / name).stat().st_size > 0
    assert (out / "runs" / "causal-nope" / "cosine.npz").exists()
    assert_matches_reference(out, "zuo2025-random-init")


@pytest.mark.slow
def test_zuo2025_trained_with_some_encodings_trains_and_reports_those(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--encodings none: the four NoPE models, the same as in a run of every encoding, and
    tables with NoPE's column alone."""
    some, every = tmp_path / "some", tmp_path / "every"
    argv = ["zuo2025", "--part", "trained"]
    reproduce([*argv, "--encodings", "none", "--out", str(some)], monkeypatch)
    assert sorted(p.name for p in (some / "runs").iterdir()) == [
        *(f"{task}-none" for task in ("add", "order", "reverse", "wherex")),
        "wherex-none-stage1",  # smoke's curriculum
    ]
    accuracy = pd.read_parquet(some / "accuracy.parquet")
    assert set(accuracy["pos_encoding"]) == {"none"} and len(accuracy) == 4
    assert "| task | max_len | step cap | none |\n" in (some / "summary.md").read_text()
    reproduce([*argv, "--out", str(every)], monkeypatch)
    both = pd.read_parquet(every / "accuracy.parquet").query("pos_encoding == 'none'")
    timing = ["train_seconds", "tokens_per_second"]
    pd.testing.assert_frame_equal(
        accuracy.drop(columns=timing).reset_index(drop=True),
        both.drop(columns=timing).reset_index(drop=True),
    )


@pytest.mark.reference
@pytest.mark.slow
def test_zuo2025_trained_smoke_interrupted_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT once two models are finished; --resume runs only the others."""
    out = tmp_path / "zuo-trained"
    argv = ["reproduce", "zuo2025", "--part", "trained", "--scale", "smoke", "--device", "cpu"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        first = subprocess.Popen(
            [sys.executable, "-m", "nopelab", *argv, "--out", str(out)], cwd=tmp_path, stderr=stderr
        )
        deadline = time.monotonic() + 300
        while len(list(out.glob(f"runs/*/{DONE}"))) < 2 and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()
            time.sleep(0.2)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 130
    assert "finished models are kept" in log.read_text()
    # the models' own progress lines reach the command's stderr, named by the model
    assert re.search(r"^[a-z]+-none(-stage1)? step \d+/\d+: loss", log.read_text(), re.M)
    assert (out / "reproduction.json").is_file() and not (out / "summary.md").exists()
    kept = {p: p.stat().st_mtime_ns for p in out.glob(f"runs/*/{DONE}")}
    assert 2 <= len(kept) < 12
    with pytest.raises(SystemExit) as info:  # another seed is another run
        reproduce(["zuo2025", "--part", "trained", "--out", str(out), "--resume", "--seed", "1"],
                  monkeypatch)  # fmt: skip
    assert info.value.code == 2
    reproduce(["zuo2025", "--part", "trained", "--out", str(out), "--resume"], monkeypatch)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished models were not run again
    assert len(list(out.glob(f"runs/*/{DONE}"))) == 12
    with pytest.raises(SystemExit) as info:
        reproduce(["zuo2025", "--part", "trained", "--out", str(out), "--resume"], monkeypatch)
    assert info.value.code == 2  # finished

    # the same numbers as an uninterrupted run
    whole = tmp_path / "whole"
    reproduce(["zuo2025", "--part", "trained", "--out", str(whole)], monkeypatch)
    timing = ["train_seconds", "tokens_per_second"]
    for name in ("accuracy.parquet", "scores.parquet"):
        a, b = (
            pd.read_parquet(f / name).drop(columns=timing, errors="ignore") for f in (out, whole)
        )
        pd.testing.assert_frame_equal(a, b)
    assert_matches_reference(whole, "zuo2025-trained")

    accuracy = pd.read_parquet(out / "accuracy.parquet")
    assert len(accuracy) == 4 * 3 and accuracy["accuracy"].between(0, 1).all()
    for row in accuracy.itertuples():
        summary = json.loads(
            (out / "runs" / f"{row.task}-{row.pos_encoding}" / "summary.json").read_text()
        )
        assert summary["final_eval"]["accuracy"] == row.accuracy
    scores = pd.read_parquet(out / "scores.parquet")
    assert set(scores["site"]) == {"attn_heads", "attn_out", "resid_post"}
    # Zuo et al.'s protocol: one test prompt per sequence, left-padded to the longest prompt
    analysis = json.loads(
        (out / "runs" / "reverse-none" / "analysis-init" / "config.json").read_text()
    )
    assert analysis["analysis"]["input"] == "prompts"
    assert analysis["analysis"]["seq_len"] == len("rev(999)=")
    attn = scores[scores["site"] == "attn_heads"]
    assert set(attn["state"]) == {"init", "trained"}
    assert set(attn["task"]) == {"add", "reverse", "order", "wherex"}
    # a causal model at normal(0.02) init shows the pattern on task lines too
    init = attn[attn["state"] == "init"]
    assert init["adjacency_mean"].min() > 0.7
    # init and trained states of one run differ: the analysis really loaded the checkpoint
    one = attn[(attn["task"] == "reverse") & (attn["pos_encoding"] == "none")]
    by_state = one.set_index(["state", "layer"])["adjacency_mean"]
    assert (by_state["init"] - by_state["trained"]).abs().max() > 1e-4
    text = (out / "summary.md").read_text()
    assert "Test accuracy" in text and "| reverse | none | trained |" in text
    assert "## Adjacency score at `attn_heads`" in text
    for name in ("heatmaps.png", "scores-attn_heads.png", "scores-attn_out.png"):
        assert (out / name).stat().st_size > 0
    run = out / "runs" / "add-rope"
    for name in ("model.safetensors", "summary.json", "analysis-init/positions.parquet"):
        assert (run / name).exists()
    # wherex goes through a curriculum (as 9-digit wherex at medium): 2-digit lines first
    for pe in ("none", "learned", "rope"):
        stage = out / "runs" / f"wherex-{pe}-stage1"
        assert json.loads((stage / "config.json").read_text())["task"]["max_len"] == 2
        config = json.loads((out / "runs" / f"wherex-{pe}" / "config.json").read_text())
        assert config["train"]["init_from"] == str(stage.absolute())
    staged = accuracy.set_index(["task", "pos_encoding"])["curriculum"]
    assert staged["wherex"].str.match(r"max_len 2, \d+ steps: ").all()
    assert (staged.drop(index="wherex", level="task") == "").all()
    assert "Trained through a curriculum" in text


@pytest.mark.reference
@pytest.mark.slow
def test_chi2023_pretrained_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "chi-pretrained"
    reproduce(["chi2023", "--part", "pretrained", "--out", str(out)], monkeypatch)
    ppl = pd.read_parquet(out / "perplexity.parquet").set_index("pos_encoding")
    assert list(ppl.index) == ["none", "learned", "rope"]
    # 20 steps already beat the uniform byte model (perplexity 256)
    assert (ppl["perplexity"] < 256).all() and ppl["perplexity_4x"].notna().all()
    layers = pd.read_parquet(out / "layers.parquet")
    nope_init = layers[(layers["pos_encoding"] == "none") & (layers["state"] == "init")]
    assert (nope_init["slope"] < -0.3).all()  # random init: variance falls with position
    assert "does the variance shrinkage survive training" in (out / "summary.md").read_text()
    assert (out / "variance.png").stat().st_size > 0
    assert (out / "runs" / "lm-none" / "tokenizer.json").is_file()
    assert_matches_reference(out, "chi2023-pretrained")
    # the decay along training: init, then the two checkpoints kept (10 and 20 of 20 steps)
    along = pd.read_parquet(out / "along.parquet")
    assert sorted(along["step"].unique()) == [0, 10, 20]
    assert (along["tokens"] == along["step"] * 8 * 32).all()
    kept = out / "runs" / "lm-none" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir()) == ["step-10.safetensors", "step-20.safetensors"]
    final = (out / "runs" / "lm-none" / "model.safetensors").read_bytes()
    assert (kept / "step-20.safetensors").read_bytes() == final
    # at init and at the last checkpoint, the same weights and windows as the two analyses
    for step, state in ((0, "init"), (20, "trained")):
        ends = along[along["step"] == step].set_index(["pos_encoding", "layer"])
        states = layers[layers["state"] == state].set_index(["pos_encoding", "layer"])
        pd.testing.assert_series_equal(
            ends["first_over_last"], states["first_over_last"].loc[ends.index]
        )
    assert (out / "along.png").stat().st_size > 0
    # summary.md tabulates both along training: NoPE layer 1's slope at init, as measured
    text = (out / "summary.md").read_text()
    slopes = text.split("The log-log slope of Var(attn_out)")[1]
    nope_1 = along.set_index(["pos_encoding", "layer", "step"])["slope"]["none", 1, 0]
    assert f"| NoPE | 1 | {nope_1:.2f} |" in slopes

    # the models ran in worker processes of one thread; one after another here, the numbers are equal
    monkeypatch.setattr(chi2023_pretrained, "default_workers", lambda device: 1)
    serial = tmp_path / "serial"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reproduce(["chi2023", "--part", "pretrained", "--out", str(serial)], monkeypatch)
    finally:
        torch.set_num_threads(threads)
    pd.testing.assert_frame_equal(
        pd.read_parquet(serial / "layers.parquet"), pd.read_parquet(out / "layers.parquet")
    )
    speed = ["tokens_per_second"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(serial / "perplexity.parquet").drop(columns=speed),
        pd.read_parquet(out / "perplexity.parquet").drop(columns=speed),
    )


@pytest.mark.slow
def test_a_reproduction_trains_on_the_corpus_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "on-sotu"
    argv = ["chi2023", "--part", "pretrained", "--corpus", "sotu+default", "--out", str(out)]
    reproduce(argv, monkeypatch)
    both = "the embedded State of the Union addresses 1790-2021 followed by the embedded World"
    assert both in " ".join((out / "summary.md").read_text().split())
    for pe in ("none", "learned", "rope"):
        config = json.loads((out / "runs" / f"lm-{pe}" / "config.json").read_text())
        assert config["corpus"]["source"] == "sotu+default"
    assert json.loads((out / "reproduction.json").read_text())["corpus"] == "sotu+default"
    # a resume must name the same corpus: without it, the folder holds another run
    with pytest.raises(SystemExit) as info:
        reproduce(["chi2023", "--part", "pretrained", "--out", str(out), "--resume"], monkeypatch)
    assert info.value.code == 2
    message = "--resume: corpus is the scale's own but the run was started with 'sotu+default'"
    assert message in capsys.readouterr().err


@pytest.mark.reference
@pytest.mark.slow
def test_haviv2022_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "haviv"
    reproduce(["haviv2022", "--out", str(out)], monkeypatch)
    ppl = pd.read_parquet(out / "perplexity.parquet").set_index("pos_encoding")
    assert list(ppl.index) == ["none", "learned", "sinusoidal", "alibi"]
    assert (ppl["perplexity"] < 256).all()  # 20 steps beat the uniform byte model
    probes = pd.read_parquet(out / "probes.parquet")
    assert set(probes["probe"]) == {"linear-cls", "mlp-cls"}
    assert sorted(probes["layer"].unique()) == [0, 1, 2]  # embed, then each block's output
    assert (probes["seeds"] >= 3).all() and probes["mad_std"].notna().all()
    T = 32
    assert probes["random_baseline"].eq((T * T - 1) / (3 * T)).all()
    assert probes["baseline"].between(0.2 * T, 0.3 * T).all()  # predict the middle: ≈ T/4
    embed = probes[probes["layer"] == 0].set_index(["pos_encoding", "probe"])["mad"]
    # input-level encodings put position into the embedding; NoPE and ALiBi cannot
    for pe in ("learned", "sinusoidal"):
        assert embed[pe].max() < 0.25 * T / 4
    for pe in ("none", "alibi"):
        assert embed[pe].min() > 0.8 * T / 4
    published = pd.read_parquet(out / "published.parquet")
    nope = published[published["pos_encoding"] == "none"].set_index("layer")["mad"]
    assert nope[6] == 16.5 and nope.idxmin() == 6
    text = (out / "summary.md").read_text()
    assert "341.33" in text and "shape" in text.lower() and "| none | linear-cls |" in text
    assert (out / "probes.png").stat().st_size > 0
    assert (out / "runs" / "lm-alibi" / "model.safetensors").is_file()
    assert_matches_reference(out, "haviv2022-pretrained")


@pytest.mark.slow
def test_haviv2022_mask_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Causal and masked LMs: the tables; a causal model's outputs never depend on a later
    token and a masked LM's do; bidirectional NoPE has no position to probe; the shuffle of
    no prefix is the plain loss."""
    out = tmp_path / "mask"
    reproduce(["haviv2022", "--part", "mask", "--scale", "smoke", "--out", str(out)], monkeypatch)
    ppl = pd.read_parquet(out / "perplexity.parquet")
    assert len(ppl) == 8 and set(ppl["kind"]) == {"causal", "mlm"} and set(ppl["seed"]) == {0, 1}
    assert (ppl["perplexity"] < 256).all()
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    later = x.clone()
    later[:, 20:] = (later[:, 20:] + 1) % 256  # only the tokens from position 20 on change
    for kind in ("causal", "mlm"):
        model = load_trained(out / "runs" / f"{kind}-none-seed0")[1]
        with torch.no_grad():
            same = torch.equal(model(x)[:, :20], model(later)[:, :20])
        assert same == (kind == "causal"), kind
        assert model.cfg.bidirectional == (kind == "mlm") and model.cfg.vocab_size == (
            256 if kind == "causal" else 257
        )
    probes = pd.read_parquet(out / "probes.parquet")
    bag = probes[(probes["kind"] == "mlm") & (probes["pos_encoding"] == "none")]
    assert (bag["mad_fraction"] > 0.8).all()  # blind to order: nothing to probe
    layers = pd.read_parquet(out / "layers.parquet")
    assert set(layers["state"]) == {"init", "trained"} and (layers["variance_ratio"] > 0).all()
    shuffle = pd.read_parquet(out / "shuffle.parquet")
    assert set(shuffle["kind"]) == {"causal"} and sorted(set(shuffle["k"])) == [0, 8, 16, 31]
    plain = shuffle[shuffle["k"] == 0]
    assert (plain["loss"] == plain["unshuffled_loss"]).all() and (plain["rise"] == 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["published"]["perplexity"] == {"none": 147.0, "positions": 4.06}
    assert summary["verdict"]["mlm_none_lowest_mad_fraction"] > 0
    text = (out / "summary.md").read_text()
    assert "(masked LMs): 147 without a positional" in text and "## Prefix shuffle" in text
    assert (out / "shuffle.png").stat().st_size > 0


@pytest.mark.reference
@pytest.mark.slow
def test_zuo2025_probes_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "zuo-probes"
    reproduce(["zuo2025", "--part", "probes", "--out", str(out)], monkeypatch)
    probes = pd.read_parquet(out / "probes.parquet")
    assert set(probes["model"]) == {"random-init", "add", "reverse", "order", "wherex"}
    assert set(probes["target"]) == {"position", "distance"}
    assert set(probes["features"]) == {
        "raw", "norm", "variance", "cos_last", "cos_row", "norm+cos_last"
    }  # fmt: skip
    assert set(probes["site"]) == {"attn_heads", "attn_out"} and (probes["split"] == "vocab").all()
    assert len(probes) == 5 * 2 * 6 * 2 * 2  # models x targets x features x sites x layers
    assert (probes["seeds"] >= 3).all() and probes["baseline"].between(3, 5).all()  # T/4 = 4
    # at random init the attention output's similarity to other tokens carries position, on
    # tokens the probe never saw (Zuo et al.)
    random = probes[(probes["model"] == "random-init") & (probes["target"] == "position")]
    best = random.groupby("features")["mae"].min()
    assert best["cos_last"] < 0.8 * 4 and best["cos_row"] < 0.8 * 4
    verdict = pd.read_parquet(out / "verdict.parquet")
    assert len(verdict) == 5 * 2 * 2 * 2
    assert set(verdict["winner"]) <= {"variance", "norm", "similarity"}
    text = (out / "summary.md").read_text()
    assert "## Verdict" in text and "Overall:" in text
    assert (out / "probes.png").stat().st_size > 0
    assert_matches_reference(out, "zuo2025-probes")

    # --models: the same numbers from the trained part's models, without training them again
    trained = tmp_path / "zuo-trained"
    reproduce(["zuo2025", "--part", "trained", "--out", str(trained)], monkeypatch)
    reused = tmp_path / "zuo-probes-reused"
    args = ["zuo2025", "--part", "probes", "--models", str(trained), "--out", str(reused)]
    reproduce(args, monkeypatch)
    assert not list((reused / "runs").rglob("*.safetensors"))  # only the probes' files
    pd.testing.assert_frame_equal(pd.read_parquet(reused / "probes.parquet"), probes)
    for bad in (["--seed", "1"], ["--part", "trained"]):
        with pytest.raises(SystemExit) as info:
            reproduce([*args, *bad, "--out", str(tmp_path / "no")], monkeypatch)
        assert info.value.code == 2
    assert not (tmp_path / "no").exists()


# ------------------------------------------------------------------------ paper scale


@pytest.mark.parametrize(
    "paper, part",
    [
        pytest.param(
            paper,
            part,
            marks=[pytest.mark.slow] if (paper, part) == ("zuo2025", "trained") else [],
        )  # zuo2025 trained builds its whole curriculum's settings
        for paper, e in EXPERIMENTS.items()
        for part, runner in e.parts.items()
        if "paper" in runner.scales
    ],
)
def test_paper_scale_settings_are_valid(paper: str, part: str) -> None:
    """`--scale paper` is meant for a GPU and too slow to run here; its settings must at least
    validate, and every model it builds must run at its training and analysis lengths (shapes
    only: the forward pass runs on the meta device, no memory, no arithmetic)."""
    settings = EXPERIMENTS[paper].parts[part].settings("paper", 0, "cpu")
    analyses = [getattr(settings, "analysis", None), *getattr(settings, "analyses", {}).values()]
    analysed = {a.seq_len for a in analyses if a is not None}
    models = []  # (model config, sequence lengths it must take)
    for run in [getattr(settings, "cfg", None), *getattr(settings, "runs", {}).values()]:
        if isinstance(run, TrainRun):
            models.append((run.model, {run.train.seq_len, *analysed}))
        elif isinstance(run, RunConfig):
            models.append((run.model, {run.analysis.seq_len}))
    if isinstance(getattr(settings, "model", None), ModelConfig):  # one frozen model (a study)
        models.append((settings.model, {settings.seq_len}))
    assert models or paper == "real-model"  # that one loads released weights instead
    for model_cfg, lengths in models:
        with torch.device("meta"):
            model = Transformer(model_cfg)
            for T in lengths:
                logits = model(torch.zeros(2, T, dtype=torch.long))
                assert logits.shape == (2, T, model_cfg.vocab_size)


# ------------------------------------------------------------- training several models


def tiny_task_run(steps: int = 6) -> TrainRun:
    return TrainRun(
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16),
        train=TrainConfig(
            steps=steps, batch_size=4, seq_len=16, eval_every=3, checkpoint_every=2, device="cpu"
        ),
        task=TaskConfig(max_len=2, train_size=200, test_size=16, layout="padded"),
    )


def test_train_into_continues_a_stopped_run_and_reads_a_finished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tiny_task_run()
    train(run, tmp_path / "whole", progress=False)
    whole = pd.read_csv(tmp_path / "whole" / "metrics.csv")
    folder = tmp_path / "cut"
    train(run, folder, progress=False, stop_after=4)
    summary = train_into(run, folder)
    pd.testing.assert_frame_equal(
        pd.read_csv(folder / "metrics.csv").drop(columns="tokens_per_second"),
        whole.drop(columns="tokens_per_second"),
    )

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(trained_module, "train", no_training)
    assert train_into(run, folder) == summary
    # ... but only as the run it was: a finished run is not read back as another
    other = dataclasses.replace(run, task=dataclasses.replace(run.task, max_len=3))
    with pytest.raises(UserError, match=r"task.max_len = 2, but this run asks for 3"):
        train_into(other, folder)
    moved = dataclasses.replace(run, train=dataclasses.replace(run.train, device="auto"))
    assert train_into(moved, folder) == summary
    # a run killed before its first checkpoint starts over; a folder nopelab did not write is kept
    monkeypatch.undo()
    early = tmp_path / "early"
    early.mkdir(parents=True)
    (early / "config.json").write_text("{}")
    with pytest.raises(UserError, match="does not hold a nopelab run"):
        train_into(run, early)
    assert (early / "config.json").read_text() == "{}"
    write_marker(early, "nopelab train")
    assert train_into(run, early)["steps"] == 6


@pytest.mark.slow  # trains three curriculum stages
def test_train_into_runs_a_curriculum_stage_by_stage(tmp_path: Path) -> None:
    """Each stage starts from the one before, as `nopelab train --init-from` would, and a
    finished curriculum is read back, not retrained."""
    final = tiny_task_run()
    first_task = dataclasses.replace(final.task, max_len=1, train_size=60, test_size=8)
    first = dataclasses.replace(final, task=first_task)
    folder = tmp_path / "runs" / "wherex-none"
    summary = train_into(final, folder, stages=(first,))
    stage = stage_folder(folder, 1)
    assert json.loads((stage / "config.json").read_text())["task"]["max_len"] == 1
    assert json.loads((folder / "config.json").read_text())["train"]["init_from"] == str(
        stage.absolute()
    )

    by_hand = tmp_path / "by-hand"
    train(first, by_hand / "first", progress=False)
    init_from = dataclasses.replace(final.train, init_from=str(by_hand / "first"))
    train(dataclasses.replace(final, train=init_from), by_hand / "final", progress=False)
    scratch = tmp_path / "scratch"
    train(final, scratch, progress=False)
    weights = {f: load_file(f / "model.safetensors") for f in (folder, by_hand / "final", scratch)}
    for name, tensor in weights[folder].items():
        assert torch.equal(tensor, weights[by_hand / "final"][name])
    assert any(not torch.equal(t, weights[scratch][n]) for n, t in weights[folder].items())

    written = {p: p.stat().st_mtime_ns for p in (stage / "summary.json", folder / "summary.json")}
    assert train_into(final, folder, stages=(first,)) == summary
    assert {p: p.stat().st_mtime_ns for p in written} == written

    # a curriculum read back must be the one asked for, stage by stage, wherever it now lies
    moved = tmp_path / "moved" / folder.name
    shutil.copytree(folder, moved)
    shutil.copytree(stage, stage_folder(moved, 1))
    check_trained(final, (first,), moved)
    other_first = dataclasses.replace(first, task=dataclasses.replace(first_task, max_len=2))
    with pytest.raises(UserError, match=r"wherex-none-stage1 holds a run finished with task"):
        check_trained(final, (other_first,), moved)
    with pytest.raises(UserError, match=r"train.init_from = 'wherex-none-stage1', but this run"):
        check_trained(final, (), moved)  # no curriculum any more


def test_language_models_keeping_no_checkpoints_write_one_at_every_evaluation(
    tmp_path: Path,
) -> None:
    """A stopped model of a reproduction loses at most one evaluation's steps; how often a model
    that keeps no checkpoints wrote one is no setting a finished folder is refused for, but
    which checkpoints a model keeps is."""
    train_cfg = {"steps": 12, "batch_size": 4, "seq_len": 16}
    model = {"d_model": 16, "n_layers": 1, "n_heads": 2}
    run = lm_runs(("none",), model, train_cfg, seed=0, device="cpu", evaluations=4)["none"]
    assert (run.train.eval_every, run.train.checkpoint_every) == (3, 3)
    assert not run.train.keep_checkpoints
    kept = lm_runs(("none",), model, train_cfg, seed=0, device="cpu", kept=2)["none"]
    assert (kept.train.checkpoint_every, kept.train.keep_checkpoints) == (6, True)

    task = tiny_task_run()
    train(task, tmp_path / "m", progress=False)
    every = dataclasses.replace(task.train, checkpoint_every=task.train.steps)
    check_trained(dataclasses.replace(task, train=every), (), tmp_path / "m")
    # a run an older nopelab stopped (a checkpoint at every other step) goes on as it started
    train(task, tmp_path / "cut", progress=False, stop_after=4)
    resumed = train_into(dataclasses.replace(task, train=every), tmp_path / "cut")
    assert resumed["steps"] == task.train.steps
    keeping = dataclasses.replace(every, keep_checkpoints=True)
    with pytest.raises(UserError, match=r"train.checkpoint_every = 2, but this run asks for 6"):
        check_trained(dataclasses.replace(task, train=keeping), (), tmp_path / "m")


def test_a_resumed_job_refuses_a_model_finished_with_other_settings(tmp_path: Path) -> None:
    """run_jobs does not run a finished job again; resumed with other settings (a scale
    changed), it refuses the job's folder before running anything."""
    run, root = tiny_task_run(), tmp_path / "runs"
    other = dataclasses.replace(run, task=dataclasses.replace(run.task, max_len=3))
    assert run_jobs([training_job("m", train_into, (run,), run)], root, "t", 1)["done"] == 1
    files = {p: p.stat().st_mtime_ns for p in (root / "m").iterdir()}
    jobs = [
        training_job("m", train_into, (other,), other),
        training_job("n", train_into, (run,), run),
    ]
    with pytest.raises(UserError, match=r"runs/m holds a run finished with task.max_len = 2, but"):
        run_jobs(jobs, root, "t", 1)
    assert not (root / "n").exists()
    assert {p: p.stat().st_mtime_ns for p in (root / "m").iterdir()} == files
    counts = run_jobs([training_job("m", train_into, (run,), run)], root, "t", 1)
    assert counts["skipped"] == 1


@pytest.mark.reference
@pytest.mark.slow
def test_haviv2022_sizes_smoke_and_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sizes"
    reproduce(["haviv2022", "--part", "sizes", "--out", str(out)], monkeypatch)
    assert_matches_reference(out, "haviv2022-sizes")
    models = pd.read_parquet(out / "models.parquet")
    assert len(models) == 2 * 5  # two sizes, five encodings, one seed
    for _, row in models.iterrows():  # the size's NoPE parameters, counted on a real model
        cfg = ModelConfig(d_model=row["d_model"], n_layers=row["n_layers"], n_heads=2)
        built = Transformer(dataclasses.replace(cfg, vocab_size=256, max_seq_len=128))
        assert row["parameters"] == sum(p.numel() for p in built.parameters())
        # the budget: max(0.5 x parameters, 4096) tokens, rounded up to whole steps of 8 x 32
        budget = max(0.5 * row["parameters"], 4096)
        assert budget <= row["tokens"] < budget + 256 and row["tokens"] % 256 == 0
    assert (models["perplexity"] < 256).all()  # better than the uniform byte model
    gaps = pd.read_parquet(out / "gaps.parquet")
    nope = models[models["pos_encoding"] == "none"].set_index("size")["perplexity"]
    for _, row in gaps.iterrows():
        mine = models[
            (models["size"] == row["size"]) & (models["pos_encoding"] == row["pos_encoding"])
        ]
        want = 100 * (mine["perplexity"].iloc[0] / nope[row["size"]] - 1)
        assert row["gap_percent"] == pytest.approx(want)
    summary = json.loads((out / "summary.json").read_text())
    alibi = [r for r in summary["published"] if r["pos_encoding"] == "alibi"]
    assert alibi[0]["gap_percent"] == pytest.approx(100 * (19.94 / 22.15 - 1))
    assert set(summary["verdict"]["gap_with_size"]) == {"learned", "sinusoidal", "rope", "alibi"}
    text = (out / "summary.md").read_text()
    assert "Haviv et al., Table 2" in text and "| RoPE |" in text and "one seed" in text
    assert "language models on the embedded World English Bible, one per size" in text
    for name in ("sizes.png", "curves.png"):
        assert (out / name).stat().st_size > 0

    # interrupted after some models: --resume trains only the others, to the same numbers
    kept = {p.name: (p / "summary.json").stat().st_mtime_ns for p in (out / "runs").iterdir()}
    for name in ("size2-rope-seed0", "size2-alibi-seed0"):
        shutil.rmtree(out / "runs" / name)
        del kept[name]
    for name in ("models.parquet", "summary.json", "summary.md"):
        (out / name).unlink()
    reproduce(["haviv2022", "--part", "sizes", "--out", str(out), "--resume"], monkeypatch)
    for name, mtime in kept.items():
        assert (out / "runs" / name / "summary.json").stat().st_mtime_ns == mtime
    again = pd.read_parquet(out / "models.parquet")
    timing = ["train_seconds"]
    pd.testing.assert_frame_equal(again.drop(columns=timing), models.drop(columns=timing))


@pytest.mark.slow
def test_haviv2022_sizes_over_a_bpe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tokenizer bpe``: the scale's BPE models, their parameters with the BPE's embedding,
    their budget in BPE tokens, perplexity per token and the loss per byte beside it."""
    out = tmp_path / "sizes-bpe"
    reproduce(
        ["haviv2022", "--part", "sizes", "--tokenizer", "bpe", "--out", str(out)], monkeypatch
    )
    models = pd.read_parquet(out / "models.parquet")
    assert len(models) == 2 * 5
    for _, row in models.iterrows():
        cfg = ModelConfig(d_model=row["d_model"], n_layers=row["n_layers"], n_heads=2)
        built = Transformer(dataclasses.replace(cfg, vocab_size=300, max_seq_len=64))
        assert row["parameters"] == sum(p.numel() for p in built.parameters())
        # max(0.2 x parameters, 2048) BPE tokens, rounded up to whole steps of 8 x 16
        budget = max(0.2 * row["parameters"], 2048)
        assert budget <= row["tokens"] < budget + 128 and row["tokens"] % 128 == 0
        run = json.loads(
            (
                out / "runs" / f"size{row['size']}-{row['pos_encoding']}-seed0" / "config.json"
            ).read_text()
        )
        assert (run["corpus"]["tokenizer"], run["corpus"]["bpe_vocab"]) == ("bpe", 300)
    assert (models["perplexity"] < 300).all()  # better than the uniform model over the BPE
    # a BPE token holds more than a byte: less loss per byte than per token
    assert (models["loss_per_byte"] < models["loss"]).all()
    corpus = models["tokens"] / models["epochs"]  # the training split in BPE tokens
    assert corpus.nunique() == 1 and 0.95 * 4e6 / 5 < corpus.iloc[0] < 0.95 * 4.4e6
    text = (out / "summary.md").read_text()
    assert "byte-level BPE of 300 tokens" in text and "perplexity per token" in text


@pytest.mark.reference
@pytest.mark.slow
def test_chi2023_probe_study_smoke_and_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "study"
    reproduce(["chi2023", "--part", "probe-study", "--out", str(out)], monkeypatch)
    assert_matches_reference(out, "chi2023-probe-study")
    probes = pd.read_parquet(out / "probes.parquet")
    cells = probes.groupby(["input", "site", "layer", "features", "probe", "samples"]).size()
    assert len(cells) == 2 * 2 * 2 * 3 * 2 * 2 and (cells == 1).all()  # every cell, once
    T, d, sigma = 32, 32, 0.02
    assert probes["baseline"].between(0.9 * T / 4, 1.1 * T / 4).all()  # predict the middle
    # the position signal rides on the input: ‖x‖² ≈ d for N(0, 1) vectors, ≈ dσ² for token
    # embeddings N(0, σ²); layer 1's attention output starts at ≈ d³σ⁴ whatever the input
    norms = pd.read_parquet(out / "norms.parquet").set_index(["input", "position"])
    assert norms.loc["random", "input_norm2"].mean() == pytest.approx(d, rel=0.05)
    assert norms.loc["text", "input_norm2"].mean() == pytest.approx(d * sigma**2, rel=0.3)
    for kind in ("random", "text"):
        first = norms.loc[(kind, 1), "attn_out_norm2"]
        assert first == pytest.approx(d**3 * sigma**4, rel=0.5)
        assert norms.loc[(kind, T), "attn_out_norm2"] < first / 4  # it shrinks with position
    # the log-variance of layer 1's attention output reads position (Chi et al.'s signal; at
    # smoke scale the MLP's 3 epochs are too few, ridge gets it)
    layer1 = probes[(probes["site"] == "attn_out") & (probes["layer"] == 1)]
    variance = layer1[(layer1["features"] == "variance") & (layer1["samples"] == 16)]
    ridge = variance[variance["probe"] == "linear-reg"]
    assert len(ridge) == 2 and (ridge["mae"] < 0.7 * ridge["baseline"]).all()
    summary = json.loads((out / "summary.json").read_text())
    assert {(f["input"], f["site"]) for f in summary["findings"]} == {
        (kind, site) for kind in ("random", "text") for site in ("attn_out", "resid_post")
    }
    text = (out / "summary.md").read_text()
    assert "| random | attn_out | mlp-reg | " in text and "16 sequences" in text
    assert (out / "study.png").stat().st_size > 0

    # interrupted after one input: --resume collects and probes only the other, to the same rows
    shutil.rmtree(out / "inputs" / "text")
    for name in ("probes.parquet", "summary.json", "summary.md"):
        (out / name).unlink()
    kept = (out / "inputs" / "random" / "probes.parquet").stat().st_mtime_ns
    reproduce(["chi2023", "--part", "probe-study", "--out", str(out), "--resume"], monkeypatch)
    assert (out / "inputs" / "random" / "probes.parquet").stat().st_mtime_ns == kept
    again = pd.read_parquet(out / "probes.parquet")
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), probes.drop(columns="seconds"))

    # interrupted inside an input, after some of its sites and layers: --resume fits only the rest
    random = out / "inputs" / "random"
    for name in ("probes.parquet", "summary.json", "summary.md"):
        (out / name).unlink()
    for name in ("done.json", "probes.parquet", "fits/resid_post-2.parquet"):
        (random / name).unlink()
    fitted = {p.name: p.stat().st_mtime_ns for p in (random / "fits").iterdir()}
    assert sorted(fitted) == ["attn_out-1.parquet", "attn_out-2.parquet", "resid_post-1.parquet"]
    reproduce(["chi2023", "--part", "probe-study", "--out", str(out), "--resume"], monkeypatch)
    assert {
        p.name: p.stat().st_mtime_ns for p in (random / "fits").iterdir() if p.name in fitted
    } == fitted
    assert (random / "fits" / "resid_post-2.parquet").is_file()
    again = pd.read_parquet(out / "probes.parquet")
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), probes.drop(columns="seconds"))
