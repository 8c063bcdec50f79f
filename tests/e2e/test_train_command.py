"""`nopelab train` end to end: task and text runs, bad input, divergence, full disks, resume,
data parallelism under torchrun, progress lines."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from helpers import failure_line, run_cli, tiny_run
from nopelab.errors import UserError
from nopelab.training.checkpoint import (
    save_checkpoint,
)
from nopelab.training.run import TrainRun, read_run
from nopelab.training.train import learning_rate, make_optimizer, train
from nopelab.training.trained import load_trained


def test_tensorboard_missing_is_one_line_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    out = tmp_path / "out"
    args = ["train", "--task", "copy", *TINY_TRAIN, "--tensorboard", "--out", str(out)]
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err
    assert "pip install 'nopelab[tensorboard]'" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow
def test_ddp_matches_one_process_on_the_same_global_batch(tmp_path: Path) -> None:
    args = [
        "-m",
        "nopelab",
        "train",
        "--task",
        "copy",
        "--max-len",
        "5",
        "--train-size",
        "2000",
        "--test-size",
        "50",
        "--layers",
        "2",
        "--heads",
        "2",
        "--d-model",
        "32",
        "--seq-len",
        "32",
        "--batch-size",
        "8",
        "--steps",
        "4",
        "--eval-every",
        "4",
        "--warmup",
        "1",
        "--lr",
        "3e-3",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run(
        [sys.executable, *args, "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr
    double = subprocess.run(
        [
            *_torchrun(),
            "--nproc-per-node",
            "2",
            "--master-port",
            "29517",
            *args,
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert double.returncode == 0, double.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2
    one, two = (pd.read_csv(tmp_path / n / "metrics.csv") for n in ("one", "two"))
    np.testing.assert_allclose(one["loss"], two["loss"], rtol=1e-5)
    np.testing.assert_allclose(one["grad_norm"], two["grad_norm"], rtol=1e-4)
    a = load_file(tmp_path / "one" / "model.safetensors")
    b = load_file(tmp_path / "two" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_on_nodes(args: list[str], nodes: int, tmp_path: Path) -> None:
    """``nopelab train ARGS`` on ``nodes`` torchrun "nodes" of one process each on this machine
    (separate launches meeting at a c10d rendezvous, as on separate machines), or in one plain
    process (``nodes`` 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nodes == 0:
        launches = [[sys.executable, "-m", "nopelab", *args]]
    else:
        endpoint = f"127.0.0.1:{_free_port()}"
        rendezvous = ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", endpoint, "--rdzv-id", "nopelab-test"]  # fmt: skip
        launches = [[*_torchrun(), *rendezvous, "-m", "nopelab", *args]] * nodes
    logs = [tmp_path / f"launch-{nodes}-{i}.log" for i in range(len(launches))]
    running = []
    for cmd, log in zip(launches, logs, strict=True):
        with log.open("w") as output:  # not pipes: a launch never waits for its reader
            running.append(subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, env=env))
    for run, log in zip(running, logs, strict=True):
        assert run.wait(timeout=300) == 0, log.read_text()[-3000:]


