"""Where a result came from: the command, the code, the machine and the wall time.

A reproduction writes :func:`record` into its ``run.json``, so that a number quoted from it can
name its command, commit, CPU, load and wall time (``docs/results/`` keeps such records)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nopelab.runtime.rundir import environment


def commit() -> str | None:
    """The git commit of the nopelab source in use (an editable install of a clone), with
    ``-dirty`` when it has uncommitted changes; ``None`` when this file is not tracked by a git
    checkout (an installed package, even one inside another repository)."""
    here = Path(__file__).resolve()
    source = here.parent
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", here.name],
            cwd=source, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10
        )
        if tracked.returncode != 0 or head.returncode != 0:
            return None
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The CPU, the cores this process may use and the load average (1 minute) right now."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name(), "cores": cores, "load_1min": load}


def peak_memory_gb() -> float | None:
    """The largest resident memory of this process or of any of its finished children (the
    jobs' worker processes), in GB; ``None`` where the platform does not say."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    kilobytes = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    scale = 1e-9 if sys.platform == "darwin" else 1e-6  # macOS counts bytes, Linux kB
    return round(kilobytes * scale, 2)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def start() -> dict[str, Any]:
    """What is known when a run starts: the time, the commit of the code it loaded, the load."""
    return {"started": now(), "commit": commit(), "load_at_start": machine()["load_1min"]}


def record(command: str, begun: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``run.json``: the command, the code (version, commit, libraries), the machine, when the
    run started (``begun``: :func:`start`'s), its wall time in seconds, its peak memory and the
    load average at its start and end."""
    here = machine()
    return {
        "command": command,
        "started": begun["started"],
        "seconds": round(seconds, 1),
        "peak_memory_gb": peak_memory_gb(),
        "commit": begun["commit"],
        **environment(),
        "cpu": here["cpu"],
        "cores": here["cores"],
        "load_at_start": begun["load_at_start"],
        "load_at_end": here["load_1min"],
    }
