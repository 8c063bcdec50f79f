"""Where jobs run besides this process: worker processes started here, or a Ray cluster."""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import sys
import time
from pathlib import Path

from nopelab.errors import UserError, first_line
from nopelab.extras import need


def start_ray(
    address: str | None = None, num_cpus: int | None = None, worker_output: bool = False
) -> None:
    """``ray.init`` for nopelab's tasks: a private local cluster (of ``num_cpus`` CPUs, default
    all) unless ``address`` is given. With ``worker_output``, what the tasks print reaches this
    process's streams as it is printed (their progress lines name their run, so without Ray's
    ``(task pid=...)`` prefix when Ray is first imported here)."""
    os.environ.setdefault("RAY_DISABLE_WORKER_LOG_PREFIX", "1")  # both read when ray is imported
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every line as printed
    ray = need("ray", "running jobs on a Ray cluster (--address) or on a GPU")
    if address is not None and ray.is_initialized() and _connected == address:
        return  # connect_ray's connection (a sweep connects before making its folder)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, private cluster
    os.environ.setdefault("RAY_worker_niceness", "0")  # tasks run at the priority a serial run has
    try:
        ray.init(
            address=address or "local",  # not a cluster that RAY_ADDRESS or `ray start` named
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            log_to_driver=worker_output,
            configure_logging=False,
        )
    finally:  # Ray's driver aborts on SIGTERM, even after a failed init; nopelab stops cleanly
        if on_sigterm is not None:  # (exit 130)
            signal.signal(signal.SIGTERM, on_sigterm)


_connected: str | None = None  # the cluster connect_ray connected this process to


def connect_ray(address: str) -> None:
    """Connect to the Ray cluster at ``address`` (``--address``) for a sweep's tasks, or refuse
    in one line; what Ray prints while it tries (warnings of every retry) is dropped."""
    need("ray", "--address (a Ray cluster)")
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # Ray's C++ core writes to the file descriptor, not to sys.stderr
    global _connected
    try:
        _start_client(address)
        _connected = address
    except Exception as exc:  # ConnectionError, or whatever else Ray raises for a bad cluster
        raise UserError(
            f"--address: cannot connect to a Ray cluster at {address}: {_reason(exc)}"
        ) from None
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    try:
        check_nodes(address)
    except BaseException:  # a refused node, or Ctrl-C while the nodes answer
        import ray

        ray.shutdown()
        _connected = None
        raise


CLIENT_ATTEMPTS = 3  # a Ray Client head can fail to start a client's own server now and then
# What a Ray Client head answers when the server it starts for this client died or never answered
# (seen on loaded machines); its other refusals (a bad runtime_env, ...) would only come again.
SERVER_START_FAILED = ("Starting Ray client server failed", "Proxy failed to Connect")


def _start_client(address: str, pause: float = 2.0) -> None:
    """:func:`start_ray` at ``address``; a Ray Client address whose head answers that the server
    it started for this client failed is asked again, :data:`CLIENT_ATTEMPTS` times in all."""
    for attempt in range(1, CLIENT_ATTEMPTS + 1):
        try:
            start_ray(address)
            return
        except ConnectionAbortedError as exc:
            transient = any(reason in str(exc) for reason in SERVER_START_FAILED)
            if not (address.startswith("ray://") and transient) or attempt == CLIENT_ATTEMPTS:
                raise
            time.sleep(pause)


def _reason(exc: BaseException) -> str:
    """Why Ray could not connect, in one line: a message that opens with a heading (``...:``)
    and carries the server's traceback below it (Ray Client) ends with the error itself.

    >>> _reason(ConnectionAbortedError("Initialization failure from server:\\nTraceback (most"
    ...     " recent call last):\\n  File x, line 1\\nRuntimeError: Server startup failed.\\n"))
    'Initialization failure from server: RuntimeError: Server startup failed.'
    >>> _reason(ConnectionError("refused\\nretrying"))
    'refused'
    """
    head, *rest = str(exc).strip().splitlines() or [""]
    tail = [line.strip() for line in rest if line.strip()]
    return f"{head} {tail[-1]}" if head.endswith(":") and tail else first_line(exc)


def check_nodes(address: str, timeout: float = 300.0) -> None:
    """Refuse a cluster where a live node cannot import nopelab or runs another nopelab than
    this driver, by version or by code (:func:`code_digest`: two checkouts of one version at
    different commits differ); one line naming the node. Every node runs a CPU-free task to
    tell."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from nopelab import __version__

    probe = ray.remote(num_cpus=0, max_retries=0)(node_version)
    asked = {
        f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})": probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        for node in ray.nodes()
        if node["Alive"]
    }
    here = code_digest()
    for node, ref in asked.items():
        try:
            version, code = ray.get(ref, timeout=timeout)
        except Exception as exc:  # the task's import failed, or the node did not answer
            raise UserError(
                f"--address: node {node} of {address} cannot run nopelab: {first_line(exc)}"
            ) from None
        if version != __version__:
            raise UserError(
                f"--address: node {node} of {address} runs nopelab {version}, this machine "
                f"{__version__}: install the same version on every node"
            )
        if code != here:
            raise UserError(
                f"--address: node {node} of {address} runs other nopelab {version} code than "
                f"this machine (files {code}, here {here}): install the same nopelab on every node"
            )


def node_version() -> tuple[str, str]:
    """The nopelab version of the node this runs on, and its :func:`code_digest`."""
    from nopelab import __version__

    return __version__, code_digest()


def code_digest() -> str:
    """A digest of the nopelab package's files as installed here (modules and data files, not
    compiled caches)."""
    root = Path(__file__).resolve().parents[1]  # the nopelab package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def start_worker(threads: int, quiet: bool) -> None:
    """Set up a worker process of :func:`~nopelab.runtime.jobs.run_jobs`'s pool: ``threads``
    threads, its output dropped when ``quiet``, Ctrl-C left to the process that started it
    (which stops the workers), and no life beyond that process's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":  # killed with its parent, however the parent ends
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    worker_threads(threads)
    # The worker's results are sent by the time the interpreter exits; tearing it down (torch's
    # and numba's thread pools, every module) takes seconds that nobody waits for.
    atexit.register(os._exit, 0)


def worker_threads(threads: int) -> None:
    """Torch and numba on ``threads`` threads in a job's worker, memory kept as the CLI does."""
    import torch

    from nopelab.runtime.allocator import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(threads)
    if "numba" in sys.modules:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    else:  # read when numba is imported, if a job needs it
        os.environ["NUMBA_NUM_THREADS"] = str(threads)
