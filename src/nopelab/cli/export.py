"""``nopelab export``: a trained model as an equivalent Hugging Face model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli import resolve
from nopelab.cli.app import app
from nopelab.config import check_seed


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A training run directory")],
    out: Annotated[Path, typer.Option(help="Folder for the Hugging Face model")],
    seed: Annotated[int, typer.Option(help="Seed of the batch the logit check runs on")] = 0,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
) -> None:
    """Export a trained model as an equivalent Hugging Face model (GPT-2, Llama or SmolLM3),
    checked to give the same logits; load it with AutoModelForCausalLM.from_pretrained(OUT)."""
    from nopelab.extras import need

    need("transformers", "nopelab export")
    from nopelab.hf.export import export_run, family
    from nopelab.runtime.rundir import staged_run
    from nopelab.training.run import read_run

    check_seed("--seed", seed)
    family(read_run(run_dir).model)  # an unexportable config fails before anything is written
    with staged_run(out, force, resolve.inputs(run_dir), command="export") as staging:
        name = export_run(run_dir, staging, seed, shown_as=out)
    typer.echo(f"wrote {out} ({name})")
