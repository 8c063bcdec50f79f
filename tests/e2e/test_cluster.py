"""`nopelab sweep --address` on a Ray cluster of several nodes built on this machine: a head that
runs no cells and worker nodes whose working and temporary folders are not the driver's; the
cells' folders travel back to the driver, a node killed mid-sweep costs only its cells, Ray
Client addresses work, and a node with another nopelab is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nopelab.sweep.engine import read_results

pytest.importorskip("ray")
from ray.cluster_utils import Cluster

pytestmark = pytest.mark.slow

GRID = """command = "train"
seeds = [0, 1]
[base]
task = {{ name = "copy", max_len = 3, train_size = 200, test_size = 16 }}
model = {{ n_layers = 1, n_heads = 2, d_model = 32 }}
train = {{ steps = {steps}, batch_size = 8, seq_len = 32, eval_every = {steps}, eval_samples = 16, device = "cpu" }}
[axes]
"model.pos_encoding" = {encodings}
"""
# How soon the head declares a node dead that stopped answering: ~5 s, not Ray's ~30 s. Only the
# killed-node test wants it: on a loaded machine a live node can miss checks this close together.
FAST_DEATH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
}
# The Ray Client server waits this long for the server it starts for each client (default 30 s).
SLOW_START = {"RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "180"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_env() -> dict[str, str]:
    """Ray settings for the cluster's processes (a test overrides it by parametrizing)."""
    return SLOW_START


@pytest.fixture
def cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_env: dict[str, str]
) -> Iterator[dict[str, Any]]:
    """A head with no CPUs (no cell runs there) and one worker node of one CPU whose processes
    start in ``tmp_path/node`` with ``TMPDIR`` ``tmp_path/node-tmp``; a Ray Client server on
    the port ``client_port``."""
    node_dir, node_tmp = tmp_path / "node", tmp_path / "node-tmp"
    node_dir.mkdir()
    node_tmp.mkdir()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    for name, value in ray_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(node_dir)  # the nodes' processes start here
    client_port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "ray_client_server_port": client_port,
        },
    )
    node_args = {"num_cpus": 1, "env_vars": {"TMPDIR": str(node_tmp)}}
    worker = cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    try:
        yield {
            "cluster": cluster,
            "worker": worker,
            "node_args": node_args,
            "node_dir": node_dir,
            "node_tmp": node_tmp,
            "client_port": client_port,
        }
    finally:
        cluster.shutdown()


def sweep(grid: Path, out: str, address: str, cwd: Path, **popen: Any) -> subprocess.Popen:
    """``nopelab sweep`` started in ``cwd`` (the driver's folder, not the nodes')."""
    return subprocess.Popen(
        [sys.executable, "-m", "nopelab", "sweep", str(grid), "--out", out, "--address", address],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(cwd)},
        **popen,
    )


def driver(tmp_path: Path, encodings: str, steps: int) -> tuple[Path, Path]:
    folder = tmp_path / "driver"
    folder.mkdir()
    grid = folder / "grid.toml"
    grid.write_text(GRID.format(steps=steps, encodings=encodings))
    return folder, grid


