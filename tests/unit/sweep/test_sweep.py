"""nopelab sweep: grid files checked before anything is written, cells run side by side, resumable."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from nopelab.errors import ConfigError, UserError
from nopelab.runtime.jobs import DONE
from nopelab.runtime.rundir import locked
from nopelab.sweep.engine import prepare
from nopelab.sweep.grid import parse_grid, read_grid
from stuck import stuck_at

# Ray's connect windows (the GCS port, each connect attempt, the Python client), in seconds:
# short, so that a test of a server that is not Ray takes seconds (by default 40)
RAY_TIMEOUTS = {
    "RAY_gcs_server_port_wait_time_s": "1",
    "RAY_gcs_rpc_server_connect_timeout_s": "1",
    "RAY_py_gcs_connect_timeout_s": "2",
}
BASE = """
[base.task]
name = "copy"
max_len = 3
train_size = 200
test_size = 16

[base.model]
n_layers = 1
n_heads = 2
d_model = 32

[base.train]
steps = {steps}
batch_size = 8
seq_len = 32
eval_every = {steps}
checkpoint_every = {steps}
eval_samples = 16
device = "cpu"
"""


def grid_text(axes: str, steps: int = 4, top: str = "", command: str = "train") -> str:
    """A grid: top-level keys, the base tables of a tiny copy-task model, then ``axes``."""
    return f'command = "{command}"\n{top}\n{BASE.format(steps=steps)}\n{axes}\n'


def write_grid(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def parse(text: str):
    import tomllib

    return parse_grid(tomllib.loads(text))


def test_cells_cross_axes_zip_pairs_and_seeds_multiply() -> None:
    grid = parse(
        grid_text(
            '[axes]\n"model.pos_encoding" = ["none", "learned", "rope"]\n'
            '[zip]\n"model.d_model" = [32, 64]\n"model.n_heads" = [2, 4]\n',
            top="seeds = [0, 1]",
        )
    )
    cells = grid.cells()
    assert len(cells) == 2 * 3 * 2  # zip pairs x crossed values x seeds
    assert grid.size == len(cells)
    pairs = {(c.settings["model"]["d_model"], c.settings["model"]["n_heads"]) for c in cells}
    assert pairs == {(32, 2), (64, 4)}  # zipped, never crossed
    assert {c.settings["train"]["seed"] for c in cells} == {0, 1}
    assert len({c.key for c in cells}) == len(cells)
    again = parse(grid_text('[axes]\n"model.pos_encoding" = ["none"]')).cells()[0]
    assert again.key == parse(grid_text('[axes]\n"model.pos_encoding" = ["none"]')).cells()[0].key


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        (grid_text('[axes]\n"model.layerz" = [1, 2]'), "axes.model.layerz", "unknown setting"),
        (grid_text('[axes]\n"probe.seeds" = [1, 2]'), "axes.probe.seeds", "unknown setting"),
        (grid_text('[axes]\n"model.n_layers" = []'), "axes.model.n_layers", "empty axis"),
        (grid_text('[axes]\n"model.n_layers" = 2'), "axes.model.n_layers", "expected a list"),
        (grid_text('[axes]\n"model.n_layers" = [1, "x"]'), "axes.model.n_layers", "expected int"),
        (grid_text('[axes]\n"model.pos_encoding" = ["fourier"]'), "axes.model.pos_encoding", "unknown value"),
        (grid_text('[axes]\n"model.n_layers" = [0]'), "axes.model.n_layers", "> 0"),
        ('command = "analyze"\n[base.model]\nn_layers = 0', "base.model.n_layers", "> 0"),
        ('command = "analyze"\n[base.task]\nname = "copy"', "base", "unknown section 'task'"),
        (grid_text("", command="fit"), "command", "allowed: train"),
        (grid_text("", top="colour = 1"), "colour", "unknown key"),
        (grid_text('[zip]\n"model.d_model" = [32, 64]\n"model.n_heads" = [2]'), "zip", "same number"),
        (grid_text("", top="seeds = []"), "seeds", "non-empty"),
        (grid_text("", top="seeds = [0, -1]"), "seeds", "must be an int in 0..9223372036854775807, got -1"),
        ('command = "train"\n[axes]\n"corpus.source" = ["sotu", "sotu+sotu"]', "axes.corpus.source", "'sotu' appears twice"),
        # copy(aaaaaaaa)=aaaaaaaa and its newline: 24 characters, more than a row holds
        ('command = "train"\n[base.task]\nname = "copy"\nmax_len = 8\n[base.train]\nseq_len = 16', "base.train.seq_len", "line of the task (24 characters), got 16"),
        ('command = "train"\n[base.task]\nname = "copy"\nmax_len = 8\n[axes]\n"train.seq_len" = [24, 23]', "axes.train.seq_len", "(24 characters), got 23"),
        (grid_text("[resources]\ncpus_per_cell = 0"), "resources.cpus_per_cell", "> 0"),
        (grid_text("[resources]\nthreads = 2"), "resources.threads", "unknown key"),
    ],
)  # fmt: skip
def test_bad_grids_name_the_field(text: str, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.field == field, str(info.value)
    assert fragment in str(info.value)


def run_sweep_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nopelab", "sweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("axes", "extra", "message"),
    [
        ('[axes]\n"model.layerz" = [1]', [], "axes.model.layerz: unknown setting"),
        ('[axes]\n"model.n_layers" = []', [], "axes.model.n_layers: empty axis"),
        ('[axes]\n"train.lr" = ["fast"]', [], "axes.train.lr: expected float"),
        ('[axes]\n"model.n_layers" = [1]', ["--address", "127.0.0.1:9"], "--address: no Ray"),
        ('[axes]\n"model.n_layers" = [1]', ["--out", "grid.toml"], "--out: grid.toml exists and is not a directory"),
        ('[axes]\n"model.n_layers" = [1]', ["--out", "a" * 300], "--out: the name aaaaaaaaaaaaaaaa… is 300 bytes"),
    ],
)  # fmt: skip
def test_bad_sweep_input_is_one_line_exit_2_nothing_written(
    axes: str, extra: list[str], message: str, tmp_path: Path
) -> None:
    grid = write_grid(tmp_path, grid_text(axes))
    before = sorted(tmp_path.iterdir())
    done = run_sweep_cli([str(grid), "--out", str(tmp_path / "out"), *extra], tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"nopelab: error: {message}"), line
    assert sorted(tmp_path.iterdir()) == before


@pytest.fixture
def not_ray() -> Iterator[str]:
    """HOST:PORT of a server on this machine that accepts connections but is not Ray."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the server closed
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection in accepted:
        connection.close()


