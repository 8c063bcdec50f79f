"""Run directories: nothing half-written, nothing destroyed, one writer at a time.

Every command writes its outputs into a hidden staging folder beside ``--out`` and moves it into
place only when the run succeeds, so an error or an interrupt (SIGINT or SIGTERM) never leaves a
half-written run; parent folders the run created are removed again when it fails. ``--out`` must
not be the current folder or hold it, and must not be, hold or lie inside a run the command
reads; its names and its length must fit the filesystem. ``--force`` replaces only a folder that
holds a nopelab run (it has the marker file :data:`RUN_MARKER`). While a command writes ``--out``
it holds an exclusive lock on it, so a second writer is refused; the lock file records the
holder's process id, and the lock of a holder that was killed is free: the next writer takes it
over and removes the file, and the staging folder the killed holder left. Files and folders get
the user's umask.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from nopelab import __version__
from nopelab.errors import UserError

RUN_MARKER = ".nopelab-run.json"  # in every folder nopelab writes: what --force may replace


def default_out(name: str) -> Path:
    """``runs/NAME-YYYYmmdd-HHMMSS``: a fresh folder for every run."""
    return Path("runs") / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"


BESIDE = len("..staging-") + 8  # bytes a hidden file or folder beside a path adds to its name
INSIDE = 256  # bytes kept under the filesystem's longest path for the files a run holds


def check_path(path: Path, flag: str = "--out") -> Path:
    """``path`` resolved, or a one-line error naming ``flag`` if the filesystem cannot hold it
    and the hidden files written beside and inside it: not valid UTF-8, a name longer than
    NAME_MAX bytes, or a path too long for PATH_MAX."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{flag}: the path is not valid UTF-8; choose another name") from None
    target = Path(os.path.abspath(path.expanduser()))
    name_max, path_max = os.pathconf("/", "PC_NAME_MAX"), os.pathconf("/", "PC_PATH_MAX")
    names = [(part, name_max) for part in target.parts[:-1]] + [(target.name, name_max - BESIDE)]
    for name, longest in names:
        if len(os.fsencode(name)) > longest:
            raise UserError(
                f"{flag}: the name {name[:16]}… is {len(os.fsencode(name))} bytes long; at "
                f"most {longest} are allowed: choose a shorter name"
            )
    longest = path_max - BESIDE - INSIDE
    if len(os.fsencode(str(target))) > longest:
        raise UserError(
            f"{flag}: the path is {len(os.fsencode(str(target)))} bytes long; at most {longest} "
            "are allowed: choose a shorter path"
        )
    return target.resolve()


def check_out(out: Path, force: bool, inputs: Sequence[Path] = ()) -> None:
    """Fail early, before any work, if ``out`` cannot take a new run.

    ``inputs`` are the runs the command reads: ``out`` may not be one of them, lie inside one or
    hold one.
    """
    target = check_path(out)
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        where = "is" if target == here else "holds"
        raise UserError(f"--out: {str(out)!r} {where} the current folder; choose a new folder")
    for given in inputs:
        source = given.expanduser().resolve()
        if target == source or source in target.parents or target in source.parents:
            raise UserError(
                f"--out: {out} overlaps the input run {given}; a run's outputs go to a new folder"
            )
    if target.exists():
        if not target.is_dir():
            raise UserError(f"--out: {out} exists and is not a directory")
        if any(target.iterdir()):
            if not force:
                raise UserError(f"--out: {out} is not empty; choose another folder or pass --force")
            if not (target / RUN_MARKER).is_file():
                raise UserError(
                    f"--out: {out} does not hold a nopelab run (no {RUN_MARKER}); --force "
                    "replaces only nopelab runs: choose another folder"
                )
    parent = _existing_ancestor(target.parent)
    if not os.access(parent, os.W_OK | os.X_OK) or not _is_regular_filesystem(parent):
        raise UserError(f"--out: {parent} is not writable")


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    if not path.is_dir():
        raise UserError(f"--out: {path} is not a directory")
    return path


