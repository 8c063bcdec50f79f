"""Keep a measured run's numbers in docs/results/: its run.json and summary.json, as one file.

    .venv/bin/python scripts/result_file.py runs/wang-small wang2024-lengths-small

writes docs/results/wang2024-lengths-small.json = {"run": run.json, "summary": summary.json}
(timings inside the summary kept), and "models": each trained model's own summary.json (its
final evaluation, steps, parameters, training time: runs/NAME/summary.json), so a multi-seed
mean ships with every seed's value. For a sweep's folder the summary is {"results": the rows of
its results/ table}. --table NAME adds the rows of the run's NAME.parquet under "tables" (a
small table whose numbers summary.json does not hold). The pages quote these files, and tests/e2e/test_claims.py
checks every quoted number against them (docs/results/README.md). An existing file is
replaced only with --replace.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def sweep_summary(folder: Path) -> dict[str, object]:
    """A sweep's results table as JSON rows, in the order of the cells' keys."""
    from nopelab.sweep.engine import read_results

    return {"results": json.loads(read_results(folder).to_json(orient="records"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a reproduction's or a sweep's --out folder")
    parser.add_argument("name", help="the result file's name, without .json")
    parser.add_argument("--drop", nargs="*", default=[], help="summary keys to leave out")
    parser.add_argument("--table", nargs="*", default=[], help="NAME.parquet tables to add")
    parser.add_argument("--replace", action="store_true", help="replace an existing file")
    args = parser.parse_args()
    sweep = (args.run / "results").is_dir() and not (args.run / "summary.json").exists()
    wanted = ("run.json",) if sweep else ("run.json", "summary.json")
    wanted += tuple(f"{name}.parquet" for name in args.table)
    missing = [n for n in wanted if not (args.run / n).is_file()]
    if missing:
        print(f"result_file: {args.run} has no {' or '.join(missing)}", file=sys.stderr)
        return 2
    target = RESULTS / f"{args.name}.json"
    if target.exists() and not args.replace:
        print(f"result_file: {target} exists; --replace replaces it", file=sys.stderr)
        return 2
    summary = (
        sweep_summary(args.run) if sweep else json.loads((args.run / "summary.json").read_text())
    )
    unknown = [key for key in args.drop if key not in summary]
    if unknown:
        print(f"result_file: --drop: no key {', '.join(unknown)} in summary.json", file=sys.stderr)
        return 2
    record = {
        "run": json.loads((args.run / "run.json").read_text()),
        "summary": {k: v for k, v in summary.items() if k not in args.drop},
    }
    if args.table:
        import pandas as pd

        record["tables"] = {
            name: json.loads(
                pd.read_parquet(args.run / f"{name}.parquet").to_json(orient="records")
            )
            for name in args.table
        }
    models = {
        path.parent.name: json.loads(path.read_text())
        for path in sorted((args.run / "runs").glob("*/summary.json"))
    }
    if models:
        record["models"] = models
    run = record["run"]
    if str(run.get("commit")).endswith("-dirty") or run.get("commit") is None:
        print(f"result_file: warning: {args.run} ran code of no clean commit", file=sys.stderr)
    if "--resume" in run.get("command", ""):
        print(
            "result_file: warning: a resumed run: its seconds are the last part's", file=sys.stderr
        )
    target.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
