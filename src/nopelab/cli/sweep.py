"""``nopelab sweep GRID.toml``: a grid of runs side by side, resumable, into one results table."""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli.app import OUTPUT, app
from nopelab.config import check_seed


@app.command()
def sweep(
    grid: Annotated[
        Path,
        typer.Argument(
            help="Grid file (TOML): command, \\[base] settings, \\[axes] (crossed), \\[zip], seeds, "
            "\\[resources]; see docs/sweeps.md"
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Sweep folder; running the same command again continues it \\[runs/sweep-GRID]",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="Run the cells on the Ray cluster at HOST:PORT (or auto) \\[worker processes here]"
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Run every cell at this one seed instead of the grid's seeds \\[the grid's]"
        ),
    ] = None,
) -> None:
    """Run every cell of a grid, side by side; finished cells are skipped on a re-run, their rows
    gathered in OUT/results (nopelab.sweep.engine.read_results reads it as one table)."""
    from nopelab.runtime import provenance
    from nopelab.runtime.rundir import replace_atomically, write_json
    from nopelab.sweep.engine import run_sweep
    from nopelab.sweep.grid import read_grid

    if seed is not None:
        check_seed("--seed", seed)
    spec = read_grid(grid)
    if seed is not None:
        spec = dataclasses.replace(spec, seeds=(seed,))
    out = out or Path("runs") / f"sweep-{grid.stem}"
    flags = ["--out", str(out), *(["--seed", str(seed)] if seed is not None else [])]
    again = shlex.join(["nopelab", "sweep", str(grid), *flags])
    begun, start = provenance.start(), time.perf_counter()
    try:
        counts = run_sweep(spec, out, address)
    except KeyboardInterrupt:
        typer.echo(
            f"nopelab: interrupted; finished cells are kept: continue with {again}", err=True
        )
        sys.exit(130)
    if counts["failed"]:
        typer.echo(
            f"nopelab: error: {counts['failed']} cells failed (their errors: {out / 'failed'}); "
            f"the others are in {out / 'results'}; rerun with {again}",
            err=True,
        )
        sys.exit(1)
    # run.json: what made the results; a re-run that skipped finished cells says how many
    run = provenance.record(again, begun, time.perf_counter() - start)
    run["cells_skipped"] = counts["skipped"]
    replace_atomically(out / "run.json", lambda tmp: write_json(tmp, run))
    typer.echo(f"wrote {out / 'results'} ({counts['done']} cells)")