def _is_regular_filesystem(path: Path) -> bool:
    """False under /proc, /sys and /dev: pseudo-filesystems that reject ordinary folders."""
    return not any(path == Path(p) or Path(p) in path.parents for p in ("/proc", "/sys", "/dev"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask(path: Path) -> None:
    """Give ``path`` the permissions a plain ``open``/``mkdir`` would have (temporary files and
    folders are created private)."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it over ``path``, so a
    reader never sees half a file; the temporary file is removed if writing fails."""
    with replaced_together([path]) as (tmp,):
        write(tmp)


@contextmanager
def replaced_together(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Yield a temporary file beside each of ``paths`` to write; when the block succeeds they
    are moved over ``paths`` in order, otherwise (an error, a full disk, an interrupt) removed,
    so the files ``paths`` held before stay as they were.

    The last path commits the set: until it is moved, the version each earlier file had before
    stays reachable as :func:`previous_version` (a hard link), so a reader that finds the last
    file older than the others (an interrupt between the moves) can still find the files that
    belong with it. Those links are removed once the set on disk is whole again: all moved, or
    none."""
    tmps: list[Path] = []
    kept: list[Path] = []
    try:
        for path in paths:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            tmps.append(Path(name))
        yield tmps
        for path in paths[:-1]:
            if path.is_file():
                kept.append(previous_version(path))
                _keep_version(path)
        for tmp, path in zip(tmps, paths, strict=True):
            apply_umask(tmp)
            os.replace(tmp, path)
    finally:
        waiting = [tmp.exists() for tmp in tmps]  # a moved file's temporary name is gone
        if all(waiting) or not any(waiting):
            for link in kept:
                link.unlink(missing_ok=True)
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def previous_version(path: Path) -> Path:
    """Where :func:`replaced_together` keeps ``path``'s version before an unfinished move."""
    return path.with_name(f".{path.name}.previous")


def _keep_version(path: Path) -> None:
    """Link ``path``'s current version to :func:`previous_version` (a copy where the
    filesystem has no hard links), replacing an older one."""
    link = previous_version(path)
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except OSError:
        shutil.copy2(path, link)


_held: set[Path] = set()  # the lock files this process holds (a lock is re-entrant)


@contextmanager
def locked(out: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` (a lock file beside it, holding this process's id) or
    refuse in one line, after waiting up to ``wait`` seconds for another holder to finish.

    The kernel frees a lock when its holder exits, also when it is killed: the lock file it
    leaves is taken over here and removed on release. Missing parents of ``out`` are created for
    the lock file, and removed again if they are still empty when the lock is released."""
    target = out.expanduser().resolve()
    lock = target.parent / f".{target.name}.lock"
    if lock in _held:
        yield
        return
    created = _make_parents(target.parent)
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        except OSError as exc:
            remove_empty(created)
            raise UserError(f"--out: cannot create {lock}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 20, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            remove_empty(created)
            raise UserError(
                f"--out: another nopelab process is writing {out} (process {holder}); "
                "wait for it or choose another folder"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we took it: lock the new one
    _held.add(lock)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        _held.discard(lock)
        lock.unlink(missing_ok=True)
        os.close(fd)
        remove_empty(created)


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the ones created, deepest first."""
    created = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {folder}: {exc.strerror}") from None
    return created


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def write_marker(folder: Path, command: str) -> None:
    write_json(
        folder / RUN_MARKER,
        {"command": command, "nopelab": __version__, "created": datetime.now().isoformat()},
    )


@contextmanager
def staged_run(
    out: Path, force: bool, inputs: Sequence[Path] = (), command: str = ""
) -> Iterator[Path]:
    """Yield a staging folder; on success it becomes ``out``, on any error it is removed."""
    check_out(out, force, inputs)
    out = out.expanduser().resolve()
    created = _make_parents(out.parent)
    try:
        with locked(out):
            check_out(out, force, inputs)  # again: another writer may have finished meanwhile
            remove_stale_staging(out)
            staging, mine = unused_name(out.parent, f".{out.name}.staging-"), True
            try:
                # made inside the clean-up's reach: an interrupt that lands as mkdir returns
                # (a signal sent as soon as the folder shows) still removes it
                try:
                    staging.mkdir(mode=0o700)
                except OSError as exc:  # also a folder of that name made since: not ours
                    mine = False
                    raise UserError(
                        f"--out: cannot write in {out.parent}: {exc.strerror}"
                    ) from None
                write_marker(staging, command)
                yield staging
                apply_umask(staging)
                if out.exists():
                    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                    out.rename(old / "run")
                    staging.rename(out)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    staging.rename(out)
            except BaseException:
                if mine:
                    shutil.rmtree(staging, ignore_errors=True)
                raise
    except BaseException:
        remove_empty(created)
        raise


def unused_name(folder: Path, prefix: str) -> Path:
    """``folder / (prefix + 8 random hex digits)`` that does not exist yet."""
    while (path := folder / f"{prefix}{secrets.token_hex(4)}").exists():
        pass
    return path


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders of ``out`` that killed commands left (e.g. by SIGKILL): the
    caller holds ``out``'s lock, which their writers held, so those are gone. Only folders named
    (:func:`unused_name`'s 8 characters) and marked as nopelab makes them, or left empty (killed
    before the marker), are removed."""
    prefix = f".{out.name}.staging-"
    for folder in out.parent.glob(glob.escape(prefix) + "*"):
        if not re.fullmatch(r"[a-z0-9_]{8}", folder.name[len(prefix) :]) or not folder.is_dir():
            continue
        if (folder / RUN_MARKER).is_file() or not any(folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


MARKER = "reproduction.json"  # what a resumable run folder holds while it is being written


def check_resume(resume: bool, force: bool, out: Path | None) -> None:
    """``--resume`` continues the run in ``--out``: it needs ``--out`` and excludes ``--force``."""
    if resume and force:
        raise UserError("--resume and --force exclude each other")
    if resume and out is None:
        raise UserError("--resume: give the run folder with --out")


@contextmanager
def resumable_run(
    out: Path, marker: dict[str, Any], resume: bool, force: bool, inputs: Sequence[Path] = ()
) -> Iterator[Path]:
    """Yield ``out`` itself as the folder to write into, for work that can be continued.

    A new run starts from an empty (or, with ``force``, replaced) folder and records ``marker``
    (what was asked for) in it; ``resume`` continues a folder whose marker matches and that has
    no ``summary.md`` yet (the last file a run writes). On an error or an interrupt everything
    written so far stays, for ``resume``.
    """
    out = out.expanduser().resolve()
    with locked(out):
        if resume:
            _check_resumable(out, marker)
        else:
            with staged_run(out, force, inputs, command="reproduce") as staging:
                write_json(staging / MARKER, marker)
        yield out


def _check_resumable(out: Path, marker: dict[str, Any]) -> None:
    path = out / MARKER
    if not path.is_file():
        raise UserError(f"--resume: {out} holds no resumable run (no {MARKER})")
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise UserError(f"--resume: {path} is not valid JSON") from None
    marker = json.loads(json.dumps(marker))  # as stored: tuples become lists
    if stored != marker:
        key = next(k for k in sorted(set(stored) | set(marker)) if stored.get(k) != marker.get(k))
        now = f"is {marker[key]!r}" if key in marker else "is the scale's own"
        then = f"with {stored[key]!r}" if key in stored else "with the scale's own"
        raise UserError(f"--resume: {key} {now} but the run was started {then}")
    if (out / "summary.md").is_file():
        raise UserError(f"--resume: the run in {out} has already finished")


def environment() -> dict[str, str]:
    """The versions a run was made with, recorded in its ``config.json``."""
    import platform

    import torch

    return {"nopelab": __version__, "torch": torch.__version__, "python": platform.python_version()}


def write_json(path: Path, data: Any) -> None:
    """Write strict JSON: NaN and infinities (e.g. a speed with no time measured) become null."""
    path.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int)):
        return value
    if hasattr(value, "tolist"):  # numpy and torch scalars and arrays
        return _jsonable(value.tolist())
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
