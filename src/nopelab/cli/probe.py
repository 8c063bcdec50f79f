"""``nopelab probe``: position probes on a model's activations, per site and layer."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import typer

from nopelab.cli import resolve
from nopelab.cli.app import (
    ANALYSIS,
    HF_OPTIONS,
    MODEL_OPTIONS,
    PROBE_OPTIONS,
    ConfigFile,
    Force,
    Out,
    RunDir,
    app,
)
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig

SECTIONS = ("model", "analysis", "probe")
PROBE_ANALYSIS = Group(
    "analysis",
    AnalysisConfig,
    ANALYSIS,
    defaults={"sites": ("embed", "resid_post")},
)


def probe_settings(data: dict[str, Any], given: Given, analysis: AnalysisConfig) -> Any:
    """The validated [probe] settings: the config file's table with the flags laid over it;
    ``analysis``'s sites are checked to be ones a probe can read."""
    from nopelab.config import ProbeConfig, build
    from nopelab.probing.pipeline import check_probe_sites

    check_probe_sites(analysis.sites)
    given.lay_over(data, "probe")
    return build(ProbeConfig, data["probe"], "config.probe")


@app.command()
@with_options(MODEL_OPTIONS, PROBE_ANALYSIS, PROBE_OPTIONS, HF_OPTIONS)
def probe(
    run_dir: RunDir = None,
    config: ConfigFile = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Fit position probes on a model's activations: accuracy and MAD (classifiers), MAE and
    Pearson r (regressors), per site and layer, against the predict-the-middle baseline."""
    from nopelab.config import read_config_file
    from nopelab.probing.pipeline import probe_model
    from nopelab.probing.run_files import write_probes
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import check_out, default_out, staged_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    out = out or default_out(f"probe-{Path(str(run_dir)).name}" if run_dir else "probe")
    check_out(out, force, resolve.inputs(run_dir))
    study = resolve.study(run_dir, data, given, SECTIONS, statistics=False)
    probe_cfg = probe_settings(data, given, study.config.analysis)
    with staged_run(out, force, resolve.inputs(run_dir), command="probe") as staging:
        start = time.perf_counter()
        rows = probe_model(study.model, study.config.analysis, probe_cfg, study.source)
        config_dict = {**study.config.to_dict(), "probe": dataclasses.asdict(probe_cfg)}
        seconds = time.perf_counter() - start
        stage("probe: writing tables and figures")
        write_probes(staging, config_dict, rows, seconds, resolve.title(run_dir))
    typer.echo(f"wrote {out}")
