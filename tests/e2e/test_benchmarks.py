"""The benchmarks still run against the current API (they are not part of the test command's
timings; this only runs the smallest piece of each that has one)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_bench_long_measures_one_length() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_long.py"), "--one", "128"]
    command += ["--layers", "1", "--d-model", "16", "--heads", "2"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["forward_s"] > 0 and row["statistics_s"] > 0 and row["peak_mb"] > 0


def test_bench_train_times_the_language_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("bench_train")
    timing = bench.time_language_model("none", steps=2, warmup=1, threads=1)
    assert timing.batch == 32 and 0 < timing.best <= timing.median


def test_bench_busy_reads_a_commands_throughput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("bench_busy")
    train = f"train {bench.TASK} --steps 2"
    assert bench.throughput(train, {"OMP_NUM_THREADS": "1"}, tmp_path / "train") > 0
    analyze = "analyze --layers 1 --d-model 16 --heads 2 --seq-len 16 --samples 2"
    assert bench.throughput(analyze, {}, tmp_path / "analyze") > 0
