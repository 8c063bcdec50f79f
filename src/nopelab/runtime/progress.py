"""Progress on stderr: a rich bar on a terminal, a line per stage (and per tenth of a long
stage) elsewhere, each ending with the seconds since the command started."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress


def say(line: str) -> None:
    """One progress line on stderr, where no progress bar is shown (stderr is not a terminal)."""
    print(line, file=sys.stderr, flush=True)


def _process_start() -> float:
    """When this process started, on the ``time.monotonic`` clock (from ``/proc`` on Linux;
    elsewhere when this module was imported)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        age = 0.0
    return time.monotonic() - max(age, 0.0)


_STARTED = _process_start()


def elapsed() -> float:
    """Seconds since the process (the command) started."""
    return time.monotonic() - _STARTED


def stage(line: str) -> None:
    """A progress line (a stage starts, a tenth of it is done) ending with the seconds since the
    command started."""
    say(f"{line} ({elapsed():.0f} s)")


def progress_bar(transient: bool = True) -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

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


@contextmanager
def progress(
    line: str, total: int, visible: bool = True, label: str | None = None
) -> Iterator[Callable[[int], None]]:
    """A long stage of ``total`` units, advanced by the function it yields (units done).

    On a terminal, a rich bar labelled ``label`` (default ``line``). Elsewhere (a log file, a
    pipe), when ``visible``: ``line`` as :func:`stage` prints it, then ``line: N %`` with the
    time since the command started at every tenth of the stage (at most one a second) and at
    its end.
    """
    with progress_bar() as bar:
        task = bar.add_task(label or line, total=total, visible=visible)
        lines = visible and bar.disable
        if lines:
            stage(line)
        done, shown, last = 0, 0, time.monotonic()

        def advance(units: int) -> None:
            nonlocal done, shown, last
            bar.advance(task, units)
            done += units
            tenth = 10 * done // max(total, 1)
            if not lines or tenth <= shown:
                return
            if done >= total or time.monotonic() - last >= 1.0:
                shown, last = tenth, time.monotonic()
                stage(f"{line}: {100 * done // max(total, 1)} %")

        yield advance
