"""How far the stored smoke references move when the arithmetic's order changes.

Run: ``.venv/bin/python scripts/reference_spread.py`` (about 7 minutes on 2 cores per
variant). It runs the tests marked ``reference`` (``pytest -m reference``) once per variant,
each writing the summaries it compared into a folder of its own (``NOPELAB_REFERENCE_DUMP``),
then prints, for every kind of number that ``tests/helpers.py`` compares, the largest deviation
from ``tests/references/`` over all variants, in the unit its tolerance is stated in
(relative, or absolute for scores that count comparisons and for correlations).

The variants change the order in which sums are taken, as another CPU does: the vector width
of PyTorch's, MKL's and oneDNN's kernels (the tests pin AVX2; a CPU with AVX-512 or without AVX2
rounds differently) and the number of threads that split a reduction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import REFERENCES, kind_of  # noqa: E402

VARIANTS = {
    "AVX-512 kernels": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    },
    "one thread (AVX2 kernels, as tested)": {"OMP_NUM_THREADS": "1"},
}


def flat(value: Any, where: str = "") -> dict[str, Any]:
    """Every scalar in a JSON value, by its path."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in flat(item, f"{where}.{key}").items()
        }
    if isinstance(value, list):
        return {
            k: v for i, item in enumerate(value) for k, v in flat(item, f"{where}[{i}]").items()
        }
    return {where: value}


def leaves(value: Any) -> dict[str, float]:
    """Every float in a JSON value (what the tests compare with a tolerance), by its path."""
    return {k: v for k, v in flat(value).items() if isinstance(v, float)}


def outcomes(value: Any) -> dict[str, Any]:
    """Every value that the tests compare exactly (a verdict, a count, a break that may be
    None), by its path."""
    return {k: v for k, v in flat(value).items() if not isinstance(v, float)}


def changed_outcomes(got: Path) -> tuple[list[str], int]:
    """Where the summaries in ``got`` hold another exact value than the stored references, or
    None for a stored number (a break that no longer happens); and how many were compared."""
    changed, compared = [], 0
    for path in sorted(got.glob("*.json")):
        mine = json.loads(path.read_text())
        have = {**outcomes(mine), **leaves(mine)}
        want = json.loads((REFERENCES / path.name).read_text())
        numbers = leaves(want)
        compared += len(outcomes(want)) + len(numbers)
        expected = {**outcomes(want), **{k: v for k, v in numbers.items() if have.get(k) is None}}
        for where, value in expected.items():
            if have.get(where) != value:
                changed.append(f"{path.stem}{where}: {have.get(where)!r}, not {value!r}")
    return changed, compared


def deviations(got: Path) -> dict[str, tuple[float, str]]:
    """Per kind of number, the largest deviation of the summaries in ``got`` from the stored
    references, and where it is."""
    worst: dict[str, tuple[float, str]] = {}
    for path in sorted(got.glob("*.json")):
        mine = leaves(json.loads(path.read_text()))
        for where, want in leaves(json.loads((REFERENCES / path.name).read_text())).items():
            have = mine.get(where)
            if have is None or want != want or have != have:
                continue
            kind, relative = kind_of(where)
            gap = abs(have - want) / (abs(want) or 1.0) if relative else abs(have - want)
            if gap > worst.get(kind, (-1.0, ""))[0]:
                worst[kind] = (gap, f"{path.stem}{where}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None, help="keep the summaries here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="reference-spread-"))
    found = {}
    for index, (name, env) in enumerate(VARIANTS.items()):
        dump = folder / str(index)
        variant = {**os.environ, **env}
        capability = subprocess.run(  # a CPU without AVX-512 runs the best kernels it has
            [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
            env=variant,
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"{name} (PyTorch's kernels: {capability}): pytest -m reference", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "reference", "-p", "no:cacheprovider"],
            cwd=ROOT,
            env={**variant, "NOPELAB_REFERENCE_DUMP": str(dump)},
            check=False,
        )
        found[name] = deviations(dump)
        changed, compared = changed_outcomes(dump)
        print(f"{name}: {len(changed)} of {compared} exact values changed", *changed, sep="\n  ")
    print("\nlargest deviation from tests/references, per kind of number")
    kinds = sorted({kind for worst in found.values() for kind in worst})
    for kind in kinds:
        print(f"{kind}:")
        for name, worst in found.items():
            gap, where = worst.get(kind, (0.0, "-"))
            print(f"  {name:32s} {gap:.2e}  ({where})")


if __name__ == "__main__":
    main()
