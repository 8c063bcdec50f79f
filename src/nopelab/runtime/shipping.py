"""A job's files carried from the cluster node that ran it to the driver's run folder.

On a Ray cluster (``--address``) a job runs in a scratch folder of the node it lands on, and its
files come back through Ray's object store as one tar archive; the driver lays them out under
its own ``--out``. No node needs to see the driver's disk, and the driver's folder is written by
the driver alone, so a node that dies mid-job leaves nothing there.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

SKIPPED = ("failed",)  # the driver records failures itself


def pack(scratch: Path) -> bytes:
    """Every file under ``scratch`` (but those of :data:`SKIPPED` folders), as a tar archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(scratch.iterdir()):
            if path.name not in SKIPPED:
                tar.add(path, arcname=path.name)
    return buffer.getvalue()


def land(archive: bytes, root: Path, key: str) -> None:
    """Lay out a job's archive (paths relative to ``root``'s parent) under ``root.parent``:
    the files outside the job's folder ``root/key`` first, each replaced whole, then that folder
    in one rename (it holds the job's finished mark), so that the job counts as finished only once
    all its files are here. What an earlier try left in ``root/key`` is replaced."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.staging-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, links or ".."
        own = staging / root.name / key
        for path in sorted(staging.rglob("*")):
            if path.is_file() and not path.is_relative_to(own):
                target = root.parent / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        folder = root / key
        if folder.exists():
            shutil.rmtree(folder)
        own.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
