"""Stopping a command in the middle of a write: :func:`stuck_at` gives it a hook that hangs
every process of it as it moves a file of a given name into place, its temporary file written."""

from __future__ import annotations

import os
from pathlib import Path

HOOK = """
import fnmatch, os, time

_replace = os.replace


def _stuck(src, dst, *args, **kwargs):
    if fnmatch.fnmatch(os.path.basename(os.fspath(dst)), os.environ["NOPELAB_TEST_STUCK_AT"]):
        time.sleep(600)
    _replace(src, dst, *args, **kwargs)


os.replace = _stuck
"""


def stuck_at(pattern: str, folder: Path) -> dict[str, str]:
    """The environment of a command whose processes (workers included) hang before they move a
    file named like ``pattern`` (``*.parquet``) into place: a ``sitecustomize`` in ``folder``."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "NOPELAB_TEST_STUCK_AT": pattern}
