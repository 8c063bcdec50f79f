"""Training: schedule, checkpoints, exact resume, precision, learning a task (in process)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_run
from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
from nopelab.errors import UserError
from nopelab.models.transformer import Transformer
from nopelab.training.checkpoint import (
    MODEL_FILE,
    OPTIMIZER_FILE,
    CheckpointError,
    checkpoint_bytes,
    load_checkpoint,
    save_checkpoint,
    sha256,
)
from nopelab.training.run import TrainRun, read_run
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import autocast_for, learning_rate, make_optimizer, train

TINY_MODEL = tiny_run().model  # a two-layer model, d = 32
COPY = tiny_run().task


def test_learning_rate_warmup_then_cosine() -> None:
    cfg = TrainConfig(steps=110, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert learning_rate(cfg, 0) == pytest.approx(0.1)
    assert learning_rate(cfg, 9) == pytest.approx(1.0)
    assert learning_rate(cfg, 10) == pytest.approx(1.0)
    assert learning_rate(cfg, 60) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos = 0
    assert learning_rate(cfg, 110) == pytest.approx(0.1)
    lrs = [learning_rate(cfg, s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def _trained_pair(tmp_path: Path) -> tuple[Transformer, torch.optim.Optimizer]:
    model = Transformer(TINY_MODEL)
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    for _ in range(2):
        model(torch.randint(96, (2, 8))).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_checkpoint_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model, optimizer = _trained_pair(tmp_path)
    save_checkpoint(tmp_path, model, optimizer, {"step": 2, "train_seconds": 1.0})
    fresh = Transformer(TINY_MODEL)
    fresh_opt = make_optimizer(fresh, TrainConfig(), torch.device("cpu"))
    state = load_checkpoint(tmp_path, fresh, fresh_opt)
    assert state["step"] == 2
    for (name, a), (_, b) in zip(
        model.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert fresh.lm_head.weight is fresh.embed.weight  # tying survives loading
    old, new = optimizer.state_dict(), fresh_opt.state_dict()
    assert old["param_groups"] == new["param_groups"]
    for index, entries in old["state"].items():
        for key, value in entries.items():
            assert torch.equal(value, new["state"][index][key]), (index, key)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")  # stored once
    assert not list(tmp_path.glob(".*.tmp"))
    files = sum((tmp_path / name).stat().st_size for name in (MODEL_FILE, OPTIMIZER_FILE))
    assert 0 < files - checkpoint_bytes(model, optimizer) < 2**16  # the headers


def test_damaged_checkpoints_are_caught(tmp_path: Path) -> None:
    model, optimizer = _trained_pair(tmp_path)
    save_checkpoint(tmp_path, model, optimizer, {"step": 2})
    path = tmp_path / "model.safetensors"
    original = path.read_bytes()

    path.write_bytes(original[: len(original) // 2])  # truncated
    with pytest.raises(CheckpointError, match=r"hash|truncated|damaged"):
        load_checkpoint(tmp_path, Transformer(TINY_MODEL))
    corrupted = bytearray(original)
    corrupted[-5] ^= 0xFF  # one flipped byte in the weights
    path.write_bytes(bytes(corrupted))
    with pytest.raises(CheckpointError, match="hash"):
        load_checkpoint(tmp_path, Transformer(TINY_MODEL))
    path.write_bytes(original[:100])  # truncated, with no hash to compare against
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": state["step"]}))
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        load_checkpoint(tmp_path, Transformer(TINY_MODEL))
    path.write_bytes(original)
    other = ModelConfig(d_model=48, n_layers=2, n_heads=2, max_seq_len=64)
    with pytest.raises(CheckpointError, match=r"does not match the model config.*shape"):
        load_checkpoint(tmp_path, Transformer(other))
    deeper = ModelConfig(d_model=32, n_layers=3, n_heads=2, max_seq_len=64)
    with pytest.raises(CheckpointError, match=r"missing 'blocks\.2"):
        load_checkpoint(tmp_path, Transformer(deeper))


@pytest.mark.slow
def test_resumed_run_retraces_the_uninterrupted_one(tmp_path: Path) -> None:
    run = tiny_run(steps=8, checkpoint_every=3)
    whole = train(run, tmp_path / "whole", progress=False)
    assert train(run, tmp_path / "cut", progress=False, stop_after=5) is None
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert json.loads((tmp_path / "cut" / "trainer_state.json").read_text())["step"] == 5
    resumed = train(run, tmp_path / "cut", resume=True, progress=False)
    a = pd.read_csv(tmp_path / "whole" / "metrics.csv")
    b = pd.read_csv(tmp_path / "cut" / "metrics.csv")
    assert list(b["step"]) == list(range(1, 9))
    np.testing.assert_array_equal(a["loss"].to_numpy(), b["loss"].to_numpy())
    np.testing.assert_array_equal(a["grad_norm"].to_numpy(), b["grad_norm"].to_numpy())
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "whole" / "eval.csv"), pd.read_csv(tmp_path / "cut" / "eval.csv")
    )
    for name, tensor in load_file(tmp_path / "whole" / "model.safetensors").items():
        assert torch.equal(tensor, load_file(tmp_path / "cut" / "model.safetensors")[name])
    assert whole["final_eval"] == resumed["final_eval"]


@pytest.mark.parametrize("interrupted", ["model.safetensors", "optimizer.safetensors"])
def test_a_save_interrupted_between_its_files_resumes_from_the_checkpoint_before(
    interrupted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """An interrupt just after the new weights (or optimiser state) of step 6 are moved into
    place, before the state file that names them: --resume puts back the files of step 4 and
    retraces the uninterrupted run (this used to be refused as a corrupted checkpoint)."""
    run = tiny_run(steps=8, checkpoint_every=2)
    whole = train(run, tmp_path / "whole", progress=False)
    out = tmp_path / "cut"
    real_replace = os.replace

    def replace(source: Path, target: Path) -> None:
        real_replace(source, target)
        state = Path(target).parent / "trainer_state.json"
        at_4 = state.is_file() and json.loads(state.read_text())["step"] == 4
        if Path(target).name == interrupted and at_4:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        train(run, out, progress=False)
    monkeypatch.undo()
    state = json.loads((out / "trainer_state.json").read_text())
    key = interrupted.split(".")[0] + "_sha256"
    assert state["step"] == 4 and sha256(out / interrupted) != state[key]  # the split
    capsys.readouterr()
    resumed = train(run, out, resume=True, progress=False)
    assert "resuming from the checkpoint before it (step 4)" in capsys.readouterr().err
    assert not list(out.glob(".*.previous"))
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "whole" / "metrics.csv").drop(columns="tokens_per_second"),
        pd.read_csv(out / "metrics.csv").drop(columns="tokens_per_second"),
    )
    for name, tensor in load_file(tmp_path / "whole" / "model.safetensors").items():
        assert torch.equal(tensor, load_file(out / "model.safetensors")[name])
    assert whole["final_eval"] == resumed["final_eval"]


def test_a_log_interrupted_while_written_keeps_the_rows_it_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt while metrics.csv is written leaves the file as it was, never a torn
    header or row (a torn header once made --resume refuse the run)."""
    from nopelab.training.train import Log

    log = Log(tmp_path, "metrics.csv")
    log.add({"step": 1, "loss": 2.0})
    log.flush()
    before = (tmp_path / "metrics.csv").read_bytes()

    def torn(frame: pd.DataFrame, path: Path, **kwargs: object) -> None:
        with open(path, "a") as f:
            f.write("step,lo")
        raise KeyboardInterrupt

    log.add({"step": 2, "loss": 1.5})
    monkeypatch.setattr(pd.DataFrame, "to_csv", torn)
    with pytest.raises(KeyboardInterrupt):
        log.flush()
    monkeypatch.undo()
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]
    log.flush()  # the rows are still held, and land whole
    assert list(pd.read_csv(tmp_path / "metrics.csv")["step"]) == [1, 2]


