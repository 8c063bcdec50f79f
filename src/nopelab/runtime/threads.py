"""How many CPU threads a training computes with.

A second thread pays only when each operation has enough elements to split: below PyTorch's
grain size (``at::internal::GRAIN_SIZE``, 32 768 elements) its element-wise kernels run on one
thread anyway, and what is left of a second one is the waiting between operations, which on a
CPU shared with other processes costs more than it gains (docs/performance.md, "On a shared
machine"). The choice depends on the run's settings alone, never on the load, so a seed gives
the same numbers on the same machine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

GRAIN = 32_768  # PyTorch's grain size, in elements


def training_threads(tokens_per_step: int, width: int) -> int | None:
    """Threads for a CPU training whose steps hold ``tokens_per_step`` × ``width`` activations:
    one below :data:`GRAIN` elements, else None (PyTorch's own choice); None too when the user
    chose with ``OMP_NUM_THREADS``."""
    if "OMP_NUM_THREADS" in os.environ or tokens_per_step * width >= GRAIN:
        return None
    return 1


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Compute on ``threads`` threads inside the block (None: as they are), then as before."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
