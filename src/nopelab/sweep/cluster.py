"""Start (or join) the Ray cluster that sweeps and reproductions run their tasks on."""

from __future__ import annotations

import os
import signal


def start_ray(
    address: str | None = None, num_cpus: int | None = None, worker_output: bool = False
) -> None:
    """``ray.init`` for nopelab's tasks: a private local cluster (of ``num_cpus`` CPUs, default
    all) unless ``address`` is given. With ``worker_output``, what the tasks print reaches this
    process's streams as it is printed (their progress lines name their run, so without Ray's
    ``(task pid=...)`` prefix when Ray is first imported here)."""
    os.environ.setdefault("RAY_DISABLE_WORKER_LOG_PREFIX", "1")  # both read when ray is imported
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every line as printed
    import ray

    on_sigterm = signal.getsignal(signal.SIGTERM)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, private cluster
    os.environ.setdefault("RAY_worker_niceness", "0")  # tasks run at the priority a serial run has
    ray.init(
        address=address or "local",  # not a cluster that RAY_ADDRESS or `ray start` named
        num_cpus=num_cpus if address is None else None,
        include_dashboard=False,
        log_to_driver=worker_output,
        configure_logging=False,
    )
    if on_sigterm is not None:  # Ray's driver aborts on SIGTERM; nopelab stops cleanly (exit 130)
        signal.signal(signal.SIGTERM, on_sigterm)


def worker_threads(threads: int) -> None:
    """Torch and numba on ``threads`` threads in a task's worker, memory kept as the CLI does."""
    import numba
    import torch

    from nopelab.runtime.allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
