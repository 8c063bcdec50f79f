"""Throughput of ``nopelab train`` and ``nopelab analyze`` beside busy processes.

Run: ``.venv/bin/python benchmarks/bench_busy.py`` (``--quick``: two rounds, the task training
and ``analyze`` only). Each workload runs as the ``nopelab`` command in a subprocess, with every
setting in turn (the order rotates from round to round), first on the cores as they are
("idle"), then with ``--busy`` processes beside it that spin on the CPU (a research server's
other jobs). A setting's throughput is its median over the rounds; the ratio column compares it
with the one-thread run under the same load, the best a process can do when another one holds
the other core. Throughput: tokens per second of training from ``summary.json``; for
``analyze``, positions analysed per second of its statistics (``summary.json``'s ``seconds``).

Settings: ``nopelab`` is the command as installed (passive OpenMP threads; one thread for a
training step below PyTorch's grain size, as the task model's); ``one thread`` adds
``OMP_NUM_THREADS=1``; ``spinning`` adds ``OMP_NUM_THREADS=2 OMP_WAIT_POLICY=active``: two
threads that spin while they wait for work, the behaviour the command avoids. ``--setting NAME=VAR=VALUE``
adds another (e.g. ``--setting spin1k=GOMP_SPINCOUNT=1000``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TASK = "--task copy --max-len 5 --layers 1 --d-model 32 --heads 2 --seq-len 32 --batch-size 8"
LM = "--corpus default --tokenizer byte --layers 3 --d-model 80 --heads 4 --seq-len 128"
WORKLOADS = {
    # the tiny training: many short operations, the worst case for waiting threads
    "train (task)": f"train {TASK} --steps 200",
    # the reproductions' 251 k-parameter byte LM, 32 windows of 128 bytes a step
    "train (LM)": f"train {LM} --batch-size 32 --steps 60 --eval-every 1000",
    "analyze": "analyze --layers 4 --d-model 256 --heads 4 --seq-len 256 --samples 8",
}
SETTINGS = {
    "nopelab": {},
    "one thread": {"OMP_NUM_THREADS": "1"},
    "spinning": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "active"},
}
# the variables the settings change, unset for the as-installed run
OPENMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that keep a core busy each, stopped on leaving."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def throughput(command: str, env: dict[str, str], out: Path) -> float:
    """Run ``nopelab COMMAND --out OUT`` with ``env`` and return its throughput."""
    base = {k: v for k, v in os.environ.items() if k not in OPENMP}
    proc = subprocess.run(
        [sys.executable, "-m", "nopelab", *command.split(), "--seed", "0", "--out", str(out)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(f"nopelab {command}: {proc.stderr}")
    summary = json.loads((out / "summary.json").read_text())
    if command.startswith("train"):
        return float(summary["tokens_per_second"])
    words = command.split()
    positions = int(words[words.index("--samples") + 1]) * int(words[words.index("--seq-len") + 1])
    return positions / float(summary["seconds"])


def measure(
    workloads: dict[str, str], settings: dict[str, dict[str, str]], busy: int, rounds: int
) -> dict[tuple[str, str], list[float]]:
    """Every workload under every setting, ``rounds`` times, beside ``busy`` busy processes."""
    names = list(settings)
    found: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder, busy_processes(busy):
        for workload, command in workloads.items():
            for round_ in range(rounds):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    out = Path(folder) / f"{len(found)}-{round_}-{name.replace(' ', '_')}"
                    rate = throughput(command, settings[name], out)
                    found.setdefault((workload, name), []).append(rate)
                    print(f"  {workload}, {name}, busy {busy}: {rate:,.0f}/s", file=sys.stderr)
    return found


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds; no LM training")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per setting (3; 2 quick)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside it (2)")
    parser.add_argument("--only", choices=list(WORKLOADS), default=None, help="one workload")
    parser.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VAR=VALUE", help="another setting"
    )
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    workloads = dict(WORKLOADS)
    if args.quick:
        del workloads["train (LM)"]
    if args.only:
        workloads = {args.only: WORKLOADS[args.only]}
    settings = dict(SETTINGS)
    for spec in args.setting:
        name, var, value = spec.split("=", 2)
        settings[name] = {var: value}
    print(f"{os.cpu_count()} CPUs; load average before: {load_average()}")
    results = {}
    for busy in (0, args.busy):
        results[busy] = measure(workloads, settings, busy, rounds)
        print(f"load average after busy {busy}: {load_average()}")
    print(f"\nmedian throughput over {rounds} rounds (per second); ratio to one thread, same load")
    print(f"| workload | setting | idle | ratio | beside {args.busy} busy | ratio |")
    print("|---|---|---|---|---|---|")
    for workload in workloads:
        for name in settings:
            cells = []
            for busy in (0, args.busy):
                rate = statistics.median(results[busy][workload, name])
                one = statistics.median(results[busy][workload, "one thread"])
                cells += [f"{rate:,.0f}", f"{rate / one:.2f}"]
            print(f"| {workload} | {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