def test_tensorboard_mirrors_the_logs_across_a_resume(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, out = tiny_run(steps=8, checkpoint_every=3), tmp_path / "run"
    assert train(run, out, progress=False, stop_after=5, tensorboard=True) is None
    train(run, out, resume=True, progress=False, tensorboard=True)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    for tag, csv, column in (("train", "metrics.csv", "loss"), ("eval", "eval.csv", "accuracy")):
        logged = pd.read_csv(out / csv)
        scalars = events.Scalars(f"{tag}/{column}")
        assert [e.step for e in scalars] == list(logged["step"])  # each step once, in order
        np.testing.assert_allclose([e.value for e in scalars], logged[column], rtol=1e-6)


def test_resume_refuses_a_different_config(tmp_path: Path) -> None:
    train(tiny_run(), tmp_path / "run", progress=False, stop_after=2)
    with pytest.raises(UserError, match=r"train\.lr is 0\.01 but the run was started with 0\.003"):
        train(tiny_run(lr=1e-2), tmp_path / "run", resume=True, progress=False)


def test_dropout_runs_reproduce(tmp_path: Path) -> None:
    run = TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, dropout=0.2),
        train=tiny_run().train,
        task=COPY,
    )
    train(run, tmp_path / "a", progress=False)
    train(run, tmp_path / "b", progress=False)
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv")["loss"] for n in "ab")
    pd.testing.assert_series_equal(a, b)


def test_autocast_choice_follows_precision_and_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not isinstance(autocast_for(TrainConfig(precision="auto"), cpu)(), torch.autocast)
    assert not isinstance(autocast_for(TrainConfig(precision="float32"), cuda)(), torch.autocast)
    with warnings.catch_warnings():  # building a CUDA autocast without CUDA only warns
        warnings.simplefilter("ignore")
        on_gpu = autocast_for(TrainConfig(precision="auto"), cuda)()
    assert isinstance(on_gpu, torch.autocast)
    assert (on_gpu.device, on_gpu.fast_dtype) == ("cuda", torch.bfloat16)
    model = Transformer(TINY_MODEL)
    with autocast_for(TrainConfig(precision="bfloat16"), cpu)():
        assert model(torch.randint(96, (2, 8))).dtype == torch.bfloat16


