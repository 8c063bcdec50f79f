"""Shared test setup: every test starts from the same global random state."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Fix the global torch and numpy seeds (models are built from the global generator)."""
    torch.manual_seed(0)
    np.random.seed(0)
