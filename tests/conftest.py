"""Shared test setup: the same global random state for every test; a tiny finished task run.
The helpers tests import live in ``helpers.py``."""

from __future__ import annotations

import os
import platform
import signal
import sys
from pathlib import Path

# The stored references (tests/references/) compare numbers across machines: the same CPU
# kernels everywhere on x86 (AVX2; an AVX-512 machine's rounding differs enough to move a trained
# smoke model's perplexity by 0.2 % and a break length by one). Set before torch is imported;
# the commands the tests start inherit it.
if platform.machine().lower() in ("x86_64", "amd64"):
    assert "torch" not in sys.modules, "torch was imported before the CPU kernels were chosen"
    for name, value in (
        ("ATEN_CPU_CAPABILITY", "avx2"),
        ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
        ("ONEDNN_MAX_CPU_ISA", "AVX2"),
    ):
        os.environ.setdefault(name, value)

# OpenMP threads that sleep while they wait, as `import nopelab` sets for every use: threads that
# spin make the suite many times slower beside other work (set before torch loads OpenMP).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np
import pytest
import torch

# A shell that starts the suite in the background makes it ignore SIGINT, and the commands the
# tests start would inherit that; the interrupt tests need SIGINT to reach them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Fix the global torch and numpy seeds (models are built from the global generator)."""
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-step training run of a tiny model on ``copy`` (one per test module)."""
    from nopelab.config import ModelConfig, TrainConfig
    from nopelab.training.run import TrainRun
    from nopelab.training.task_config import TaskConfig
    from nopelab.training.train import train

    run = TrainRun(
        model=ModelConfig(d_model=16, n_layers=2, n_heads=2, max_seq_len=32),
        train=TrainConfig(steps=2, batch_size=4, seq_len=24, eval_every=2, device="cpu"),
        task=TaskConfig(name="copy", max_len=5, train_size=100, test_size=10),
    )
    out = tmp_path_factory.mktemp("finished") / "run"
    train(run, out, progress=False)
    return out
