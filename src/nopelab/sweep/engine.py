"""Run a grid's cells through the job runner: side by side, resumable, one results table.

The sweep folder holds ``grid.json`` (the grid it was started with), ``cells/KEY/`` (each cell's
files, written all-or-nothing, and :data:`~nopelab.runtime.jobs.DONE` once the cell finished),
``results/KEY.parquet`` (each finished cell's rows; :func:`read_results` reads them as one
table) and ``failed/KEY.txt`` (the one-line error of a
cell that failed). A re-run skips finished cells and runs the others again. What a stopped
cell leaves (its hidden staging folder and lock file in ``cells/``, a half-written results file
in ``results/``) is removed once its worker has exited: when the sweep stops, and when it starts
again after a kill.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nopelab.errors import UserError
from nopelab.runtime.cluster import connect_ray
from nopelab.runtime.jobs import Job, Share, run_jobs
from nopelab.runtime.rundir import (
    check_path,
    locked,
    replace_atomically,
    staged_run,
    write_json,
)
from nopelab.sweep.grid import Cell, Grid

GRID_FILE = "grid.json"
WORKERS_EXIT = 10.0  # seconds a stopped sweep waits for its cells' workers to exit
LEFT_BEHIND = {  # what a stopped cell leaves, by folder: its key, then the rest of the name
    "cells": re.compile(r"\.([0-9a-f]{16})\.(?:lock|staging-[a-z0-9_]{8})"),
    "results": re.compile(r"\.([0-9a-f]{16})\.parquet\.[a-z0-9_]{8}\.tmp"),  # replace_atomically's
}


def read_results(out: Path) -> Any:
    """Every finished cell's rows of the sweep in ``out``, in one table ordered by cell key, with
    the union of the cells' columns (a BPE cell's ``loss_per_byte`` beside byte cells: pandas
    reading ``results/`` as one dataset would keep only the first file's columns): a pandas
    ``DataFrame``."""
    import pandas as pd

    files = sorted((out / "results").glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    rows = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return rows.sort_values("cell", kind="stable", ignore_index=True)


def run_cell_job(cell: Cell, folder: Path) -> None:
    """One cell, as the runner runs it: its folder all-or-nothing, then its results file, both
    under the cell's lock (so :func:`tidy_cells` knows when a stopped cell's worker has exited)."""
    import pandas as pd

    from nopelab.sweep.cells import run_cell

    with locked(folder):
        with staged_run(folder, force=True, command="sweep-cell") as staging:
            write_json(staging / "cell.json", {"command": cell.command, **cell.settings})
            rows = run_cell(cell, staging)
        results = folder.parent.parent / "results"
        results.mkdir(exist_ok=True)
        frame = pd.DataFrame(rows)
        replace_atomically(
            results / f"{cell.key}.parquet", lambda tmp: frame.to_parquet(tmp, index=False)
        )


def check_address(address: str) -> None:
    """Refuse an unreachable Ray address at once (``ray.init`` would wait a long time)."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--address: expected HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError):
        raise UserError(f"--address: no Ray cluster answers at {address}") from None


def prepare(out: Path, grid: Grid) -> None:
    """A new sweep folder, or the folder of the same grid to continue; anything else is refused."""
    record = {"grid": _jsonable_grid(grid)}
    if out.exists() and any(out.iterdir()):
        if not (out / GRID_FILE).is_file():
            raise UserError(f"--out: {out} is not empty and holds no sweep; choose a new folder")
        if json.loads((out / GRID_FILE).read_text()) != record:
            raise UserError(
                f"--out: {out} holds a sweep of another grid; choose a new folder for this one"
            )
        tidy_cells(out)
        return
    with staged_run(out, force=False, command="sweep") as staging:
        write_json(staging / GRID_FILE, record)


def tidy_cells(out: Path, wait: float = 0.0) -> None:
    """Remove the staging folders, lock files and empty cell folders that stopped cells left in
    ``out/cells``, and their half-written results files in ``out/results``, waiting up to
    ``wait`` seconds in all for their workers to exit; a cell whose worker still runs keeps them
    (it removes them itself, or the next run does)."""
    left: dict[str, list[Path]] = {}
    for where, pattern in LEFT_BEHIND.items():
        for path in (out / where).glob(".*"):
            if found := pattern.fullmatch(path.name):
                left.setdefault(found[1], []).append(path)
    deadline = time.monotonic() + wait
    running = set()
    for key, paths in sorted(left.items()):
        try:
            with locked(out / "cells" / key, wait=max(0.0, deadline - time.monotonic())):
                for path in paths:
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    elif path.suffix == ".tmp":
                        path.unlink(missing_ok=True)
        except UserError:  # its worker has not exited yet
            running.add(key)
    for folder in (out / "cells").glob("[!.]*"):
        if folder.name not in running and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # a cell stopped before it wrote anything


def _jsonable_grid(grid: Grid) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(grid), default=list))


def run_sweep(grid: Grid, out: Path, address: str | None = None) -> dict[str, int]:
    """Run every unfinished cell of ``grid`` into ``out`` (on the Ray cluster at ``address``,
    if given); return counts of cells
    ``done`` (this time and before), ``failed`` and ``skipped`` (finished before)."""
    cells = grid.cells()
    if address is not None:
        check_address(address)
    target = check_path(out)
    if target.exists() and not target.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    out = target
    if address is None:
        return _run_cells(grid, cells, out, None)
    connect_ray(address)  # before the sweep's folder: a cluster that fails writes nothing
    try:
        return _run_cells(grid, cells, out, address)
    finally:
        import ray

        ray.shutdown()  # also when the folder is refused or every cell had finished


def _run_cells(grid: Grid, cells: list[Cell], out: Path, address: str | None) -> dict[str, int]:
    r = grid.resources
    jobs = [Job(cell.key, run_cell_job, (cell,)) for cell in cells]
    with locked(out):
        prepare(out, grid)
        try:
            return run_jobs(
                jobs, out / "cells", "sweep", None, what="cells", address=address,
                share=Share(r.cpus_per_cell, r.gpus_per_cell, r.threads_per_cell), keep_going=True,
            )  # fmt: skip
        finally:
            tidy_cells(out, wait=WORKERS_EXIT)
