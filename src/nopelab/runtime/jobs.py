"""The one way nopelab runs many pieces of work: a sweep's cells and a reproduction's models.

Each :class:`Job` writes into its own folder ``ROOT/KEY`` and is finished when that folder holds
:data:`DONE`, written after the job returned. Running the same jobs again skips the finished ones
and runs the others again (a training job continues from its last checkpoint).

:func:`run_jobs` runs the unfinished jobs side by side, each on its share of CPUs and torch
threads (on a CPU, small models train and analyse faster side by side than one after another
with every thread; the numbers do not depend on how many run at once): in a pool of worker
processes on this machine, or as Ray tasks where Ray is needed (a cluster at ``address``, or
jobs that take a share of a GPU); or, with one worker and no address, in this process, one after
another. On a cluster a job runs in a scratch folder of its node and its files come back to
``ROOT`` through Ray (:mod:`~nopelab.runtime.shipping`): no node needs the driver's disk. A
failing job stops the run (a reproduction), or, with ``keep_going``, is recorded in
``failed/KEY.txt`` beside ``ROOT`` while the others go on (a sweep).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from nopelab.errors import RunFailed, UserError, first_line, interrupted
from nopelab.runtime.cluster import start_ray, start_worker, worker_threads
from nopelab.runtime.progress import progress_bar, say
from nopelab.runtime.rundir import replace_atomically
from nopelab.runtime.shipping import land, pack, scratch

DONE = "done.json"  # in ROOT/KEY when the job has finished
STOP_WAIT = 10.0  # seconds stopped workers get to clean up (locks, temporary files) and exit


@dataclass(frozen=True)
class Job:
    """``fn(*args, folder)`` writes the job's files into ``folder`` (``ROOT/KEY``); ``fn`` is a
    module-level function, so that a worker process can import it. ``check(folder)``, where
    given, is called on the folder of a job finished before, which is not run again: it raises
    a ``UserError`` when that folder holds the work of other settings (a run resumed after its
    settings changed)."""

    key: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    check: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class Share:
    """What each job gets: CPUs and GPUs it reserves, torch threads it uses."""

    cpus: float = 1.0
    gpus: float = 0.0
    threads: int = 1


def is_done(root: Path, key: str) -> bool:
    return (root / key / DONE).is_file()


def default_workers(device: str) -> int:
    """How many jobs run at once: one single-thread job per core on a CPU, one on a GPU."""
    from nopelab.runtime.device import resolve_device

    return len(os.sched_getaffinity(0)) if resolve_device(device).type == "cpu" else 1


def run_job(job: Job, root: Path) -> None:
    """Run ``job`` into ``root/KEY`` and mark it finished."""
    folder = root / job.key
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    job.fn(*job.args, folder)
    record = {"job": job.key, "seconds": round(time.perf_counter() - start, 3)}
    replace_atomically(folder / DONE, lambda tmp: tmp.write_text(json.dumps(record) + "\n"))


def run_jobs(
    jobs: Sequence[Job],
    root: Path,
    title: str,
    workers: int | None,
    *,
    what: str = "jobs",
    address: str | None = None,
    share: Share = Share(),
    keep_going: bool = False,
) -> dict[str, int]:
    """Run every unfinished job of ``jobs`` into ``root`` (after checking the finished ones);
    return how many are ``done`` (now and before), ``failed`` and ``skipped`` (finished before).

    ``workers``: CPUs to use here, each job reserving ``share.cpus`` of them (even a single job
    left runs in a worker, so its numbers are those of a ``share.threads``-thread run);
    ``None``: every CPU (here, or of the cluster at ``address``); 1 without ``address``: in
    this process, one after another. Jobs run in worker processes started here, or as Ray
    tasks with an ``address`` or a share of a GPU. ``what`` names the jobs in progress lines
    (``models``, ``cells``).
    """
    keys = [job.key for job in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"job keys repeat: {keys}")
    todo = [job for job in jobs if not is_done(root, job.key)]
    for job in jobs:
        if job.check is not None and is_done(root, job.key):
            job.check(root / job.key)
    skipped = len(jobs) - len(todo)
    counts = {"done": skipped, "failed": 0, "skipped": skipped}
    say(f"{title}: {len(jobs)} {what}, {skipped} finished before, {len(todo)} to run")
    if not todo:
        return counts
    progress = _Progress(title, len(jobs), counts)
    if workers == 1 and address is None:
        with progress_bar(transient=False) as bar:
            progress.bar = bar
            shown = bar.add_task(title, total=len(jobs), completed=skipped)
            for job in todo:
                error = _run(job, root, None, keep_going)
                progress.finished(job.key, error)
                if error is None:
                    bar.advance(shown)
        return counts
    if address is None and share.gpus == 0:
        lanes = max(1, int((workers or len(os.sched_getaffinity(0))) // share.cpus))
        _on_processes(todo, root, min(lanes, len(todo)), share, keep_going, progress)
        return counts
    start_ray(address, num_cpus=workers, worker_output=not keep_going)
    try:
        _on_ray(todo, root, share, keep_going, progress, ship=address is not None)
    finally:
        import ray

        ray.shutdown()  # stops the jobs still running (cancelling them races in Ray)
    return counts


def _run(job: Job, root: Path, threads: int | None, keep_going: bool) -> str | None:
    """Run one job (in a Ray worker: on ``threads`` threads; a pool's workers set theirs when
    they start); with ``keep_going`` its error is recorded and returned rather than raised."""
    if threads is not None:
        worker_threads(threads)
    failed = root.parent / "failed" / f"{job.key}.txt"
    try:
        run_job(job, root)
    except Exception as exc:
        if not keep_going or interrupted(exc):  # an interrupt is no failure of the job
            raise
        return _record_failure(failed, first_line(exc))
    failed.unlink(missing_ok=True)
    return None


def _record_failure(path: Path, message: str) -> str:
    path.parent.mkdir(exist_ok=True)
    replace_atomically(path, lambda tmp: tmp.write_text(message + "\n"))
    return message


@dataclass
class _Progress:
    """Counts and a line per finished job where stderr is not a terminal."""

    title: str
    total: int
    counts: dict[str, int]
    bar: Any = None
    start: float = field(default_factory=time.perf_counter)

    def finished(self, key: str, error: str | None) -> None:
        self.counts["done" if error is None else "failed"] += 1
        if self.bar is None or self.bar.disable:
            what = "done" if error is None else f"failed: {error}"
            say(
                f"{self.title}: {key} {what} ({self.counts['done']}/{self.total} done, "
                f"{self.counts['failed']} failed; {time.perf_counter() - self.start:.0f} s)"
            )


def _on_processes(
    todo: list[Job], root: Path, lanes: int, share: Share, keep_going: bool, progress: _Progress
) -> None:
    """The jobs in a pool of ``lanes`` worker processes, each a fresh interpreter that imports
    only what its jobs need; stopping (an error, an interrupt) kills the jobs still running."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(
        lanes,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=start_worker,
        initargs=(share.threads, keep_going),
    )
    try:
        pending = {pool.submit(_in_worker, job, root, keep_going): job for job in todo}
        with progress_bar(transient=False) as bar:
            progress.bar = bar
            shown = bar.add_task(
                progress.title, total=progress.total, completed=progress.counts["done"]
            )
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    job = pending.pop(future)
                    try:
                        error = future.result()
                    except BrokenProcessPool:
                        raise RunFailed(
                            f"{progress.title}: a worker process died while running {job.key} "
                            "(out of memory?); run the same command again to continue"
                        ) from None
                    progress.finished(job.key, error)
                    if error is None:
                        bar.advance(shown)
    except BaseException:
        _stop(list((getattr(pool, "_processes", None) or {}).values()))  # no public list
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _in_worker(job: Job, root: Path, keep_going: bool) -> str | None:
    """:func:`_run` in a pool's worker process: SIGTERM (the pool stopping) interrupts the job,
    which cleans up as an interrupted command does (its lock, temporary files and unfinished
    folder), then ends the worker; an idle worker just ends."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return _run(job, root, None, keep_going)
    except BaseException as exc:
        if interrupted(exc):
            os._exit(130)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop(processes: list[Any]) -> None:
    """Stop a pool's worker processes: SIGTERM, so that their jobs clean up; SIGKILL for those
    still running after :data:`STOP_WAIT` seconds (or when this process is interrupted again)."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + STOP_WAIT
    try:
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            process.kill()


