"""Run folders cannot destroy data, are written whole or not at all by one writer, and an
interrupt (SIGINT or SIGTERM) exits 130 saying what was kept."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import failure_line, run_cli
from nopelab.runtime.rundir import RUN_MARKER, locked, staged_run, write_json
from nopelab.training import checkpoint
from stuck import stuck_at

TINY = ["--layers", "1", "--heads", "2", "--d-model", "16", "--seq-len", "8", "--samples", "4",
        "--batch-size", "2", "--device", "cpu"]  # fmt: skip
TRAIN = ["train", "--task", "copy", "--max-len", "4", "--train-size", "200", "--test-size", "20",
         "--layers", "1", "--heads", "2", "--d-model", "16", "--seq-len", "16", "--batch-size",
         "4", "--warmup", "1", "--device", "cpu"]  # fmt: skip


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _holder(code: str, out: Path) -> subprocess.Popen[str]:
    """Another process running ``code`` on ``out`` (with ``locked``, ``staged_run`` and ``time``
    imported), its output readable."""
    prelude = "import sys, time; from pathlib import Path\n"
    prelude += "from nopelab.runtime.rundir import locked, staged_run\nout = Path(sys.argv[1])\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code, str(out)], stdout=subprocess.PIPE, text=True
    )


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current folder holding a precious file."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "precious.txt").write_text("keep me")
    monkeypatch.chdir(here)
    return here


@pytest.mark.parametrize("out", ["", ".", "..", "./"])
def test_out_is_never_the_current_folder_or_above_it(out, workdir, capsys, monkeypatch) -> None:
    before = _tree(workdir.parent)
    for force in ([], ["--force"]):
        assert run_cli(["analyze", *TINY, "--out", out, *force], monkeypatch) == 2
        assert "current folder" in _one_line(capsys)
    assert _tree(workdir.parent) == before


def test_outputs_never_overlap_the_input_run(tmp_path, capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    assert run_cli([*TRAIN, "--steps", "2", "--out", str(run)], monkeypatch) == 0
    before = _tree(run)
    capsys.readouterr()
    for command in (["analyze", str(run)], ["export", str(run)], ["probe", str(run)]):
        for out in (run, run / "inside", tmp_path):
            code = run_cli([*command, "--out", str(out), "--force"], monkeypatch)
            assert code == 2 and "input run" in _one_line(capsys)
    assert _tree(run) == before


@pytest.mark.slow
def test_force_replaces_only_a_nopelab_run(tmp_path, capsys, monkeypatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert run_cli(["analyze", *TINY, "--out", str(mine), "--force"], monkeypatch) == 2
    assert "does not hold a nopelab run" in _one_line(capsys)
    assert _tree(mine) == {"thesis.tex": b"years of work"}

    run = tmp_path / "run"
    assert run_cli(["analyze", *TINY, "--out", str(run)], monkeypatch) == 0
    assert json.loads((run / RUN_MARKER).read_text())["command"] == "analyze"
    assert (
        run_cli(["analyze", *TINY, "--seed", "1", "--out", str(run), "--force"], monkeypatch) == 0
    )
    assert json.loads((run / "config.json").read_text())["analysis"]["seed"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_second_writer_is_refused(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    holder = _holder("with locked(out):\n    print('locked', flush=True); time.sleep(60)", out)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        for args in (["analyze", *TINY], [*TRAIN, "--steps", "2"]):
            assert run_cli([*args, "--out", str(out)], monkeypatch) == 2
            assert f"another nopelab process is writing {out} (process {holder.pid})" in (
                _one_line(capsys)
            )
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".run.lock").read_text() == f"{holder.pid}\n"  # a killed holder's lock
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 0  # does not block
    assert not (tmp_path / ".run.lock").exists()  # and is removed


def test_a_killed_commands_staging_folder_is_removed_by_the_next_run(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A command killed by SIGKILL leaves its hidden staging folder; the next command into the
    same --out removes it once it holds the lock (the owner is gone), and nothing else."""
    out = tmp_path / "run"
    holder = _holder(
        "with staged_run(out, False) as staging:\n    print(staging.name, flush=True); time.sleep(60)",
        out,
    )
    assert holder.stdout is not None
    staging = tmp_path / holder.stdout.readline().strip()
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 2  # its owner lives
    assert "another nopelab process is writing" in _one_line(capsys)
    holder.kill()
    holder.wait()
    assert (staging / RUN_MARKER).is_file()
    users = tmp_path / ".run.staging-mine1234"  # the same kind of name, not made by nopelab
    users.mkdir()
    (users / "notes.txt").write_text("the user's own file")
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [users.name, "run"]
    assert (users / "notes.txt").is_file()


