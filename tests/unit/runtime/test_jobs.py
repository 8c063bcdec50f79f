"""The job runner: each job runs once, finished ones are skipped, errors surface or (keep_going)
are recorded while the others go on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nopelab.errors import RunFailed, UserError
from nopelab.runtime.jobs import DONE, Job, is_done, run_jobs


def test_finished_jobs_are_skipped_and_a_failed_one_runs_again(tmp_path: Path) -> None:
    calls: list[str] = []

    def write(text: str, folder: Path) -> None:
        calls.append(text)
        if text == "bad":
            raise UserError("--thing: bad")
        (folder / "out.txt").write_text(text)

    jobs = [Job("a", write, ("one",)), Job("b", write, ("bad",)), Job("c", write, ("three",))]
    with pytest.raises(UserError, match="--thing: bad"):
        run_jobs(jobs, tmp_path / "runs", "test", workers=1)
    assert calls == ["one", "bad"]
    assert (tmp_path / "runs" / "a" / DONE).is_file()
    assert not (tmp_path / "runs" / "b" / DONE).exists()

    jobs[1] = Job("b", write, ("two",))
    run_jobs(jobs, tmp_path / "runs", "test", workers=1)
    assert calls == ["one", "bad", "two", "three"]  # a was not run again
    texts = [(tmp_path / "runs" / name / "out.txt").read_text() for name in "abc"]
    assert texts == ["one", "two", "three"]
    with pytest.raises(ValueError, match="repeat"):
        run_jobs([Job("a", write), Job("a", write)], tmp_path / "runs", "test", workers=1)


def write_pid(folder: Path) -> None:
    (folder / "pid.txt").write_text(str(os.getpid()))


def fail(folder: Path) -> None:
    raise UserError("--lr: must be > 0")


def die(folder: Path) -> None:
    os._exit(9)  # as the kernel's out-of-memory killer ends a process


@pytest.mark.slow
@pytest.mark.parametrize("where", [{"workers": 2}, {"workers": None, "address": "local"}])
def test_jobs_in_workers_run_in_other_processes_and_their_error_is_raised_here(
    tmp_path: Path, where: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool of worker processes (the default on a CPU), or Ray tasks (a local Ray cluster)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # Ray's workers import this
    run_jobs([Job(name, write_pid) for name in "abcd"], tmp_path / "runs", "test", **where)
    pids = {(tmp_path / "runs" / name / "pid.txt").read_text() for name in "abcd"}
    assert str(os.getpid()) not in pids
    assert all((tmp_path / "runs" / name / DONE).is_file() for name in "abcd")
    run_jobs([Job("a", write_pid), Job("e", write_pid)], tmp_path / "runs", "test", **where)
    assert (tmp_path / "runs" / "e" / "pid.txt").read_text() != str(os.getpid())  # one job left
    with pytest.raises(UserError, match="--lr: must be > 0"):
        run_jobs([Job("g", write_pid), Job("f", fail)], tmp_path / "runs", "test", **where)
    assert not (tmp_path / "runs" / "f" / DONE).exists()


def test_a_worker_that_dies_fails_the_run_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RunFailed, match="a worker process died while running b"):
        run_jobs([Job("b", die)], tmp_path / "runs", "test", workers=2)
    assert not (tmp_path / "runs" / "b" / DONE).exists()


def test_with_keep_going_a_failure_is_recorded_and_the_others_run(tmp_path: Path) -> None:
    def write(text: str, folder: Path) -> None:
        if text == "bad":
            raise UserError("--thing: bad")
        (folder / "out.txt").write_text(text)

    jobs = [Job("a", write, ("one",)), Job("b", write, ("bad",)), Job("c", write, ("three",))]
    root = tmp_path / "cells"
    counts = run_jobs(jobs, root, "test", workers=1, keep_going=True)
    assert counts == {"done": 2, "failed": 1, "skipped": 0}
    assert (tmp_path / "failed" / "b.txt").read_text() == "--thing: bad\n"
    assert [is_done(root, key) for key in "abc"] == [True, False, True]
    jobs[1] = Job("b", write, ("two",))
    counts = run_jobs(jobs, root, "test", workers=1, keep_going=True)
    assert counts == {"done": 3, "failed": 0, "skipped": 2}
    assert not (tmp_path / "failed" / "b.txt").exists()  # the failure record goes with success
