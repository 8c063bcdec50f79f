"""Shared test setup: the same global random state for every test; the command-line runner."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from nopelab.cli import main


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Fix the global torch and numpy seeds (models are built from the global generator)."""
    torch.manual_seed(0)
    np.random.seed(0)


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Run ``nopelab ARGS`` in this process; returns the exit status."""
    monkeypatch.setattr(sys, "argv", ["nopelab", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
