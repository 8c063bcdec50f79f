"""``nopelab headscale``: a frozen language model's attention logits scaled per head (trained)
or uniformly, written as a training run that the other commands read."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import helpers
from helpers import run_cli


def _two_layers(folder: Path, **model: Any) -> Path:
    return helpers.text_run(folder, n_layers=2, **model)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _two_layers(tmp_path_factory.mktemp("nope"))


def headscale(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["headscale", *args, "--device", "cpu"], monkeypatch) == 0


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model.safetensors"))


def test_trained_head_scales_reload_as_a_run(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from nopelab.api import load
    from nopelab.training.headscale import HeadScaleTraining, rescaled, train_head_scales
    from nopelab.training.sources import TextSource
    from nopelab.training.trained import load_trained, make_source

    out = tmp_path / "scaled"
    args = [str(text_run), "--length", "2", "--steps", "5", "--lr", "0.1", "--init-scale", "1.3"]
    headscale([*args, "--seed", "3", "--out", str(out)], monkeypatch)
    progress = [line for line in capsys.readouterr().err.splitlines() if " step " in line]
    assert len(progress) == 5 and progress[-1].startswith("headscale step 5/5: loss ")
    record = json.loads((out / "headscale.json").read_text())
    assert (record["mode"], record["length"], record["train_len"]) == ("head_scales", 32, 16)
    assert (record["init_scale"], record["lr"], record["seed"], len(record["loss"])) == (
        1.3, 0.1, 3, 5
    )  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["head_scales"] is True and config["model"]["logit_scale"] == 1.3
    assert config["train"] == json.loads((text_run / "config.json").read_text())["train"]
    # the frozen weights are the run's, bit for bit; the scales are new and moved
    before, after = weights(text_run), weights(out)
    scale_names = {name for name in after if name.endswith("head_scale")}
    assert len(scale_names) == 2 and set(after) - scale_names == set(before)
    assert all(torch.equal(after[name], before[name]) for name in before)
    study = load(out, analysis={"seq_len": 32, "samples": 2})  # the library's run loader
    reloaded = study.model
    scales = [block.attn.head_scale.tolist() for block in reloaded.blocks]
    assert scales == record["scales"] and scales != [[1.3, 1.3], [1.3, 1.3]]
    # the same training in memory gives the same model
    run, model = load_trained(text_run)
    source = make_source(run, text_run)
    assert isinstance(source, TextSource)
    settings = HeadScaleTraining(
        length_factor=2, length=32, steps=5, lr=0.1, init_scale=1.3, batch_size=4, seed=3
    )
    memory = rescaled(model, 1.3, head_scales=True)
    losses, _ = train_head_scales(memory, source, settings, torch.device("cpu"), nullcontext)
    assert losses == record["loss"]
    idx = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(idx), memory.eval()(idx))


def test_other_commands_read_the_run(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "scaled"
    headscale([str(text_run), "--length", "2", "--steps", "2", "--out", str(out)], monkeypatch)
    fitted = 1 + 0.3973 * torch.log(torch.tensor(2.0)).item()  # Wang et al.'s fit at 2x
    assert json.loads((out / "headscale.json").read_text())["init_scale"] == pytest.approx(fitted)
    evaluate = ["evaluate", str(out), "--lengths", "1,2", "--device", "cpu"]
    assert run_cli([*evaluate, "--out", str(tmp_path / "eval")], monkeypatch) == 0
    analyze = ["analyze", str(out), "--seq-len", "32", "--samples", "2", "--device", "cpu"]
    assert run_cli([*analyze, "--out", str(tmp_path / "analyze")], monkeypatch) == 0


def test_train_resumes_a_uniformly_scaled_run_and_refuses_a_head_scaled_one(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    steps = json.loads((text_run / "config.json").read_text())["train"]["steps"]
    more = ["train", "--resume", "--steps", str(steps + 2), "--device", "cpu", "--out"]
    uniform, scaled = tmp_path / "uniform", tmp_path / "scaled"
    headscale([str(text_run), "--uniform", "1.5", "--out", str(uniform)], monkeypatch)
    assert run_cli([*more, str(uniform)], monkeypatch) == 0  # a run like any other
    assert json.loads((uniform / "trainer_state.json").read_text())["step"] == steps + 2
    headscale([str(text_run), "--length", "2", "--steps", "1", "--out", str(scaled)], monkeypatch)
    before = {p.name: p.read_bytes() for p in scaled.iterdir()}
    capsys.readouterr()
    for resume in (more, ["train", "--resume", "--device", "cpu", "--out"]):  # with --steps, or not
        assert run_cli([*resume, str(scaled)], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("nopelab: error: --resume: "), err
        assert "holds head scales trained on a frozen model" in err
    assert {p.name: p.read_bytes() for p in scaled.iterdir()} == before


def test_the_scales_never_drop_below_one(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "scaled"
    args = ["--length", "1", "--steps", "4", "--lr", "10", "--init-scale", "1"]
    headscale([str(text_run), *args, "--out", str(out)], monkeypatch)
    scales = torch.tensor(json.loads((out / "headscale.json").read_text())["scales"])
    assert scales.min() == 1.0  # an lr of 10 pushes below 1 at once: the clamp holds them
    stored = torch.cat([w for name, w in weights(out).items() if name.endswith("head_scale")])
    assert stored.min() == 1.0


def test_a_uniform_scale_is_a_rescaled_copy(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nopelab.training.headscale import rescaled
    from nopelab.training.trained import load_trained

    out = tmp_path / "uniform"
    headscale([str(text_run), "--uniform", "1.5", "--out", str(out)], monkeypatch)
    config = json.loads((out / "config.json").read_text())
    assert (config["model"]["logit_scale"], config["model"]["head_scales"]) == (1.5, False)
    assert json.loads((out / "headscale.json").read_text())["scales"] == [[1.5, 1.5]] * 2
    before, after = weights(text_run), weights(out)
    assert set(before) == set(after) and all(torch.equal(after[k], before[k]) for k in before)
    _, model = load_trained(text_run)
    _, copy = load_trained(out)
    idx = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(copy(idx), rescaled(model, 1.5, head_scales=False)(idx))
        assert not torch.allclose(copy(idx), model(idx))


BAD = [
    (["--length", "0.5"], "--length: must be a finite number >= 1, got 0.5"),
    (["--length", "nan"], "--length: must be a finite number, got nan"),
    (["--length", "2", "--init-scale", "0"], "--init-scale: must be a finite number >= 1, got 0"),
    (["--length", "2", "--init-scale", "inf"], "--init-scale: must be a finite number, got inf"),
    (["--length", "2", "--lr", "0"], "--lr: must be a finite number > 0, got 0"),
    (["--length", "2", "--lr", "-1"], "--lr: must be a finite number > 0, got -1"),
    (["--length", "2", "--steps", "0"], "--steps: must be > 0, got 0"),
    (["--length", "2", "--batch-size", "0"], "--batch-size: must be > 0, got 0"),
    (["--length", "1000"], "--length: 1000x is 16000 tokens; the training text has"),
    (["--uniform", "0"], "--uniform: must be a finite number > 0, got 0"),
    (["--uniform", "-inf"], "--uniform: must be a finite number, got -inf"),
    (["--uniform", "1.2", "--steps", "5"], "--steps: only applies to training head scales"),
    ([], "--length: give the multiple of the training length"),
]


def _refused(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    """The one error line of a refused ``nopelab headscale``, which wrote nothing."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scaled"
    assert run_cli(["headscale", *args, "--device", "cpu", "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nopelab: error: "), err
    assert list(tmp_path.iterdir()) == []
    return err.removeprefix("nopelab: error: ")


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_refused(
    args: list[str], message: str, text_run: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    assert _refused([str(text_run), *args], tmp_path, monkeypatch, capsys).startswith(message)


def test_runs_it_cannot_scale_are_refused(
    text_run: Path, finished_run: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    err = _refused([str(finished_run), "--length", "2"], tmp_path, monkeypatch, capsys)
    assert err.startswith("run: headscale needs a language model trained on text")
    err = _refused([str(tmp_path / "missing"), "--uniform", "2"], tmp_path, monkeypatch, capsys)
    assert err.startswith("run: ") and "has no config.json" in err
    learned = _two_layers(tmp_path.parent, pos_encoding="learned", max_seq_len=24)
    err = _refused([str(learned), "--length", "2"], tmp_path, monkeypatch, capsys)
    assert err == "--length: 2x is 32 tokens, beyond the learned position table of 24"
