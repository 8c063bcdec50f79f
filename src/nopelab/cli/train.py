"""``nopelab train``: a model on a synthetic task or on text; torchrun runs it data-parallel."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.cli.app import DATA, MODEL_OPTIONS, OUTPUT, TRAINING, ConfigFile, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import CorpusConfig, TrainConfig
from nopelab.errors import RunFailed, UserError
from nopelab.training.task_config import TaskConfig


@app.command()
@with_options(
    Group("task", TaskConfig, DATA),
    Group("corpus", CorpusConfig, DATA),
    MODEL_OPTIONS,
    Group("train", TrainConfig, TRAINING),
)
def train(
    config: ConfigFile = None,
    out: Out = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in --out from its checkpoint, on any --device; a larger "
            "--steps trains a run, finished or not, up to that total (the learning rate then "
            "follows the schedule of the new total)",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    tensorboard: Annotated[
        bool,
        typer.Option(
            help="Also log to --out/tensorboard (needs the tensorboard package)",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Train a model on a synthetic task (--task) or on text (--corpus); torchrun runs it data-parallel."""
    from nopelab.config import read_config_file
    from nopelab.runtime.rundir import check_resume, is_disk_full
    from nopelab.training.run import assemble_run, read_run
    from nopelab.training.train import train as run_training

    check_resume(resume, force, out)
    if resume:
        assert out is not None  # check_resume: --resume needs --out
        if not (out / "config.json").is_file():
            raise UserError(f"--resume: {out} holds no training run (no config.json)")
        data: dict[str, Any] = read_run(out).to_dict()
    else:
        data = read_config_file(config) if config else {}
    sections = ("task", "corpus", "model", "train")
    run = assemble_run(data, {name: given.section(name) for name in sections}, resume)
    out = out or _default_out(run)
    try:
        summary = run_training(run, out, resume=resume, force=force, tensorboard=tensorboard)
    except KeyboardInterrupt:
        typer.echo(f"nopelab: interrupted; {_kept_checkpoint(out)}", err=True)
        sys.exit(130)
    except RunFailed as exc:
        typer.echo(f"nopelab: error: {exc}; {_kept_checkpoint(out, hint=False)}", err=True)
        sys.exit(1)
    except OSError as exc:  # a full disk while writing the logs or the summary
        if not is_disk_full(exc):
            raise
        where = f" while writing {exc.filename}" if exc.filename else ""
        kept = _kept_checkpoint(out, hint=False)
        typer.echo(f"nopelab: error: {exc.strerror}{where}; {kept}", err=True)
        sys.exit(1)
    if summary is not None and int(os.environ.get("RANK", "0")) == 0:
        typer.echo(
            f"final evaluation: {_format_metrics(summary['final_eval'])}; "
            f"{summary['tokens_per_second']:.0f} tokens/s"
        )
        typer.echo(f"wrote {out}")


def _kept_checkpoint(out: Path, hint: bool = True) -> str:
    """What a stopped training run kept, and (``hint``) how to continue it."""
    from nopelab.training.checkpoint import STATE_FILE, read_state

    if not (out / STATE_FILE).is_file():
        return "no checkpoint yet: nothing was kept"
    kept = f"the checkpoint of step {read_state(out)['step']} is kept"
    if not hint:
        return kept
    return (
        f"{kept}: continue with {shlex.join(['nopelab', 'train', '--resume', '--out', str(out)])}"
    )


def _default_out(run: Any) -> Path:
    from nopelab.runtime.rundir import default_out

    what = run.task.name if run.task is not None else "text"
    return default_out(f"train-{what}-{run.model.pos_encoding}")


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
