"""``nopelab compare-signals``: does variance, norm or similarity carry position?"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.cli import resolve
from nopelab.cli.app import ANALYSIS, MODEL_OPTIONS, PROBE, ConfigFile, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.cli.probe import SECTIONS, probe_settings
from nopelab.config import AnalysisConfig, ProbeConfig
from nopelab.errors import UserError


@app.command("compare-signals")
@with_options(
    MODEL_OPTIONS,
    Group(
        "analysis",
        AnalysisConfig,
        ANALYSIS,
        defaults={"sites": ("attn_out", "resid_post")},
    ),
    Group(
        "probe",
        ProbeConfig,
        PROBE,
        defaults={
            "probes": ("mlp-reg",),
            "features": ("variance", "norm", "cos_last", "cos_row", "raw"),
        },
    ),
)
def compare_signals(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Training run directories: each is probed at its initial and its trained "
            "weights. Without any, one randomly initialised model is built from the flags."
        ),
    ] = None,
    config: ConfigFile = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Which signal carries position: variance alone, norm alone or cosine similarity alone?

    Regression probes per layer for random-init and trained models, a verdict table, a figure.
    """
    from nopelab.config import read_config_file
    from nopelab.models.transformer import build_model
    from nopelab.probing.pipeline import probe_model
    from nopelab.probing.run_files import write_probes
    from nopelab.probing.signals import verdict
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import default_out, staged_run
    from nopelab.training.run import read_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    models = []  # (label, state, model, settings, source)
    for run_dir in run_dirs or (None,):
        copy = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
        study = resolve.study(run_dir, copy, given, SECTIONS, statistics=False)
        cfg, model, source = study.config, study.model, study.source
        if run_dir is None:
            models.append(("random-init", "init", model, cfg, source))
            continue
        run = read_run(run_dir)
        initial = build_model(run.model, run.train.seed)  # the weights training started from
        models += [
            (run_dir.name, "init", initial, cfg, source),
            (run_dir.name, "trained", model, cfg, source),
        ]
    probe_cfg = probe_settings(data, given, study.config.analysis)
    if any(not p.endswith("reg") for p in probe_cfg.probes):
        raise UserError("--probes: compare-signals uses regression probes: linear-reg, mlp-reg")
    out = out or default_out("compare-signals")
    with staged_run(
        out, force, resolve.inputs(*run_dirs or []), command="compare-signals"
    ) as staging:
        start = time.perf_counter()
        rows = []
        for label, state, model, cfg, source in models:
            rows += probe_model(
                model, cfg.analysis, probe_cfg, source, f"{label} {state}",
                labels={"model": label, "state": state},
            )  # fmt: skip
        config_dict = {
            "runs": [str(r) for r in run_dirs or []],
            **models[0][3].to_dict(),
            "probe": dataclasses.asdict(probe_cfg),
        }
        title = "variance, norm or similarity?"
        seconds = time.perf_counter() - start
        stage("compare-signals: writing tables and figures")
        write_probes(staging, config_dict, rows, seconds, title, verdict(rows))
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")