def _run_shipped(
    job: Job, root_name: str, threads: int, keep_going: bool
) -> tuple[str | None, bytes]:
    """:func:`_run` on a cluster node, in a scratch folder there: the job's error (``None``:
    done) and its files as an archive for :func:`~nopelab.runtime.shipping.land`. With
    ``keep_going``, a node that cannot hold the scratch folder or its archive fails the job."""
    try:
        with scratch() as folder:
            error = _run(job, folder / root_name, threads, keep_going)
            return error, b"" if error is not None else pack(folder)
    except OSError as exc:
        if not keep_going:
            raise
        return f"the node's scratch folder: {first_line(exc)}", b""


def _on_ray(
    todo: list[Job], root: Path, share: Share, keep_going: bool, progress: _Progress, ship: bool
) -> None:
    """The jobs as Ray tasks; with ``ship``, each in a scratch folder of its node, its files
    sent back here (a cluster), else writing into ``root`` (this machine's Ray)."""
    import ray

    fn: Callable[..., Any] = _run_shipped if ship else _run
    where: Any = root.name if ship else root  # the scratch folder's name on the node, or root
    task = ray.remote(num_cpus=share.cpus, num_gpus=share.gpus, max_retries=0)(fn)
    pending = {task.remote(job, where, share.threads, keep_going): job for job in todo}
    with progress_bar(transient=False) as bar:
        progress.bar = bar
        shown = bar.add_task(
            progress.title, total=progress.total, completed=progress.counts["done"]
        )
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                error = _outcome(ref, job, root, keep_going, progress.title)
                progress.finished(job.key, error)
                if error is None:
                    bar.advance(shown)


def _outcome(ref: Any, job: Job, root: Path, keep_going: bool, title: str) -> str | None:
    """A finished task's error (``None``: done), its shipped files laid out under ``root``. A
    job's own error is raised here as if it had happened here; a task Ray lost (out of memory,
    a crashed worker, a node that died) fails the run, or, with ``keep_going``, counts as a failed
    job."""
    import ray

    failed = root.parent / "failed" / f"{job.key}.txt"
    try:
        result = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError | RunFailed | OSError):
            raise exc.cause from None  # one line
        raise  # a bug: the worker's traceback
    except ray.exceptions.RayError as exc:
        reason = first_line(exc)
        if not keep_going:
            raise RunFailed(f"{title}: a Ray task failed: {reason}") from None
        return _record_failure(failed, f"Ray: {reason}")
    if not isinstance(result, tuple):  # the task wrote into root itself
        return cast(str | None, result)
    error, archive = result
    if error is None:
        try:
            land(archive, root, job.key)
        except RunFailed as exc:  # the node sent files that are not the job's
            if not keep_going:
                raise
            error = str(exc)
    if error is not None:
        return _record_failure(failed, error)
    failed.unlink(missing_ok=True)
    return None
