"""The device to run on: ``auto``, ``cpu``, ``cuda[:N]`` or ``mps``, checked before any work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nopelab.config import check_device
from nopelab.errors import ConfigError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; an unknown or unavailable device is a user error."""
    import torch

    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "device", f"{name!r} requested but CUDA is not available; use cpu or auto"
        )
    if name.startswith("mps") and not torch.backends.mps.is_available():
        raise ConfigError("device", f"{name!r} requested but MPS is not available; use cpu or auto")
    return torch.device(name)
