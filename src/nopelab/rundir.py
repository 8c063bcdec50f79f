"""Run directories that appear whole or not at all.

Outputs are written into a hidden staging folder beside the target and moved into place
only when the run succeeds, so an error or an interrupt never leaves a half-written run, and
an existing run is replaced only with ``--force``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from nopelab.errors import UserError


def default_out(name: str) -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS``: a fresh folder for every run."""
    return Path("runs") / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"


def check_out(out: Path, force: bool) -> None:
    """Fail early, before any work, if ``out`` cannot take a new run."""
    if out.exists():
        if not out.is_dir():
            raise UserError(f"--out: {out} exists and is not a directory")
        if any(out.iterdir()) and not force:
            raise UserError(f"--out: {out} is not empty; choose another folder or pass --force")
    parent = _existing_ancestor(out.absolute().parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out: {parent} is not writable")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    if not path.is_dir():
        raise UserError(f"--out: {path} is not a directory")
    return path


@contextmanager
def staged_run(out: Path, force: bool) -> Iterator[Path]:
    """Yield a staging folder; on success it becomes ``out``, on any error it is removed."""
    check_out(out, force)
    out = out.absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out.parent}: {exc.strerror}") from None
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(old / "run")
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)


MARKER = "reproduction.json"  # what a resumable run folder holds while it is being written


@contextmanager
def resumable_run(out: Path, marker: dict[str, Any], resume: bool, force: bool) -> Iterator[Path]:
    """Yield ``out`` itself as the folder to write into, for work that can be continued.

    A new run starts from an empty (or, with ``force``, replaced) folder and records ``marker``
    (what was asked for) in it; ``resume`` continues a folder whose marker matches and that has
    no ``summary.md`` yet (the last file a run writes). On an error or an interrupt everything
    written so far stays, for ``resume``.
    """
    out = out.absolute()
    if resume:
        path = out / MARKER
        if not path.is_file():
            raise UserError(f"--resume: {out} holds no resumable run (no {MARKER})")
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            raise UserError(f"--resume: {path} is not valid JSON") from None
        if stored != marker:
            key = next(
                k for k in sorted(set(stored) | set(marker)) if stored.get(k) != marker.get(k)
            )
            raise UserError(
                f"--resume: {key} is {marker.get(key)!r} but the run was started with "
                f"{stored.get(key)!r}"
            )
        if (out / "summary.md").is_file():
            raise UserError(f"--resume: the run in {out} has already finished")
    else:
        with staged_run(out, force) as staging:
            write_json(staging / MARKER, marker)
    yield out


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
