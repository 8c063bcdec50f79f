"""Compare a run's ``summary.json`` with a stored reference, ``tests/references/NAME.json``, at
the tolerances the tests use (timings and the device aside); one line, exit status 1 when they differ.

    python scripts/compare_reference.py runs/gpu-checks/chi2023 chi2023-random-init-small
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import assert_matches_reference  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder holding summary.json")
    parser.add_argument("reference", help="a name under tests/references/, without .json")
    args = parser.parse_args()
    try:
        assert_matches_reference(args.run, args.reference, any_device=True)
    except AssertionError as exc:
        print(f"{args.run} differs from {args.reference}: {str(exc).splitlines()[0]}")
        return 1
    print(f"{args.run}: every number of {args.reference} within the reference tolerances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
