"""``nopelab analyze``: statistics of a model's activations, per layer and site."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from nopelab.cli import resolve
from nopelab.cli.app import (
    ANALYSIS_OPTIONS,
    HF_OPTIONS,
    MODEL_OPTIONS,
    ConfigFile,
    Force,
    Out,
    RunDir,
    app,
)
from nopelab.cli.options import Given, with_options

if TYPE_CHECKING:
    from nopelab.config import RunConfig


@app.command()
@with_options(MODEL_OPTIONS, ANALYSIS_OPTIONS, HF_OPTIONS)
def analyze(
    run_dir: RunDir = None,
    config: ConfigFile = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Analyse a model: variance, norms, cosine similarity, adjacency scores per layer and site.

    Random-init by default; give a training run directory to analyse its trained checkpoint, or
    hf:PATH for a Hugging Face model.
    """
    from nopelab.config import read_config_file
    from nopelab.measure.analysis import analyze_model
    from nopelab.measure.run_files import write_analysis
    from nopelab.runtime.device import resolve_device
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import check_out, default_out, staged_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    out = out or default_out(f"analyze-{Path(str(run_dir)).name}" if run_dir else "analyze")
    check_out(out, force, resolve.inputs(run_dir))
    study = resolve.study(run_dir, data, given)
    cfg = study.config
    resolve_device(cfg.analysis.device)
    with staged_run(out, force, resolve.inputs(run_dir), command="analyze") as staging:
        start = time.perf_counter()
        # write_analysis takes a Hugging Face model's HFRun too; its annotation names RunConfig
        result = analyze_model(study.model, cfg.analysis, source=study.source)
        seconds = time.perf_counter() - start
        stage("analyze: writing tables and figures")
        write_analysis(
            staging,
            cast("RunConfig", cfg),
            result,
            seconds,
            title=resolve.title(run_dir),
            random_init=run_dir is None,
        )
        if resolve.hf_path(run_dir):
            from nopelab.hf.positions import position_use, write_position_use
            from nopelab.hf.sites import HFModel

            assert isinstance(study.model, HFModel)  # an hf:PATH model
            write_position_use(staging, position_use(study.model, seed=cfg.analysis.seed))
    typer.echo(f"wrote {out}")
