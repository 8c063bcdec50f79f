"""A job's files packed on a node and laid out under the driver's folder."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from nopelab.errors import RunFailed
from nopelab.runtime.jobs import DONE, Job, _run_shipped, is_done
from nopelab.runtime.shipping import PREFIX, land, pack


def write_job(scratch: Path) -> None:
    (scratch / "cells" / "k1" / "sub").mkdir(parents=True)
    (scratch / "cells" / "k1" / "sub" / "model.bin").write_bytes(bytes(range(256)) * 10)
    (scratch / "cells" / "k1" / DONE).write_text("{}\n")
    (scratch / "results").mkdir()
    (scratch / "results" / "k1.parquet").write_bytes(b"rows")
    (scratch / "failed").mkdir()
    (scratch / "failed" / "k1.txt").write_text("an old failure\n")


def test_land_lays_out_every_file_and_replaces_what_an_earlier_try_left(tmp_path: Path) -> None:
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    write_job(scratch)
    (out / "cells" / "k1").mkdir(parents=True)
    (out / "cells" / "k1" / "half-written").write_text("x")
    (out / "cells" / "k0").mkdir()  # another job's folder: untouched
    (out / "results").mkdir()
    (out / "results" / "k0.parquet").write_bytes(b"other")
    land(pack(scratch), out / "cells", "k1")
    assert (out / "cells" / "k1" / "sub" / "model.bin").read_bytes() == bytes(range(256)) * 10
    assert not (out / "cells" / "k1" / "half-written").exists()
    assert (out / "results" / "k1.parquet").read_bytes() == b"rows"
    assert (out / "results" / "k0.parquet").read_bytes() == b"other"
    assert (out / "cells" / "k0").is_dir()
    assert not (out / "failed").exists()  # the driver records failures itself
    assert sorted(p.name for p in (out / "cells").iterdir()) == ["k0", "k1"]  # no staging left


def test_an_archive_that_reaches_outside_the_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"evil"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        land(buffer.getvalue(), tmp_path / "out" / "cells", "k1")
    assert not list(tmp_path.rglob("escaped.txt"))
    assert list((tmp_path / "out" / "cells").iterdir()) == []


def make_files(folder: Path) -> None:
    (folder / "a.txt").write_text("made on the node")
    (folder.parent.parent / "results").mkdir(exist_ok=True)
    (folder.parent.parent / "results" / f"{folder.name}.txt").write_text("row")


def fail(folder: Path) -> None:
    raise ValueError("bad cell")


def test_a_shipped_job_runs_in_a_scratch_folder_of_the_node_and_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a node the job writes under that node's temporary folder, removed afterwards; the
    archive lays out as the same job run here would have written."""
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(node_tmp))
    error, archive = _run_shipped(Job("k1", make_files), "cells", 1, keep_going=True)
    assert error is None and list(node_tmp.iterdir()) == []
    out = tmp_path / "out"
    land(archive, out / "cells", "k1")
    assert is_done(out / "cells", "k1")
    assert (out / "cells" / "k1" / "a.txt").read_text() == "made on the node"
    assert (out / "results" / "k1.txt").read_text() == "row"

    error, archive = _run_shipped(Job("k2", fail), "cells", 1, keep_going=True)
    assert error == "bad cell" and archive == b"" and list(node_tmp.iterdir()) == []


def test_scratch_folders_of_killed_jobs_are_removed_by_the_next_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job killed on a node leaves its scratch folder; the next job there removes it, but not
    one whose process still runs."""
    import os
    import subprocess

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id that has ended
    dead = tmp_path / f"{PREFIX}{gone.pid}-abcd1234"
    living = tmp_path / f"{PREFIX}{os.getppid()}-abcd1234"
    other = tmp_path / "someone-elses"
    for folder in (dead, living, other):
        (folder / "cells").mkdir(parents=True)
    error, _ = _run_shipped(Job("k1", make_files), "cells", 1, keep_going=True)
    assert error is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([living.name, other.name])


def test_a_node_without_room_for_its_scratch_folder_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "no-such-folder"))
    error, archive = _run_shipped(Job("k1", make_files), "cells", 1, keep_going=True)
    assert error is not None and error.startswith("the node's scratch folder: ") and archive == b""
    with pytest.raises(OSError):
        _run_shipped(Job("k1", make_files), "cells", 1, keep_going=False)


def test_a_file_outside_the_job_folder_must_be_named_after_the_job(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    write_job(scratch)
    (scratch / "grid.json").write_text("{}")  # would replace the sweep's own file
    out = tmp_path / "out"
    with pytest.raises(RunFailed, match=r"the node sent grid\.json"):
        land(pack(scratch), out / "cells", "k1")
    assert not (out / "grid.json").exists() and list((out / "cells").iterdir()) == []
