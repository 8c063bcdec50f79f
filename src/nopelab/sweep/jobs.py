"""The models of a reproduction as Ray tasks: each job writes ``OUT/runs/NAME``, finished jobs are
skipped when the reproduction is continued.

A reproduction part is a grid of models (initialisations, encodings, tasks); each model's work is
a :class:`Job`. :func:`run_jobs` runs the unfinished ones on a local Ray cluster, one CPU and one
torch thread each (on a CPU, small models train and analyse faster side by side than one after
another with every thread; the numbers do not depend on how many run at once; what they print
reaches this process's stderr), or, with one worker (a one-core machine, or a GPU), in this
process, one after another. A job is finished
when its folder holds :data:`DONE`, written after the job returned; an interrupted job runs
again (training jobs continue from their last checkpoint).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopelab.errors import RunFailed, UserError, first_line
from nopelab.runtime.progress import progress_bar, say
from nopelab.runtime.rundir import replace_atomically
from nopelab.sweep.cluster import start_ray, worker_threads

DONE = "job.json"  # in OUT/runs/NAME when the job has finished


@dataclass(frozen=True)
class Job:
    """``fn(*args, folder)`` writes the job's files into ``folder`` (``OUT/runs/NAME``); ``fn``
    is a module-level function, so that a Ray worker can import it."""

    name: str
    fn: Callable[..., None]
    args: tuple[Any, ...] = ()


def is_done(out: Path, name: str) -> bool:
    return (out / "runs" / name / DONE).is_file()


def run_job(job: Job, out: Path) -> str:
    """Run ``job`` into ``out/runs/NAME`` and mark it finished; return its name."""
    folder = out / "runs" / job.name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    job.fn(*job.args, folder)
    record = {"job": job.name, "seconds": round(time.perf_counter() - start, 3)}
    replace_atomically(folder / DONE, lambda tmp: tmp.write_text(json.dumps(record) + "\n"))
    return job.name


def default_workers(device: str) -> int:
    """How many jobs run at once: one single-thread job per core on a CPU, one on a GPU."""
    from nopelab.runtime.device import resolve_device

    return len(os.sched_getaffinity(0)) if resolve_device(device).type == "cpu" else 1


def _run_job_alone(job: Job, out: Path) -> str:
    worker_threads(1)
    return run_job(job, out)


def run_jobs(jobs: Sequence[Job], out: Path, title: str, workers: int) -> None:
    """Run every unfinished job of ``jobs`` into ``out``: ``workers`` at once as Ray tasks of one
    thread each (even a single job, so its numbers are a one-thread run's), or, with one worker,
    here, one after another. The first error or an interrupt stops the others; finished jobs
    stay finished."""
    todo = [job for job in jobs if not is_done(out, job.name)]
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names repeat: {names}")
    say(f"{title}: {len(jobs)} models, {len(jobs) - len(todo)} finished before, {len(todo)} to run")
    if workers > 1:  # even for one job left: its numbers are those of a one-thread run
        if todo:
            _on_ray(todo, out, title, len(jobs), workers)
        return
    with progress_bar(transient=False) as bar:
        shown = bar.add_task(title, total=len(jobs), completed=len(jobs) - len(todo))
        for job in todo:
            run_job(job, out)
            bar.advance(shown)
            if bar.disable:
                say(f"{title}: {job.name} done")


def _on_ray(todo: list[Job], out: Path, title: str, total: int, workers: int) -> None:
    start_ray(num_cpus=workers, worker_output=True)  # each model's progress lines
    import ray

    task = ray.remote(num_cpus=1, max_retries=0)(_run_job_alone)
    pending = {task.remote(job, out): job for job in todo}
    start, done = time.perf_counter(), total - len(todo)
    try:
        with progress_bar(transient=False) as bar:
            shown = bar.add_task(title, total=total, completed=done)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    job = pending.pop(ref)
                    ray.get(ref)  # a job's error is raised here
                    done += 1
                    bar.advance(shown)
                    if bar.disable:
                        say(
                            f"{title}: {job.name} done ({done}/{total}; "
                            f"{time.perf_counter() - start:.0f} s)"
                        )
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError | RunFailed | OSError):
            raise exc.cause from None  # one line, as if it had happened here
        raise  # a bug: the worker's traceback
    except ray.exceptions.RayError as exc:  # out of memory, a crashed worker
        reason = first_line(exc)
        raise RunFailed(f"{title}: a Ray task failed: {reason}") from None
    finally:
        ray.shutdown()  # stops the jobs still running (cancelling them races in Ray)
