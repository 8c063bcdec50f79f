"""The typer application, its help panels, and the option groups commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli.options import Group
from nopelab.config import AnalysisConfig, HFConfig, ModelConfig, ProbeConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure where transformers without positional encodings keep position.",
)


def _version(value: bool) -> None:
    if value:
        from nopelab import __version__

        typer.echo(f"nopelab {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Measure where transformers without positional encodings keep position."""


MODEL, ANALYSIS, DATA, TRAINING, PROBE, OUTPUT = (
    "Model", "Analysis", "Data", "Training", "Probe", "Output",
)  # fmt: skip
HF = "Hugging Face model (hf:PATH)"

MODEL_OPTIONS = Group("model", ModelConfig, MODEL)
ANALYSIS_OPTIONS = Group("analysis", AnalysisConfig, ANALYSIS)
HF_OPTIONS = Group("hf", HFConfig, HF, exclude=("train_len",))  # train_len: evaluate only
PROBE_OPTIONS = Group("probe", ProbeConfig, PROBE)

ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML, YAML or JSON file with settings tables; flags override it.",
        rich_help_panel=OUTPUT,
    ),
]
Out = Annotated[
    Path | None, typer.Option(help="Run directory \\[runs/NAME-TIMESTAMP]", rich_help_panel=OUTPUT)
]
Force = Annotated[bool, typer.Option(help="Replace a non-empty --out", rich_help_panel=OUTPUT)]
RunDir = Annotated[
    Path | None,
    typer.Argument(
        help="A training run directory: its trained model (default input: its own held-out "
        "data); or hf:PATH, a Hugging Face model folder or .gguf file (default input: text). "
        "Without it, a randomly initialised model is built from the flags."
    ),
]