@pytest.mark.slow
def test_two_nodes_train_as_one_process_and_resume_on_another_node_count(
    tmp_path: Path,
) -> None:
    """Two torchrun nodes (c10d rendezvous, gloo) make the steps of one process on the same
    global batch; a run started on two nodes continues on one, and one started on one continues
    on two, each equal to a run that stayed on one process."""
    args = ["train", "--task", "copy", "--max-len", "5", "--train-size", "2000", "--test-size",
            "50", "--layers", "2", "--heads", "2", "--d-model", "32", "--seq-len", "32",
            "--batch-size", "8", "--warmup", "1", "--lr", "3e-3", "--device", "cpu",
            "--eval-every", "4", "--checkpoint-every", "4"]  # fmt: skip

    def train_steps(out: Path, steps: int, nodes: int, resume: bool = False) -> pd.DataFrame:
        more = ["--resume"] if resume else []
        _train_on_nodes([*args, "--steps", str(steps), *more, "--out", str(out)], nodes, tmp_path)
        return pd.read_csv(out / "metrics.csv")

    one = train_steps(tmp_path / "one", 4, nodes=0)
    two = train_steps(tmp_path / "two", 4, nodes=2)
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["processes"] == 2
    np.testing.assert_allclose(one["loss"], two["loss"], rtol=1e-5)
    shutil.copytree(tmp_path / "one", tmp_path / "one-then-two")
    stayed = train_steps(tmp_path / "one", 8, nodes=0, resume=True)
    for name, nodes in (("two", 0), ("one-then-two", 2)):
        moved = train_steps(tmp_path / name, 8, nodes=nodes, resume=True)
        assert len(moved) == 8
        np.testing.assert_allclose(stayed["loss"], moved["loss"], rtol=1e-5)
        np.testing.assert_allclose(stayed["grad_norm"], moved["grad_norm"], rtol=1e-4)


TINY_TRAIN = [
    "--layers", "2", "--heads", "2", "--d-model", "32", "--seq-len", "32", "--batch-size", "8",
    "--steps", "4", "--eval-every", "2", "--warmup", "1", "--device", "cpu",
]  # fmt: skip