def finished(run: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
    """The sweep's exit code and stderr; one still running after ``timeout`` s is killed (its
    code then is -9 and its stderr ends with a line that says so)."""
    try:
        _, err = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.kill()
        _, err = run.communicate()
        err += f"\n(killed: still running after {timeout:.0f} s)"
    return run.returncode, err


def test_a_sweep_on_a_cluster_gathers_every_cell_at_the_driver(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """Cells run on the worker node (the head has no CPUs) in scratch folders of that node's
    temporary folder; their folders and rows reach the driver's relative --out, in the driver's
    folder; nothing stays on the node."""
    folder, grid = driver(tmp_path, '["none", "learned"]', steps=4)
    code, err = finished(sweep(grid, "out", cluster["cluster"].address, folder))
    assert code == 0, err[-3000:]
    rows = read_results(folder / "out")
    assert len(rows) == 4 and set(rows["model.pos_encoding"]) == {"none", "learned"}
    cells = sorted((folder / "out" / "cells").iterdir())
    assert len(cells) == 4
    for cell in cells:
        assert (cell / "done.json").is_file() and (cell / "train" / "model.safetensors").is_file()
    assert not (folder / "out" / "failed").exists()
    assert list(cluster["node_dir"].iterdir()) == []  # not the nodes' working folder
    assert not list(cluster["node_tmp"].glob("nopelab-job-*"))  # scratch folders removed


@pytest.mark.parametrize("ray_env", [{**SLOW_START, **FAST_DEATH}])
def test_a_killed_node_costs_only_its_cells_and_a_rerun_completes_them(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """The worker node is killed once a cell has come back; a second node joins. The cell that
    ran on the dead node is recorded as failed (exit 1), the others finish; running the sweep
    again runs only that cell and keeps the finished ones as they were."""
    folder, grid = driver(tmp_path, '["none", "learned", "rope"]', steps=300)
    address = cluster["cluster"].address
    run = sweep(grid, "out", address, folder)
    results = folder / "out" / "results"
    deadline = time.monotonic() + 300
    while not (results.is_dir() and any(results.glob("*.parquet"))):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    cluster["cluster"].remove_node(cluster["worker"], allow_graceful=False)
    cluster["cluster"].add_node(**cluster["node_args"])
    code, err = finished(run)
    assert code == 1, err[-3000:]
    failed = sorted((folder / "out" / "failed").glob("*.txt"))
    assert failed and all(f.read_text().startswith("Ray: ") for f in failed)
    kept = {f.name: f.stat().st_mtime_ns for f in results.glob("*.parquet")}
    assert len(kept) + len(failed) == 6 and len(kept) >= 1
    for f in failed:
        assert not (folder / "out" / "cells" / f.stem / "done.json").exists()

    code, err = finished(sweep(grid, "out", address, folder))
    assert code == 0, err[-3000:]
    assert f"{len(kept)} finished before" in err
    after = {f.name: f.stat().st_mtime_ns for f in results.glob("*.parquet")}
    assert len(after) == 6 and all(after[name] == kept[name] for name in kept)
    assert not list((folder / "out" / "failed").glob("*.txt"))
    assert len(read_results(folder / "out")) == 6


def test_ray_client_addresses_run_the_sweep(cluster: dict[str, Any], tmp_path: Path) -> None:
    """``--address ray://HOST:PORT`` (Ray Client, a cluster driven from another machine)."""
    folder, grid = driver(tmp_path, '["none"]', steps=4)
    address = f"ray://127.0.0.1:{cluster['client_port']}"
    # Each attempt the head fails to start the client's server can wait out SLOW_START.
    code, err = finished(sweep(grid, "out", address, folder), timeout=800)
    assert code == 0, err[-3000:] + client_server_logs(cluster["cluster"])
    assert len(read_results(folder / "out")) == 2


def client_server_logs(cluster: Cluster) -> str:
    """The ends of the head's Ray Client server logs (why a client's server did not start)."""
    logs = Path(cluster.head_node.get_session_dir_path()) / "logs"
    return "".join(
        f"\n== {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:])
        for log in sorted(logs.glob("ray_client_server*.err"))
    )


@pytest.mark.parametrize("differs", ["version", "code"])
def test_a_node_with_another_nopelab_is_refused_before_the_sweep_folder(
    differs: str,
    cluster: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    """The driver's nopelab differs from the nodes' (a node updated, the laptop not), by its
    version or by its code: one line naming --address and the node, exit 2, nothing written."""
    import nopelab
    from helpers import run_cli
    from nopelab.runtime import cluster as connecting

    folder, grid = driver(tmp_path, '["none"]', steps=4)
    nodes, code = nopelab.__version__, connecting.code_digest()
    if differs == "version":
        monkeypatch.setattr(nopelab, "__version__", "0.0.0-driver")
        said = f"runs nopelab {nodes}, this machine 0.0.0-driver"
    else:
        monkeypatch.setattr(connecting, "code_digest", lambda: "driver-code")
        said = f"runs other nopelab {nodes} code than this machine (files {code}, here driver-code)"
    out = folder / "out"
    args = ["sweep", str(grid), "--out", str(out), "--address", cluster["cluster"].address]
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nopelab: error: --address: node "), err
    assert said in err[0]
    assert not out.exists()
