"""The device to run on, and progress on stderr."""

from __future__ import annotations

import sys

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from nopelab.config import check_device
from nopelab.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; an unknown or unavailable device is a user error."""
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


def say(line: str) -> None:
    """One progress line on stderr, where no progress bar is shown (stderr is not a terminal)."""
    print(line, file=sys.stderr, flush=True)


def progress_bar(transient: bool = True) -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=not console.is_terminal,
    )
