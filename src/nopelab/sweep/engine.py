"""Run a grid's cells as Ray tasks: in parallel, resumable, one results table.

The sweep folder holds ``grid.json`` (the grid it was started with), ``cells/KEY/`` (each cell's
files, written all-or-nothing), ``results/KEY.parquet`` (each finished cell's rows: together a
parquet dataset, ``pandas.read_parquet(FOLDER / "results")``) and ``failed/KEY.txt`` (the
one-line error of a cell that failed). A cell counts as finished when its results file exists;
a re-run skips finished cells and runs the others again. What a stopped cell leaves (its hidden
staging folder and lock file in ``cells/``) is removed once its worker has exited: when the sweep
stops, and when it starts again after a kill.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from nopelab.errors import UserError, first_line
from nopelab.runtime.progress import progress_bar, say
from nopelab.runtime.rundir import (
    check_path,
    locked,
    replace_atomically,
    staged_run,
    write_json,
)
from nopelab.sweep.cluster import start_ray, worker_threads
from nopelab.sweep.grid import Cell, Grid

GRID_FILE = "grid.json"
WORKERS_EXIT = 10.0  # seconds a stopped sweep waits for its cells' workers to exit
LEFT_BEHIND = re.compile(r"\.([0-9a-f]{16})\.(?:lock|staging-[a-z0-9_]{8})")  # in cells/: KEY


@dataclass(frozen=True)
class Outcome:
    key: str
    error: str | None = None  # None: finished


def run_one(cell: Cell, out: Path, threads: int) -> Outcome:
    """One cell, as a Ray task runs it: its folder all-or-nothing, then its results file."""
    from nopelab.sweep.cells import run_cell

    worker_threads(threads)
    failed = out / "failed" / f"{cell.key}.txt"
    try:
        with staged_run(out / "cells" / cell.key, force=True, command="sweep-cell") as staging:
            write_json(staging / "cell.json", {"command": cell.command, **cell.settings})
            rows = run_cell(cell, staging)
    except Exception as exc:  # a failing cell is recorded; the others go on
        message = first_line(exc)
        failed.parent.mkdir(exist_ok=True)
        replace_atomically(failed, lambda tmp: tmp.write_text(message + "\n"))
        return Outcome(cell.key, message)
    (out / "results").mkdir(exist_ok=True)
    frame = pd.DataFrame(rows)
    replace_atomically(
        out / "results" / f"{cell.key}.parquet", lambda tmp: frame.to_parquet(tmp, index=False)
    )
    failed.unlink(missing_ok=True)
    return Outcome(cell.key)


def finished(out: Path) -> set[str]:
    """Keys of the cells whose results are written."""
    return {p.stem for p in (out / "results").glob("*.parquet")}


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
    """Remove the staging folders and lock files that stopped cells left in ``out/cells``,
    waiting up to ``wait`` seconds in all for their workers to exit; a cell whose worker still
    runs keeps them (it removes them itself, or the next run does)."""
    left: dict[str, list[Path]] = {}
    for path in (out / "cells").glob(".*"):
        if found := LEFT_BEHIND.fullmatch(path.name):
            left.setdefault(found[1], []).append(path)
    deadline = time.monotonic() + wait
    for key, paths in sorted(left.items()):
        try:
            with locked(out / "cells" / key, wait=max(0.0, deadline - time.monotonic())):
                for path in paths:
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
        except UserError:  # its worker has not exited yet
            continue


def _jsonable_grid(grid: Grid) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(grid), default=list))


def run_sweep(grid: Grid, out: Path, address: str | None = None) -> dict[str, int]:
    """Run every unfinished cell of ``grid`` into ``out`` on Ray; return counts of cells
    ``done`` (this time and before), ``failed`` and ``skipped`` (finished before)."""
    cells = grid.cells()
    if address is not None:
        check_address(address)
    target = check_path(out)
    if target.exists() and not target.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    out = target
    with locked(out):
        prepare(out, grid)
        done_before = finished(out)
        todo = [cell for cell in cells if cell.key not in done_before]
        counts = {"done": len(cells) - len(todo), "failed": 0, "skipped": len(cells) - len(todo)}
        say(f"sweep: {len(cells)} cells, {counts['skipped']} finished before, {len(todo)} to run")
        if todo:
            _run_on_ray(grid, todo, out, address, counts, len(cells))
    return counts


def _run_on_ray(
    grid: Grid, todo: list[Cell], out: Path, address: str | None, counts: dict[str, int],
    total: int,
) -> None:  # fmt: skip
    import ray

    r = grid.resources
    start_ray(address)
    try:
        task = ray.remote(num_cpus=r.cpus_per_cell, num_gpus=r.gpus_per_cell, max_retries=0)(
            run_one
        )
        pending = {task.remote(cell, out, r.threads_per_cell): cell for cell in todo}
        slots = max(1, int(ray.cluster_resources().get("CPU", 1) // r.cpus_per_cell))
        start = time.perf_counter()
        with progress_bar(transient=False) as bar:
            shown = bar.add_task("cells", total=total, completed=counts["done"])
            while pending:
                running = min(len(pending), slots)
                bar.update(
                    shown, description=f"cells ({running} running, {counts['failed']} failed)"
                )
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    cell = pending.pop(ref)
                    outcome = _outcome(ref, cell, out)
                    if outcome.error is None:
                        counts["done"] += 1
                        bar.advance(shown)
                    else:
                        counts["failed"] += 1
                    if bar.disable:  # no terminal: a line per cell
                        what = "done" if outcome.error is None else f"failed: {outcome.error}"
                        say(
                            f"cell {cell.key} {what} ({counts['done']}/{total} done, "
                            f"{counts['failed']} failed, {len(pending)} to go; "
                            f"{time.perf_counter() - start:.0f} s)"
                        )
    finally:
        ray.shutdown()  # stops the cells still running (cancelling them races in Ray)
        tidy_cells(out, wait=WORKERS_EXIT)


def _outcome(ref: Any, cell: Cell, out: Path) -> Outcome:
    """A finished task's outcome; a task Ray lost (out of memory, a crashed worker) counts as a
    failed cell."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        message = first_line(exc)
        failed = out / "failed" / f"{cell.key}.txt"
        failed.parent.mkdir(exist_ok=True)
        replace_atomically(failed, lambda tmp: tmp.write_text(f"Ray: {message}\n"))
        return Outcome(cell.key, f"Ray: {message}")
