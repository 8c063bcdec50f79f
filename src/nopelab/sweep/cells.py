"""What one cell of a grid runs, through the same library functions the commands use.

:func:`run_cell` writes the cell's files into a folder and returns its result rows: the rows of
the command's ``summary.json`` (one per layer and site for ``analyze``, one per fit for
``probe``, one for ``train``), each with the cell's varied settings as columns.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from nopelab.sweep.grid import Cell


def run_cell(cell: Cell, folder: Path) -> list[dict[str, Any]]:
    """Run ``cell`` writing into ``folder``; its summary rows with the varied values first."""
    match cell.command:
        case "train":
            rows = [_train(cell, folder / "train")]
        case "train+analyze":
            trained = _train(cell, folder / "train")
            rows = [{**row, **trained} for row in _analyze(cell, folder / "analysis", folder)]
        case "analyze":
            rows = _analyze(cell, folder, None)
        case _:  # probe
            rows = _probe(cell, folder)
    return [{"cell": cell.key, **cell.values, **row} for row in rows]


def _train(cell: Cell, out: Path) -> dict[str, Any]:
    from nopelab.training.run import TrainRun
    from nopelab.training.train import train

    settings = {k: v for k, v in cell.settings.items() if k != "analysis"}
    summary = train(
        TrainRun.from_dict(settings), out, progress=False, label=cell.key, figures=False
    )
    assert summary is not None
    return {
        **summary["final_eval"],
        "tokens_per_second": summary["tokens_per_second"],
        "train_seconds": summary["train_seconds"],
    }


def _analyze(cell: Cell, out: Path, trained: Path | None) -> list[dict[str, Any]]:
    import nopelab
    from nopelab.measure.run_files import write_analysis

    out.mkdir(parents=True, exist_ok=True)
    analysis = cell.settings.get("analysis", {})
    if trained is not None:
        study = nopelab.load(trained / "train", analysis=analysis)
    else:
        study = nopelab.load(model=cell.settings.get("model", {}), analysis=analysis)
    start = time.perf_counter()
    result = nopelab.analyze(study, progress=False)
    seconds = time.perf_counter() - start
    write_analysis(
        out, study.config, result, seconds, title=cell.key, figures=False,
        random_init=trained is None,
    )  # fmt: skip
    return nopelab.summary_rows(result)


def _probe(cell: Cell, folder: Path) -> list[dict[str, Any]]:
    import nopelab
    from nopelab.config import ProbeConfig, build
    from nopelab.probing.pipeline import probe_model
    from nopelab.probing.run_files import write_probes

    study = nopelab.load(
        model=cell.settings.get("model", {}),
        analysis={"sites": ["embed", "resid_post"], **cell.settings.get("analysis", {})},
        statistics=False,
    )
    probe = build(ProbeConfig, cell.settings.get("probe", {}), "probe")
    start = time.perf_counter()
    rows = probe_model(study.model, study.config.analysis, probe, progress=False)
    config = {**study.config.to_dict(), "probe": dataclasses.asdict(probe)}
    write_probes(folder, config, rows, time.perf_counter() - start, cell.key)
    return rows
