"""A grid of small training cells: one after another in one process, and through ``nopelab sweep``.

Run: ``.venv/bin/python benchmarks/bench_sweep.py`` (``--quick``: fewer steps; ``--d-model``,
``--batch-size``: another cell size). Everything is measured in this one run on this machine:

* serial: the 8 cells one after another in this process, torch using every core (one
  many-thread cell at a time: what a shell loop over ``nopelab train`` does);
* sweep: the same 8 cells through the sweep engine with the default resources (one CPU and
  one torch thread per cell, so as many cells at once as cores, in worker processes), from the
  start to the last result file;
* sweep, one many-thread cell at a time: the same grid with ``cpus_per_cell`` and
  ``threads_per_cell`` set to the number of cores: is the default the faster of the two?
* fixed cost: a sweep of 8 one-step cells of the same model: its wall time is the workers'
  start-up (a fresh interpreter importing torch) plus the per-cell cost (dispatch, the cell's
  folder and results file, data generation), which the speed-up has to pay for.

The cells: copy task (lines up to 5 letters), 2 layers, 2 heads, d = ``--d-model`` (32),
batch ``--batch-size`` (4) x 64 tokens, ``--steps`` steps each, a crossed grid of 2 encodings x
2 learning rates x 2 seeds. How much a second thread speeds up one cell grows with the model:
the sweep gains most where it does not help. The workers' start-up is paid once per sweep, so
the speed-up also grows with the length of the cells.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from nopelab.runtime.allocator import keep_freed_memory
from nopelab.sweep.cells import run_cell
from nopelab.sweep.engine import run_sweep
from nopelab.sweep.grid import parse_grid


def grid(steps: int, d_model: int = 32, batch_size: int = 16, threads: int = 1) -> dict:
    return {
        "command": "train",
        "seeds": [0, 1],
        "base": {
            "task": {"name": "copy", "max_len": 5, "train_size": 2000, "test_size": 64},
            "model": {"n_layers": 2, "n_heads": 2, "d_model": d_model},
            "train": {
                "steps": steps, "batch_size": batch_size, "seq_len": 64, "eval_every": steps,
                "checkpoint_every": steps, "eval_samples": 64, "device": "cpu",
            },
        },
        "axes": {"model.pos_encoding": ["none", "learned"], "train.lr": [1e-3, 3e-3]},
        "resources": {"cpus_per_cell": threads, "threads_per_cell": threads},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="500 steps per cell")
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    steps = 500 if args.quick else args.steps
    size = dict(d_model=args.d_model, batch_size=args.batch_size)
    cores = os.cpu_count() or 1
    keep_freed_memory()  # as the command line and the sweep's cells do
    spec = parse_grid(grid(steps, **size))
    cells = spec.cells()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for cell in cells:
            run_cell(cell, Path(tmp) / "serial" / cell.key)
        serial = time.perf_counter() - start

        start = time.perf_counter()
        run_sweep(spec, Path(tmp) / "sweep")
        swept = time.perf_counter() - start

        start = time.perf_counter()
        run_sweep(parse_grid(grid(steps, **size, threads=cores)), Path(tmp) / "wide")
        wide = time.perf_counter() - start

        start = time.perf_counter()
        run_sweep(parse_grid(grid(1, **size)), Path(tmp) / "overhead")
        overhead = time.perf_counter() - start

    n = len(cells)
    print(f"\n{n} cells of {steps} steps, d = {args.d_model}, batch {args.batch_size} x 64\n")
    print("| run | wall (s) | per cell (s) |")
    print("|---|---|---|")
    rows = [
        (f"serial, one {threads}-thread cell at a time", serial),
        (f"nopelab sweep, {cores} one-thread cells at a time (default)", swept),
        (f"nopelab sweep, one {cores}-thread cell at a time", wide),
        (f"fixed cost: nopelab sweep of {n} one-step cells", overhead),
    ]
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {seconds / n:.2f} |")
    print(f"\nspeed-up of the default sweep over the serial loop: {serial / swept:.2f}x")
    print(
        f"speed-up of one-thread cells over {cores}-thread cells in the sweep: {wide / swept:.2f}x"
    )


if __name__ == "__main__":
    main()