@pytest.mark.parametrize("address", ["auto", "NOT_RAY"])
def test_a_ray_cluster_that_cannot_be_reached_is_refused_before_the_sweep_folder(
    address: str, not_ray: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No cluster on this machine (auto), or a server that is not Ray: one line naming
    --address, nothing written, none of Ray's retry warnings (its connect timeouts shortened)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name, seconds in RAY_TIMEOUTS.items():
        monkeypatch.setenv(name, seconds)
    grid = write_grid(tmp_path, grid_text('[axes]\n"model.n_layers" = [1]'))
    before = sorted(tmp_path.iterdir())
    given = not_ray if address == "NOT_RAY" else address
    done = run_sweep_cli([str(grid), "--out", str(tmp_path / "out"), "--address", given], tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"nopelab: error: --address: cannot connect to a Ray cluster at {given}: "
    )
    assert sorted(tmp_path.iterdir()) == before


def test_a_grid_of_too_many_cells_is_refused_before_any_cell_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def built(*args, **kwargs):
        raise AssertionError("a cell was built")

    monkeypatch.setattr("nopelab.sweep.grid.validate", built)
    axes = "[axes]\n" + "".join(
        f'"train.{name}" = {list(range(1, 101))}\n' for name in ("steps", "warmup", "eval_every")
    )
    path = write_grid(tmp_path, grid_text(axes))
    with pytest.raises(UserError) as info:
        read_grid(path)
    assert str(info.value) == (
        f"GRID: {path}: 1,000,000 cells; a sweep takes at most 10,000: split the grid"
    )
    done = run_sweep_cli(["grid.toml"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "nopelab: error: GRID: grid.toml: 1,000,000 cells; a sweep takes at most 10,000: split the grid"
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["grid.toml"]


def test_what_killed_cells_left_is_removed_when_the_sweep_continues(tmp_path: Path) -> None:
    """A killed worker leaves its cell's lock file and staging folder; the next run removes them,
    but not those of a cell that is still being written, nor anything else in the folder."""
    grid = parse(grid_text('[axes]\n"model.n_layers" = [1, 2]'))
    out = tmp_path / "out"
    prepare(out, grid)
    killed, running = (out / "cells" / cell.key for cell in grid.cells())
    script = (
        "import sys, time; from pathlib import Path; from nopelab.runtime.rundir import staged_run\n"
        "with staged_run(Path(sys.argv[1]), force=True, command='sweep-cell'):\n"
        "    print('writing', flush=True); time.sleep(60)"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(cell)], stdout=subprocess.PIPE, text=True
        )
        for cell in (killed, running)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "writing"
        workers[0].kill()
        workers[0].wait()
        lock = out / "cells" / f".{killed.name}.lock"
        assert lock.read_text().strip() == str(workers[0].pid)  # the lock records its holder
        assert list((out / "cells").glob(f".{killed.name}.staging-*"))
        (out / "cells" / ".notes").write_text("the user's file")
        prepare(out, grid)  # the sweep continues
        left = sorted(p.name for p in (out / "cells").iterdir())
        assert not [name for name in left if name.startswith(f".{killed.name}")]
        assert f".{running.name}.lock" in left and ".notes" in left
        assert (out / "cells" / ".notes").read_text() == "the user's file"
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


def test_seed_runs_every_cell_at_that_seed_instead_of_the_grids(tmp_path: Path) -> None:
    grid = write_grid(tmp_path, grid_text('[axes]\n"model.n_layers" = [1]', top="seeds = [0, 1]"))
    done = run_sweep_cli([str(grid), "--out", str(tmp_path / "out"), "--seed", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    rows = pd.read_parquet(tmp_path / "out" / "results")
    assert list(rows["seed"]) == [3]
    run = json.loads((tmp_path / "out" / "run.json").read_text())  # what made the results
    assert run["command"].endswith("--seed 3") and run["cells_skipped"] == 0
    assert run["seconds"] > 0 and {"commit", "cpu", "nopelab"} <= set(run)
    kept = _result_file_script().sweep_summary(tmp_path / "out")  # docs/results' summary
    assert [row["seed"] for row in kept["results"]] == [3]
    other = run_sweep_cli([str(grid), "--out", str(tmp_path / "out"), "--seed", "4"], tmp_path)
    assert other.returncode == 2 and "holds a sweep of another grid" in other.stderr
    bad = run_sweep_cli([str(grid), "--out", str(tmp_path / "o2"), "--seed", "-1"], tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "nopelab: error: --seed: must be an int in 0..9223372036854775807, got -1"
    )
    assert not (tmp_path / "o2").exists()


def test_read_results_keeps_every_cells_columns(tmp_path: Path) -> None:
    """Cells that report different columns (a BPE cell's loss_per_byte beside a byte cell's):
    one table with the union, where pandas reading the folder keeps the first file's only."""
    from nopelab.sweep.engine import read_results

    (tmp_path / "results").mkdir()
    pd.DataFrame({"cell": ["b"], "loss": [2.0], "loss_per_byte": [0.7]}).to_parquet(
        tmp_path / "results" / "b.parquet"
    )
    pd.DataFrame({"cell": ["a"], "loss": [1.5]}).to_parquet(tmp_path / "results" / "a.parquet")
    rows = read_results(tmp_path)
    assert list(rows["cell"]) == ["a", "b"] and rows["loss_per_byte"].iloc[1] == 0.7
    assert "loss_per_byte" not in pd.read_parquet(tmp_path / "results")  # what it avoids
    assert read_results(tmp_path / "nothing").empty


def _result_file_script() -> Any:
    path = Path(__file__).resolve().parents[3] / "scripts" / "result_file.py"
    spec = importlib.util.spec_from_file_location("result_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_unknown_corpus_name_is_refused_before_the_sweep_folder_is_made(tmp_path: Path) -> None:
    """The grid check names the corpus as ``train --corpus`` does: exit 2, one line, no folder."""
    text = (
        'command = "train"\n[base.corpus]\nsource = "sotu+nosuch"\n[axes]\n"model.n_layers" = [1]'
    )
    done = run_sweep_cli(
        [str(write_grid(tmp_path, text)), "--out", str(tmp_path / "out")], tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "nopelab: error: base.corpus.source: unknown corpus name 'nosuch' in 'sotu+nosuch' "
        "(names: default, sotu)"
    )
    assert not (tmp_path / "out").exists()


def test_a_second_sweep_into_the_same_folder_is_refused(tmp_path: Path) -> None:
    grid = write_grid(tmp_path, grid_text('[axes]\n"model.n_layers" = [1]'))
    out = tmp_path / "out"
    with locked(out):  # as a running sweep holds it
        done = run_sweep_cli([str(grid), "--out", str(out)], tmp_path)
    assert done.returncode == 2
    assert "another nopelab process is writing" in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_running_a_cell_twice(tmp_path: Path) -> None:
    """8 cells; SIGINT once some have finished; the re-run runs only the others."""
    grid = write_grid(
        tmp_path,
        grid_text(
            '[axes]\n"model.pos_encoding" = ["none", "learned"]\n"train.lr" = [1e-3, 3e-3]',
            steps=150,
            top="seeds = [0, 1]",
        ),
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "nopelab", "sweep", str(grid), "--out", str(out)]
    first = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)

    # a cell is finished once its folder holds the runner's done marker, written just after its
    # results file: a cell stopped between the two is not finished and runs again
    def finished() -> set[str]:
        return {p.parent.name for p in (out / "cells").glob(f"*/{DONE}")}

    deadline = time.monotonic() + 300
    while len(finished()) < 2 and time.monotonic() < deadline:
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130
    assert "finished cells are kept" in first.stderr.read()
    kept = {
        f"{key}.parquet": (out / "results" / f"{key}.parquet").stat().st_mtime_ns
        for key in finished()
    }
    assert 2 <= len(kept) < 8

    second = run_sweep_cli([str(grid), "--out", str(out)], tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"{len(kept)} finished before, {8 - len(kept)} to run" in second.stderr
    for name, mtime in kept.items():  # finished cells were not run again
        assert (out / "results" / name).stat().st_mtime_ns == mtime
    rows = pd.read_parquet(out / "results")
    assert len(rows) == 8 and rows["cell"].nunique() == 8
    assert set(rows["model.pos_encoding"]) == {"none", "learned"}
    assert set(rows["seed"]) == {0, 1}
    for key in rows["cell"]:
        assert (out / "cells" / key / "train" / "model.safetensors").is_file()
    assert not list((out / "cells").glob(".*"))  # no half-written cell is left


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_sweep_leaves_no_lock_and_no_half_written_cell(
    signum: signal.Signals, tmp_path: Path
) -> None:
    grid = write_grid(tmp_path, grid_text("", steps=100_000, top="seeds = [0, 1]"))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "nopelab", "sweep", str(grid), "--out", str(out)]
    sweep = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(list((out / "cells").glob(".*.lock"))) < 2:  # both cells are being written
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    sweep.send_signal(signum)
    assert sweep.wait(timeout=120) == 130
    assert "finished cells are kept" in sweep.stderr.read()
    cells = out / "cells"  # removed with the last lock file when no cell had finished
    assert not cells.exists() or list(cells.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "out"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_sweep_stopped_while_a_cell_writes_its_results_leaves_no_temporary_file(
    signum: signal.Signals, tmp_path: Path
) -> None:
    """SIGTERM: the stopped sweep removes the cell's temporary results file; SIGKILL (the
    sweep cannot): the re-run removes it. The re-run finishes the cell."""
    grid = write_grid(tmp_path, grid_text('[axes]\n"model.n_layers" = [1]'))
    out = tmp_path / "out"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "nopelab", "sweep", str(grid), "--out", str(out)],
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
        env=stuck_at("*.parquet", tmp_path / "hooks"),
    )
    deadline = time.monotonic() + 120
    while not list((out / "results").glob(".*.tmp")):  # the write has begun
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    sweep.send_signal(signum)
    assert sweep.wait(timeout=60) == (130 if signum == signal.SIGTERM else -signal.SIGKILL)
    if signum == signal.SIGTERM:
        assert list((out / "results").iterdir()) == []
    again = run_sweep_cli([str(grid), "--out", str(out)], tmp_path)
    assert again.returncode == 0, again.stderr
    assert [p.suffix for p in (out / "results").iterdir()] == [".parquet"]
    assert not list((out / "cells").glob(".*"))


@pytest.mark.slow
def test_a_failing_cell_is_recorded_and_the_others_finish(tmp_path: Path) -> None:
    """Copy lines of one letter are 26, fewer than the 200 training lines asked for: the check
    of the grid does not draw lines, so that cell fails at run time, with one line."""
    grid = write_grid(tmp_path, grid_text('[axes]\n"task.max_len" = [1, 3]'))
    out = tmp_path / "out"
    done = run_sweep_cli([str(grid), "--out", str(out)], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "1 cells failed" in done.stderr
    (failure,) = (out / "failed").glob("*.txt")
    assert "train_size" in failure.read_text() and len(failure.read_text().splitlines()) == 1
    rows = pd.read_parquet(out / "results")
    assert list(rows["task.max_len"]) == [3]


@pytest.mark.slow
def test_a_cell_gives_the_numbers_of_a_serial_run(tmp_path: Path) -> None:
    """The same seed through the sweep (a worker process, one thread) and in this process."""
    import torch

    from nopelab.sweep.cells import run_cell

    text = grid_text('[axes]\n"model.pos_encoding" = ["none"]', steps=30)
    grid = write_grid(tmp_path, text)
    done = run_sweep_cli([str(grid), "--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 0, done.stderr
    swept = pd.read_parquet(tmp_path / "out" / "results").iloc[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (serial,) = run_cell(parse(text).cells()[0], tmp_path / "serial")
    finally:
        torch.set_num_threads(threads)
    assert serial["cell"] == swept["cell"]
    assert serial["loss"] == swept["loss"] and serial["accuracy"] == swept["accuracy"]


def test_sweep_help_names_the_grid_format() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "nopelab", "sweep", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0
    assert "--address" in done.stdout and "Grid file" in done.stdout
