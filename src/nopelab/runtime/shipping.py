"""A job's files carried from the cluster node that ran it to the driver's run folder.

On a Ray cluster (``--address``) a job runs in a scratch folder of the node it lands on, and its
files come back through Ray's object store as one tar archive; the driver lays them out under
its own ``--out``. No node needs to see the driver's disk, and the driver's folder is written by
the driver alone, so a node that dies mid-job leaves nothing there. The archive is held in
memory once on the node and once on the driver (besides Ray's object store).
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nopelab.errors import RunFailed

PREFIX = "nopelab-job-"  # scratch folders: PREFIX + the pid of the process using it + "-" + ...
ARCHIVE = ".archive.tar"  # written in the scratch folder, not part of itself
SKIPPED = ("failed", ARCHIVE)  # the driver records failures itself


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh scratch folder in this node's temporary folder, removed afterwards; those that
    jobs killed on this node left (their process gone) are removed first."""
    where = Path(tempfile.gettempdir())
    for folder in where.glob(f"{PREFIX}*"):
        pid = folder.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=where))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def pack(folder: Path) -> bytes:
    """Every file under ``folder`` (but those of :data:`SKIPPED`), as a tar archive (built on
    disk, read once)."""
    archive = folder / ARCHIVE
    with tarfile.open(archive, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            if path.name not in SKIPPED:
                tar.add(path, arcname=path.name)
    return archive.read_bytes()


def land(archive: bytes, root: Path, key: str) -> None:
    """Lay out a job's archive (paths relative to ``root``'s parent) under ``root.parent``:
    the files outside the job's folder ``root/key`` first (each named after the job, e.g.
    ``results/KEY.parquet``, and replaced whole), then that folder in one rename (it holds the
    job's finished mark), so that the job counts as finished only once all its files are here.
    What an earlier try left in ``root/key`` is replaced; anything else is refused."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.staging-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, links or ".."
        own = staging / root.name / key
        outside = [p for p in staging.rglob("*") if p.is_file() and not p.is_relative_to(own)]
        if stray := [p for p in outside if not p.name.startswith(key)]:
            raise RunFailed(
                f"{key}: the node sent {stray[0].relative_to(staging)}, outside the job's "
                "folder and not named after the job"
            )
        for path in sorted(outside):
            target = root.parent / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        folder = root / key
        if folder.exists():
            shutil.rmtree(folder)
        own.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
