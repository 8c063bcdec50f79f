"""``nopelab intervene``: edit one site of a trained model and measure what is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.cli import resolve
from nopelab.cli.app import ANALYSIS, OUTPUT, PROBE, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig, InterventionConfig, ProbeConfig

INTERVENTION = "Intervention"


@app.command()
@with_options(
    Group("intervention", InterventionConfig, INTERVENTION),
    Group(
        "analysis",
        AnalysisConfig,
        ANALYSIS,
        only=("seq_len", "samples", "seed", "device"),
        shown={"seq_len": "the run's training length"},
    ),
    Group("probe", ProbeConfig, PROBE, only=("probes", "features", "seeds", "epochs")),
)
def intervene(
    run_dir: Annotated[Path, typer.Argument(help="A training run directory")],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML, YAML or JSON with \\[intervention], \\[analysis] and \\[probe] tables; "
            "flags override it.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Edit one site of a trained model (norm equalisation, LEACE position erasure, and their
    controls) and measure what its behaviour and the downstream probes lose, per layer."""
    from nopelab.config import read_config_file
    from nopelab.extras import need
    from nopelab.probing.interventions import (
        intervention_settings,
        run_interventions,
        write_interventions,
    )
    from nopelab.runtime.rundir import default_out, staged_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    for section in ("intervention", "analysis", "probe"):
        given.lay_over(data, section)
    settings = intervention_settings(run_dir, data)
    for name in settings.intervention.interventions:
        if name.startswith("leace"):
            need("concept_erasure", f"--intervention {name}")
    out = out or default_out(f"intervene-{run_dir.name}")
    with staged_run(out, force, resolve.inputs(run_dir), command="intervene") as staging:
        rows = run_interventions(run_dir, settings.intervention, settings.probe, settings.analysis)
        config_dict = settings.to_dict(run_dir)
        write_interventions(staging, rows, config_dict, title=f"trained model {run_dir}")
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")