def test_a_lock_waits_for_its_holder_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = _holder(
        "with locked(out):\n    print('locked', flush=True); time.sleep(1); letting_go = time.time()\n"
        "print(letting_go, flush=True)",
        out,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with locked(out, wait=60):
            taken = time.time()
            assert (tmp_path / ".run.lock").read_text() == f"{os.getpid()}\n"
        assert float(holder.stdout.readline()) < taken  # taken once the holder let it go
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / ".run.lock").exists()


def test_a_failed_run_leaves_nothing_not_even_parents(tmp_path, capsys, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "somewhere")

    monkeypatch.setattr("nopelab.measure.run_files.write_analysis", fail)
    out = tmp_path / "a" / "b" / "run"
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 1
    assert "No space left on device" in failure_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_any_command_exits_130(tmp_path, capsys, monkeypatch) -> None:
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("nopelab.measure.analysis.analyze_model", interrupt)
    out = tmp_path / "new" / "run"
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 130
    assert "interrupted; nothing was written" in _one_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_training_interrupted_before_its_first_checkpoint(tmp_path, capsys, monkeypatch) -> None:
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("nopelab.training.train._update", interrupt)
    out = tmp_path / "new" / "run"
    assert run_cli([*TRAIN, "--steps", "4", "--out", str(out)], monkeypatch) == 130
    assert "no checkpoint yet" in failure_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_training_run_writes_nothing(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    args = [*TRAIN, "--pos-encoding", "learned", "--max-seq-len", "8", "--out", str(out)]
    assert run_cli(args, monkeypatch) == 2
    _one_line(capsys)
    assert not out.exists()


def test_disk_full_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    calls = []
    real = checkpoint.save_file

    def fill_up(tensors, path, **kwargs):
        calls.append(path)
        if len(calls) > 2:  # the second checkpoint's weights
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(tensors, path, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", fill_up)
    args = [*TRAIN, "--steps", "4", "--checkpoint-every", "2", "--out", str(out)]
    assert run_cli(args, monkeypatch) == 1
    err = capsys.readouterr().err.strip()  # a progress line per evaluation, then the error
    assert "No space left on device" in err.splitlines()[-1] and "Traceback" not in err
    assert checkpoint.read_state(out)["step"] == 2
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(checkpoint, "save_file", real)
    assert run_cli(["train", "--resume", "--out", str(out)], monkeypatch) == 0  # intact


def test_outputs_follow_the_umask(tmp_path, monkeypatch) -> None:
    previous = os.umask(0o027)
    try:
        out = tmp_path / "run"
        assert run_cli([*TRAIN, "--steps", "2", "--out", str(out)], monkeypatch) == 0
        analysis = tmp_path / "analysis"
        assert run_cli(["analyze", str(out), "--out", str(analysis)], monkeypatch) == 0
    finally:
        os.umask(previous)
    for folder in (out, analysis):
        assert folder.stat().st_mode & 0o777 == 0o750
    for name in ("model.safetensors", "trainer_state.json", "config.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o640, name
    assert (analysis / "summary.json").stat().st_mode & 0o777 == 0o640


# ------------------------------------------------------------------------ real signals


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nopelab", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_interrupt_wrapped_by_python_is_still_an_interrupt(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """A signal that lands while a module is imported (a class being created) reaches the
    command as a RuntimeError caused by KeyboardInterrupt: it is an interrupt all the same."""

    def interrupted_import(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc

    monkeypatch.setattr("nopelab.measure.analysis.analyze_model", interrupted_import)
    out = tmp_path / "run"
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "nopelab: interrupted; nothing was written", err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_analysis_leaves_nothing(signum, tmp_path) -> None:
    out = tmp_path / "made" / "run"
    proc = _start(["analyze", *TINY, "--samples", "1000000", "--out", str(out)], tmp_path)
    _wait_for(lambda: any((tmp_path / "made").glob(".run.staging-*")))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "nopelab: interrupted; nothing was written", err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_as_the_staging_folder_is_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal sent as soon as the staging folder shows (the test above, on a loaded machine)
    can land as ``mkdir`` returns, before the code that made it has its name."""
    mkdir = os.mkdir

    def interrupted(path, *args, **kwargs):
        mkdir(path, *args, **kwargs)
        if ".staging-" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "mkdir", interrupted)
    with pytest.raises(KeyboardInterrupt), staged_run(tmp_path / "made" / "run", force=False):
        pytest.fail("the staging folder was not made")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_training_keeps_the_checkpoint(signum, tmp_path) -> None:
    out = tmp_path / "my run"
    args = [*TRAIN, "--steps", "100000", "--checkpoint-every", "5", "--out", str(out)]
    proc = _start(args, tmp_path)
    _wait_for(lambda: (out / checkpoint.STATE_FILE).is_file())
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    step = checkpoint.read_state(out)["step"]
    assert f"the checkpoint of step {step} is kept: continue with " in line
    again = shlex.split(line.split("continue with ", 1)[1])
    assert again == ["nopelab", "train", "--resume", "--out", str(out)]
    assert not (tmp_path / ".my run.lock").exists()


@pytest.mark.slow
def test_sigterm_stops_a_reproduction_and_its_workers(tmp_path) -> None:
    out = tmp_path / "zuo"
    args = ["reproduce", "zuo2025", "--part", "trained", "--scale", "smoke", "--out", str(out)]
    proc = _start(args, tmp_path)
    _wait_for(lambda: any((out / "runs").glob("*/trainer_state.json")))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert "finished models are kept: continue with" in line and "--resume" in line, err
    again = shlex.split(line.split("continue with ", 1)[1])
    assert again == [
        "nopelab", "reproduce", "zuo2025", "--part", "trained", "--scale", "smoke", "--seed",
        "0", "--device", "auto", "--out", str(out), "--resume",
    ]  # fmt: skip
    snapshot = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    time.sleep(3)  # the training processes were stopped too: nothing changes any more
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == snapshot


@pytest.mark.slow
def test_a_reproduction_interrupted_while_its_models_write_checkpoints_leaves_no_lock_or_temp(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the worker processes write their models' checkpoints: the workers clean up
    as an interrupted ``train`` does (lock files, temporary checkpoint files); --resume works."""
    out = tmp_path / "wang"
    args = ["reproduce", "wang2024", "--scale", "smoke", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopelab", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stuck_at("model.safetensors", tmp_path / "hooks"),
    )
    # both models at once where there are two cores; one at a time on one core
    _wait_for(lambda: any((out / "runs").glob("*/.model.safetensors.*.tmp")))
    assert list((out / "runs").glob(".*.lock"))  # the models' folders are locked
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert not [p for p in (out / "runs").rglob("*") if p.name.endswith((".lock", ".tmp"))]
    again = [sys.executable, "-m", "nopelab", *args, "--resume"]
    done = subprocess.run(again, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_interrupt_swallowed_by_a_c_callback_is_delivered_again() -> None:
    # numba's compiler calls back into Python through ctypes; an interrupt raised there is
    # "ignored" by ctypes, and a SIGTERM during compilation used to leave the run going
    script = """
import ctypes, sys, time
from nopelab import cli
sys.unraisablehook = cli._redeliver_interrupt
def callback():
    raise KeyboardInterrupt
ctypes.CFUNCTYPE(None)(callback)()
try:
    time.sleep(30)
except KeyboardInterrupt:
    print("interrupted")
"""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "interrupted", done.stderr
    assert time.monotonic() - started < 25


def test_run_files_are_strict_json(tmp_path: Path) -> None:
    data = {"speed": float("nan"), "rows": [np.float32("inf"), 1.5, (2, None)], "ids": np.arange(2)}
    write_json(tmp_path / "a.json", data)
    text = (tmp_path / "a.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"speed": None, "rows": [None, 1.5, [2, None]], "ids": [0, 1]}
    with pytest.raises(TypeError, match="set"):
        write_json(tmp_path / "b.json", {"x": {1}})


def test_a_lock_creates_missing_parents_and_removes_them_when_left_empty(tmp_path: Path) -> None:
    with locked(tmp_path / "a" / "b" / "out"):
        assert (tmp_path / "a" / "b" / ".out.lock").is_file()
    assert not (tmp_path / "a").exists()  # nothing was written: no folder is left
    with locked(tmp_path / "a" / "b" / "out"):
        (tmp_path / "a" / "b" / "out").mkdir()
    assert (tmp_path / "a" / "b" / "out").is_dir()
    assert not (tmp_path / "a" / "b" / ".out.lock").exists()


def test_a_marker_with_tuples_resumes(tmp_path: Path) -> None:
    """A resumable run's marker goes through JSON (tuples become lists): the same settings typed
    again, e.g. ``--samples 4,16``, must match it; other values must not."""
    from nopelab.errors import UserError
    from nopelab.runtime.rundir import MARKER, _check_resumable

    marker = {"paper": "chi2023", "samples": (4, 16), "sizes": [{"d_model": 24}]}
    (tmp_path / MARKER).write_text(json.dumps(marker))
    _check_resumable(tmp_path, marker)
    with pytest.raises(UserError, match="samples is \\[4, 32\\]"):
        _check_resumable(tmp_path, {**marker, "samples": (4, 32)})


@pytest.mark.parametrize("interrupted_after", [0, 1, 2, 3])
def test_files_replaced_together_keep_their_previous_versions_until_the_last_is_moved(
    interrupted_after: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt after k of three moves: the files not yet moved keep their old contents,
    and until the last (the one that commits the set) is moved, every earlier file's old
    version stays reachable; once the set is whole (none moved, or all) no copy is left."""
    from nopelab.runtime import rundir

    paths = [tmp_path / name for name in ("model", "optimizer", "state")]
    for path in paths:
        path.write_text(f"old {path.name}")
    real_replace = os.replace
    moved: list[Path] = []

    def replace_then_interrupt(source: Path, target: Path) -> None:
        if interrupted_after > 0:  # the interrupt lands as the move returns
            real_replace(source, target)
            moved.append(target)
        if len(moved) == interrupted_after:
            raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt), rundir.replaced_together(paths) as tmps:
        for tmp, path in zip(tmps, paths, strict=True):
            tmp.write_text(f"new {path.name}")
    monkeypatch.undo()
    assert [p.read_text().split()[0] for p in paths] == ["new"] * len(moved) + ["old"] * (
        3 - len(moved)
    )
    left = sorted(p.name for p in tmp_path.iterdir() if p not in paths)
    if len(moved) in (0, 3):
        assert left == []
    else:
        assert left == [".model.previous", ".optimizer.previous"]  # no temporary file
        for path in paths[:2]:
            assert rundir.previous_version(path).read_text() == f"old {path.name}"