def test_cli_task_run_then_analyze(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    args = ["train", "--task", "add", "--train-size", "2000", "--test-size", "50", *TINY_TRAIN]
    assert run_cli([*args, "--out", str(out)], monkeypatch) == 0
    for name in ("model.safetensors", "config.json", "metrics.csv", "eval.csv", "training.png"):
        assert (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["final_eval"]["accuracy"] <= 1 and summary["tokens_per_second"] > 0
    assert json.loads((out / "config.json").read_text())["task"]["name"] == "add"

    analysis = tmp_path / "analysis"
    assert run_cli(["analyze", str(out), "--seq-len", "16", "--samples", "4", "--batch-size",
                    "2", "--device", "cpu", "--out", str(analysis)], monkeypatch) == 0  # fmt: skip
    positions = pd.read_parquet(analysis / "positions.parquet")
    assert len(positions) == (1 + 4 * 2) * 16
    assert json.loads((analysis / "config.json").read_text())["analysis"]["input"] == "data"


def test_cli_zuo_protocol_and_its_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    args = ["train", "--task", "add", "--layout", "padded", "--loss-mode", "all", *TINY_TRAIN]
    assert run_cli([*args, "--train-size", "300", "--test-size", "20", "--out", str(out)],
                   monkeypatch) == 0  # fmt: skip
    task = json.loads((out / "config.json").read_text())["task"]
    assert (task["layout"], task["loss_mode"], task["format"]) == ("padded", "all", None)
    analyze = ["analyze", str(out), "--input", "prompts", "--samples", "8", "--device", "cpu"]
    analysis = tmp_path / "analysis"
    assert run_cli([*analyze, "--seq-len", "9", "--out", str(analysis)], monkeypatch) == 0
    config = json.loads((analysis / "config.json").read_text())["analysis"]
    assert (config["input"], config["seq_len"]) == ("prompts", 9)  # "$999+999=" fits
    capsys.readouterr()
    bad = [
        ([*analyze, "--seq-len", "8"], "--seq-len"),  # shorter than the longest prompt
        (["analyze", "--input", "prompts", "--layers", "1"], "--input"),  # no task run
        ([*args, "--format", "lee"], "--format"),
        ([*args, "--loss-mode", "prompt"], "--loss-mode"),
        ([*args, "--layout", "stacked"], "--layout"),
        (["train", "--task", "copy", "--format", "zuo", *TINY_TRAIN], "--format"),
    ]
    for argv, field in bad:
        target = tmp_path / "bad"
        assert run_cli([*argv, "--out", str(target)], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and field in err, err
        assert not target.exists()


def test_padded_rows_default_to_the_longest_line(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    at = TINY_TRAIN.index("--seq-len")
    flags = TINY_TRAIN[:at] + TINY_TRAIN[at + 2 :]
    args = ["train", "--task", "wherex", "--max-len", "4", "--layout", "padded", *flags]
    assert run_cli([*args, "--train-size", "300", "--test-size", "20", "--out", str(out)],
                   monkeypatch) == 0  # fmt: skip
    assert json.loads((out / "config.json").read_text())["train"]["seq_len"] == len(
        "wherex(1002,2)=3\n"
    )  # the longest line of 4-digit wherex


@pytest.mark.slow
def test_cli_text_run_then_analyze(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "run"
    args = ["train", "--corpus", str(corpus), *TINY_TRAIN, "--out", str(out)]
    assert run_cli(args, monkeypatch) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {"loss", "perplexity"} <= set(summary["final_eval"])
    assert json.loads((out / "config.json").read_text())["model"]["vocab_size"] == 256
    analysis = tmp_path / "analysis"
    assert run_cli(["analyze", str(out), "--seq-len", "16", "--samples", "2", "--batch-size",
                    "2", "--device", "cpu", "--out", str(analysis)], monkeypatch) == 0  # fmt: skip
    assert (analysis / "summary.md").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--task", "multiply"], "--task: unknown value 'multiply'"),
        (["--corpus", "/no/such/file.txt"], "--corpus: no such file or folder"),
        (["--task", "add", "--corpus", "default"], "exactly one of a task"),
        ([], "--task or --corpus"),
        (["--task", "add", "--steps", "0"], "--steps: must be > 0"),
        (["--task", "add", "--lr", "-1"], "--lr: must be > 0"),
        (["--task", "add", "--vocab-size", "50"], "--vocab-size: tasks use"),
        (["--task", "reverse", "--seq-len", "8"], "--seq-len: must hold a whole line"),
        (["--task", "add", "--resume", "--force"], "--resume and --force"),
    ],
)
def test_bad_train_input_is_one_line_exit_2(
    extra: list[str], message: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "out"
    code = run_cli(["train", *extra, "--device", "cpu", "--out", str(out)], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("checkpoint_every", "failure"),
    [("2", "step 4: the loss is nan"), ("1", "step 3: the weights are no longer finite")],
)
def test_a_diverged_run_fails_and_keeps_its_last_finite_checkpoint(
    checkpoint_every: str, failure: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    import nopelab.training.train as training

    schedule = training.learning_rate  # an infinite step size from the third step on
    monkeypatch.setattr(
        training, "learning_rate", lambda cfg, step: schedule(cfg, step) if step < 2 else math.inf
    )
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--max-len", "5", "--train-size", "200", "--test-size",
            "10", *TINY_TRAIN, "--checkpoint-every", checkpoint_every, "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after a line per evaluation
    assert err.startswith("nopelab: error:") and failure in err and "diverged" in err, err
    assert err.endswith("the checkpoint of step 2 is kept")
    assert not (out / "summary.json").exists()
    _, model = load_trained(out)  # refuses non-finite weights
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 2
    assert all(p.isfinite().all() for p in model.parameters())


def test_a_run_diverging_before_its_first_checkpoint_leaves_nothing(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import nopelab.training.train as training

    monkeypatch.setattr(training, "learning_rate", lambda cfg, step: math.inf)
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--max-len", "5", "--train-size", "200", "--test-size",
            "10", *TINY_TRAIN, "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 1
    err = failure_line(capsys.readouterr().err)
    assert err.endswith("no checkpoint yet: nothing was kept"), err
    assert not out.exists()


def test_non_finite_weights_are_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    train(tiny_run(steps=2), out, progress=False)
    run, model = load_trained(out)
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    optimizer = make_optimizer(model, run.train, torch.device("cpu"))
    save_checkpoint(out, model, optimizer, {"step": 2, "train_seconds": 0.0})  # hashes agree
    with pytest.raises(UserError, match="non-finite weights"):
        load_trained(out)
    for command in (["analyze", str(out)], ["export", str(out)]):
        assert run_cli([*command, "--out", str(tmp_path / "o")], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "non-finite weights" in err, err
        assert not (tmp_path / "o").exists()


def test_bad_corpus_files(tmp_path: Path, capsys, monkeypatch) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n ")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    for path, message in ((empty, "is empty"), (latin, "is not UTF-8")):
        code = run_cli(["train", "--corpus", str(path), "--out", str(tmp_path / "o")], monkeypatch)
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_existing_run_is_never_overwritten(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--max-len", "5", "--train-size", "2000", "--test-size",
            "50", *TINY_TRAIN, "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()

    assert run_cli(args, monkeypatch) == 2
    assert "pass --resume to continue a run or --force" in capsys.readouterr().err
    assert run_cli(["train", "--resume", "--out", str(out)], monkeypatch) == 2
    assert "already finished" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # a damaged checkpoint: analyze and resume say so in one line
    weights = out / "model.safetensors"
    weights.write_bytes(before["model.safetensors"][:200])
    assert run_cli(["analyze", str(out), "--out", str(tmp_path / "a")], monkeypatch) == 2
    err = capsys.readouterr().err
    assert "checkpoint:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()

    # --force replaces the run
    assert run_cli([*args, "--force"], monkeypatch) == 0
    assert (out / "summary.json").is_file()


def test_resume_from_the_command_line(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    run = tiny_run(steps=6, checkpoint_every=2)
    train(run, out, progress=False, stop_after=3)  # checkpoint at step 3 (the stop)
    assert run_cli(["train", "--resume", "--out", str(out)], monkeypatch) == 0
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 6
    assert list(pd.read_csv(out / "metrics.csv")["step"]) == list(range(1, 7))
    capsys.readouterr()
    shutil.rmtree(out)
    train(run, out, progress=False, stop_after=3)
    assert run_cli(["train", "--resume", "--out", str(out), "--lr", "0.1"], monkeypatch) == 2
    assert "train.lr is 0.1 but the run was started with 0.003" in capsys.readouterr().err


def test_resume_runs_on_another_device(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    run = tiny_run(steps=6)
    started = dataclasses.replace(run, train=dataclasses.replace(run.train, device="auto"))
    train(started, out, progress=False, stop_after=2)
    assert run_cli(["train", "--resume", "--out", str(out), "--device", "cpu"], monkeypatch) == 0
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 6
    assert read_run(out).train.device == "auto"  # what the run was started with
    assert json.loads((out / "summary.json").read_text())["device"] == "cpu"  # where it ended


@pytest.mark.slow
def test_a_run_trains_further_with_more_steps(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    run = tiny_run(steps=4, checkpoint_every=2)
    train(run, out, progress=False)
    first = pd.read_csv(out / "metrics.csv").drop(columns="tokens_per_second")
    for steps in ("4", "3"):
        assert run_cli(["train", "--resume", "--out", str(out), "--steps", steps], monkeypatch) == 2
        assert "already finished; pass a larger --steps" in capsys.readouterr().err

    assert run_cli(["train", "--resume", "--out", str(out), "--steps", "6"], monkeypatch) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 6  # rewritten
    assert read_run(out).train.steps == 6
    metrics = pd.read_csv(out / "metrics.csv").drop(columns="tokens_per_second")
    assert list(metrics["step"]) == list(range(1, 7))
    pd.testing.assert_frame_equal(metrics[:4], first)  # the first four steps are kept
    longer = dataclasses.replace(run.train, steps=6)
    expected = [learning_rate(longer, step) for step in (4, 5)]  # the schedule of the new total
    assert metrics["lr"][4:].tolist() == pytest.approx(expected)
    capsys.readouterr()

    # stopped on its way to 8 steps: unfinished, its config says where it goes
    eight = dataclasses.replace(run, train=dataclasses.replace(run.train, steps=8))
    assert train(eight, out, resume=True, progress=False, stop_after=7) is None
    assert not (out / "summary.json").exists() and read_run(out).train.steps == 8
    assert run_cli(["train", "--resume", "--out", str(out), "--steps", "5"], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--steps: the checkpoint in" in err, err
    assert "is at step 7; allowed: >= 7, got 5" in err, err
    assert run_cli(["train", "--resume", "--out", str(out)], monkeypatch) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 8


COPY_ARGS = ["train", "--task", "copy", "--max-len", "5", "--train-size", "200", "--test-size",
             "10", *TINY_TRAIN, "--checkpoint-every", "2"]  # fmt: skip


@pytest.mark.parametrize(
    ("fails_at", "kept"),
    [(1, "no checkpoint yet: nothing was kept"), (3, "the checkpoint of step 2 is kept")],
)
def test_a_full_disk_names_the_folder_and_the_space_a_checkpoint_needs(
    fails_at: int, kept: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    from safetensors import SafetensorError

    from nopelab.training import checkpoint

    real, calls = checkpoint.save_file, []

    def fill_up(tensors, path, **kwargs):  # what safetensors raises on a full disk
        calls.append(path)
        if len(calls) >= fails_at:
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        real(tensors, path, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", fill_up)
    out = tmp_path / "run"
    assert run_cli([*COPY_ARGS, "--out", str(out)], monkeypatch) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]  # after a line per evaluation
    assert err.startswith(
        f"nopelab: error: No space left on device while writing the checkpoint into {out}: "
        "it needs about "
    ), err
    assert "is free; " in err and err.endswith(kept), err
    assert "Traceback" not in captured.err
    if fails_at == 1:
        assert not out.exists()
    else:
        assert json.loads((out / "trainer_state.json").read_text())["step"] == 2
        assert not list(out.glob(".*.tmp"))


def test_a_full_disk_while_writing_the_logs_keeps_the_checkpoint(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import nopelab.training.train as training

    flushes = []
    flush = training.Log.flush

    def full(log) -> None:  # the disk fills after the logs of the first checkpoint
        flushes.append(log.path.name)
        if len(flushes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(log.path))
        flush(log)

    monkeypatch.setattr(training.Log, "flush", full)
    out = tmp_path / "run"
    assert run_cli([*COPY_ARGS, "--out", str(out)], monkeypatch) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err == (
        f"nopelab: error: No space left on device while writing {out / 'metrics.csv'}; "
        "the checkpoint of step 2 is kept"
    ), err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"step": -5}, "says step -5, outside 0..6"),
        ({"step": 10**9}, "says step 1000000000, outside 0..6"),
        ({"train_seconds": "soon"}, "has no valid train_seconds"),
        ({"metrics.csv": 'step,loss\n1,2\n"3,4\n'}, "metrics.csv cannot be read"),
        ({"eval.csv": "stage,loss\nx,2\n"}, "eval.csv has no column of whole step numbers"),
        ({"metrics.csv": b"\xff\xfe\x00garbage"}, "metrics.csv cannot be read"),
    ],
)
def test_resume_checks_what_it_reads(
    damage: dict, message: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "run"
    train(tiny_run(steps=6, checkpoint_every=2, eval_every=2), out, progress=False, stop_after=4)
    state = json.loads((out / "trainer_state.json").read_text())
    for key, value in damage.items():
        if key.endswith(".csv"):
            path = out / key
            path.write_bytes(value) if isinstance(value, bytes) else path.write_text(value)
        else:
            state[key] = value
    (out / "trainer_state.json").write_text(json.dumps(state))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert run_cli(["train", "--resume", "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nopelab: error: --resume:"), err
    assert message in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume_refuses_changed_training_data(tmp_path: Path, capsys, monkeypatch) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 100)
    out = tmp_path / "run"
    args = ["train", "--corpus", str(corpus), *TINY_TRAIN, "--steps", "6"]
    run = TrainRun.from_dict(
        {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "vocab_size": 256},
         "train": {"steps": 6, "batch_size": 8, "seq_len": 32, "warmup": 1, "eval_every": 2,
                   "checkpoint_every": 2, "device": "cpu"},
         "corpus": {"source": str(corpus)}}
    )  # fmt: skip
    train(run, out, progress=False, stop_after=2)
    recorded = json.loads((out / "config.json").read_text())["data"]["sha256"]
    assert recorded == hashlib.sha256(corpus.read_bytes()).hexdigest()
    corpus.write_text("a different text entirely, of about the same length. " * 100)
    assert run_cli([*args, "--resume", "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the training data differ" in err, err
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 2


def test_train_from_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "train.toml"
    config.write_text(
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\n"
        '[train]\nsteps = 2\nbatch_size = 4\nseq_len = 32\neval_every = 2\ndevice = "cpu"\n'
        '[task]\nname = "reverse"\nmax_len = 6\ntrain_size = 500\ntest_size = 20\n'
    )
    out = tmp_path / "run"
    assert (
        run_cli(["train", "--config", str(config), "--lr", "0.01", "--out", str(out)], monkeypatch)
        == 0
    )
    stored = json.loads((out / "config.json").read_text())
    assert stored["task"]["name"] == "reverse" and stored["task"]["max_len"] == 6
    assert stored["train"]["lr"] == 0.01 and stored["model"]["n_layers"] == 1
    assert stored["model"]["vocab_size"] == 96


@pytest.mark.slow
@pytest.mark.parametrize("again", [[], ["--resume"]])
def test_a_run_killed_before_its_first_checkpoint_starts_again_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: list[str]
) -> None:
    """SIGKILL leaves the run's settings and no checkpoint: the same command, or --resume,
    starts it again in that folder without --force."""
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--layers", "1", "--d-model", "16", "--heads", "2",
            "--seq-len", "64", "--batch-size", "4", "--out", str(out)]  # fmt: skip
    killed = subprocess.Popen(
        [sys.executable, "-m", "nopelab", *args, "--steps", "1000000",
         "--checkpoint-every", "1000000", "--eval-every", "1000000"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "config.json").is_file() and time.monotonic() < deadline:
        assert killed.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)  # training has started
    killed.kill()
    killed.wait()
    assert (out / "config.json").is_file() and not (out / "trainer_state.json").exists()
    if again == ["--resume"]:  # the stored settings: a million steps; shorten them
        assert run_cli(["train", *again, "--out", str(out), "--steps", "3"], monkeypatch) == 0
    else:
        assert run_cli([*args, "--steps", "3"], monkeypatch) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert json.loads((out / "config.json").read_text())["train"]["steps"] == 3


@pytest.mark.slow
def test_training_in_a_log_prints_a_line_per_tenth_and_evaluation(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Where stderr is not a terminal: the stage, a line at each tenth of the steps that is not
    an evaluation, one per evaluation with its held-out numbers."""
    args = ["train", "--task", "copy", "--max-len", "5", "--train-size", "200", "--test-size",
            "10", *TINY_TRAIN, "--steps", "20", "--eval-every", "5", "--out", str(tmp_path / "r")]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    lines = [line.rsplit(" (", 1)[0] for line in capsys.readouterr().err.splitlines()]
    assert lines[0] == "train: training steps 1-20 of 20"
    steps = [line for line in lines if line.startswith("train step ")]
    shown = [int(line.split()[2].split("/")[0]) for line in steps]
    assert shown == [2, 4, 5, 6, 8, 10, 12, 14, 15, 16, 18, 20]  # tenths (2 steps) and evals
    evals = [n for n, line in zip(shown, steps, strict=True) if "held out: accuracy" in line]
    assert evals == [5, 10, 15, 20]
