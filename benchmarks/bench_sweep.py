"""A grid of small training cells: one after another in one process, and through ``nopelab sweep``.

Run: ``.venv/bin/python benchmarks/bench_sweep.py`` (``--quick``: fewer steps). Everything is
measured in this one run on this machine:

* serial: the 8 cells one after another in this process, torch using every core (one
  many-thread cell at a time: what a shell loop over ``nopelab train`` does);
* sweep: the same 8 cells through the sweep engine on a local Ray cluster, with the default
  resources (one CPU and one torch thread per cell, so as many cells at once as cores), from
  ``ray.init`` to the last result file;
* overhead: a sweep of 8 one-step cells of the same model: its wall time is Ray's start-up plus
  the per-cell cost (task dispatch, worker start-up and imports, the cell's folder and results
  file, data generation), which the speed-up has to pay for.

The cells: copy task (lines up to 5 letters), 2 layers, 2 heads, d = 64, batch 16 x 64 tokens,
``--steps`` steps each, a crossed grid of 2 encodings x 2 learning rates x 2 seeds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from nopelab.sweep.cells import run_cell
from nopelab.sweep.engine import run_sweep
from nopelab.sweep.grid import parse_grid


def grid(steps: int) -> dict:
    return {
        "command": "train",
        "seeds": [0, 1],
        "base": {
            "task": {"name": "copy", "max_len": 5, "train_size": 2000, "test_size": 64},
            "model": {"n_layers": 2, "n_heads": 2, "d_model": 64},
            "train": {
                "steps": steps, "batch_size": 16, "seq_len": 64, "eval_every": steps,
                "checkpoint_every": steps, "eval_samples": 64, "device": "cpu",
            },
        },
        "axes": {"model.pos_encoding": ["none", "learned"], "train.lr": [1e-3, 3e-3]},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="150 steps per cell")
    args = parser.parse_args()
    steps = 150 if args.quick else args.steps
    spec = parse_grid(grid(steps))
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
        run_sweep(parse_grid(grid(1)), Path(tmp) / "overhead")
        overhead = time.perf_counter() - start

    n = len(cells)
    print(f"\n{n} cells of {steps} steps; serial with {threads} torch threads per cell\n")
    print("| run | wall (s) | per cell (s) |")
    print("|---|---|---|")
    print(f"| serial, one {threads}-thread cell at a time | {serial:.1f} | {serial / n:.2f} |")
    print(f"| nopelab sweep, 1-thread cells side by side | {swept:.1f} | {swept / n:.2f} |")
    print(
        f"| nopelab sweep of {n} one-step cells (overhead) | {overhead:.1f} | {overhead / n:.2f} |"
    )
    print(f"\nspeed-up of the sweep over the serial loop: {serial / swept:.2f}x")


if __name__ == "__main__":
    main()