def test_bfloat16_run_tracks_the_float32_run(tmp_path: Path) -> None:
    """The autocast path (the GPU default) runs end to end; on CPU it can be asked for."""
    full = train(tiny_run(precision="float32"), tmp_path / "fp32", progress=False)
    half = train(tiny_run(precision="bfloat16"), tmp_path / "bf16", progress=False)
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv")["loss"] for n in ("fp32", "bf16"))
    assert not np.array_equal(a, b)  # bf16 matmuls really ran
    np.testing.assert_allclose(a, b, rtol=1e-2)
    assert half["final_eval"]["loss"] == pytest.approx(full["final_eval"]["loss"], rel=1e-2)


@pytest.mark.slow  # torch.compile's first compilation
def test_compiled_run_matches_eager(tmp_path: Path) -> None:
    """``--compile`` (inductor, here with the CPU C++ backend) trains like the eager model."""
    eager = train(tiny_run(steps=4), tmp_path / "eager", progress=False)
    compiled = train(tiny_run(steps=4, compile=True), tmp_path / "compiled", progress=False)
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv")["loss"] for n in ("eager", "compiled"))
    np.testing.assert_allclose(a, b, rtol=1e-5)
    assert compiled["final_eval"]["loss"] == pytest.approx(eager["final_eval"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_tiny_model_learns_copy(tmp_path: Path) -> None:
    """Two layers, d = 64, RoPE: copying strings of up to 5 letters needs an induction-like
    lookup; on this recipe it is learned after ~400 steps (measured: 1.0, 0.95, 1.0 test
    accuracy for seeds 0, 1, 2 at 1000 steps)."""
    run = TrainRun(
        model=ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=64, pos_encoding="rope"),
        train=TrainConfig(
            steps=1000,
            batch_size=32,
            seq_len=48,
            lr=3e-3,
            warmup=100,
            eval_every=1000,
            checkpoint_every=1000,
            device="cpu",
        ),
        task=TaskConfig(name="copy", min_len=1, max_len=5, train_size=5000, test_size=200),
    )
    summary = train(run, tmp_path / "copy", progress=False)
    assert summary["final_eval"]["accuracy"] >= 0.95


def test_text_run_reports_loss_and_perplexity(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "époque", "naïve"]
    text.write_text(" ".join(rng.choice(words, 6000)))
    run = TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=256),
        train=TrainConfig(
            steps=30,
            batch_size=8,
            seq_len=32,
            lr=3e-3,
            warmup=3,
            eval_every=15,
            eval_tokens=1024,
            device="cpu",
        ),
        corpus=CorpusConfig(source=str(text)),
    )
    summary = train(run, tmp_path / "text", progress=False)
    final = summary["final_eval"]
    assert {"loss", "perplexity", "loss_2x", "perplexity_2x", "loss_4x"} <= set(final)
    assert final["perplexity"] == pytest.approx(math.exp(final["loss"]))
    assert final["loss"] < math.log(256) - 1  # learned something about the bytes
    assert (tmp_path / "text" / "tokenizer.json").is_file()


def test_bpe_is_cached_next_to_a_local_corpus(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 7))) for _ in range(400)]
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text(" ".join(rng.choice(words, 20000)))
    run = TrainRun(
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, vocab_size=300),
        train=TrainConfig(
            steps=1, batch_size=2, seq_len=16, eval_every=1, eval_tokens=64, device="cpu"
        ),
        corpus=CorpusConfig(source=str(corpus), tokenizer="bpe", bpe_vocab=300),
    )
    train(run, tmp_path / "run", progress=False)
    cached = list((tmp_path / "data" / ".nopelab" / "tokenizers").glob("bpe-300-*.json"))
    assert len(cached) == 1
    assert cached[0].read_text() == (tmp_path / "run" / "tokenizer.json").read_text()


def test_init_from_starts_from_the_weights_of_another_run(
    finished_run: Path, tmp_path: Path
) -> None:
    """A run started from ``finished_run`` holds its weights (a 1e-12 learning rate moves them
    by ~1e-12); the same run from a random init does not; the source is recorded."""
    source = read_run(finished_run)
    tiny_lr = TrainConfig(steps=1, batch_size=4, seq_len=24, lr=1e-12, eval_every=1, device="cpu")
    theirs = load_file(str(finished_run / MODEL_FILE))
    for init_from, expect_same in ((str(finished_run), True), (None, False)):
        run = TrainRun(
            model=source.model,
            train=dataclasses.replace(tiny_lr, init_from=init_from),
            task=source.task,
        )
        out = tmp_path / f"from-{init_from is not None}"
        train(run, out, progress=False)
        ours = load_file(str(out / MODEL_FILE))
        same = all(torch.allclose(ours[k], theirs[k], atol=1e-9, rtol=0) for k in theirs)
        assert same == expect_same
        assert read_run(out).train.init_from == init_from  # config.json says where it started
