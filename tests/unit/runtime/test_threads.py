"""Threads that never spin on a shared CPU: the wait policy every use of nopelab gets, and the
one-thread rule for training steps too small to split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nopelab.config import ModelConfig, TrainConfig
from nopelab.runtime.threads import GRAIN, torch_threads, training_threads
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig
from nopelab.training.train import train


def policy_after_import(env: dict[str, str]) -> str:
    code = "import os, nopelab, torch; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip()


def test_importing_nopelab_makes_openmp_threads_sleep_unless_the_user_chose() -> None:
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert policy_after_import(base) == "passive"
    assert policy_after_import({**base, "OMP_WAIT_POLICY": "active"}) == "active"


def test_one_thread_below_the_grain_size_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert training_threads(8 * 32, 32) == 1  # 8 192 activations
    assert training_threads(GRAIN // 64 - 1, 64) == 1
    assert training_threads(GRAIN // 64, 64) is None  # exactly the grain size: PyTorch's choice
    assert training_threads(32 * 128, 80) is None  # the reproductions' byte LM
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert training_threads(8 * 32, 32) is None


def test_torch_threads_restores_the_count_it_found() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


@pytest.mark.parametrize(("batch", "d_model"), [(2, 16), (64, 64)])
def test_training_records_the_threads_it_computed_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int, d_model: int
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    run = TrainRun(
        model=ModelConfig(d_model=d_model, n_layers=1, n_heads=2, max_seq_len=16),
        train=TrainConfig(steps=2, batch_size=batch, seq_len=16, eval_every=2, device="cpu"),
        task=TaskConfig(name="copy", max_len=4, train_size=100, test_size=10),
    )
    with torch_threads(2):  # on a one-core machine too: the small run must go down to one
        train(run, tmp_path / "run", progress=False, figures=False)
        assert torch.get_num_threads() == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["threads"] == (1 if batch * 16 * d_model < GRAIN else 2)
