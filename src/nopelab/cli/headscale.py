"""``nopelab headscale``: Wang et al.'s attention-logit scaling of a frozen language model, one
factor trained per head or (``--uniform``) one for every head, written as a new training run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli.app import Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig, HeadScaleConfig
from nopelab.errors import UserError

HEAD_SCALES, UNIFORM = "Head scales", "Uniform scale"


@app.command()
@with_options(
    Group("headscale", HeadScaleConfig, HEAD_SCALES, exclude=("uniform",)),
    Group("analysis", AnalysisConfig, HEAD_SCALES, only=("device",)),
    Group("headscale", HeadScaleConfig, UNIFORM, only=("uniform",)),
)
def headscale(
    run_dir: Annotated[
        Path, typer.Argument(help="A training run directory of a language model trained on text")
    ],
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Scale the attention logits of a trained language model for longer contexts (Wang et al.
    2024): a factor per head trained at --length with every weight frozen, or one --uniform
    factor; writes a training run that evaluate, analyze and probe read."""
    from nopelab.runtime.device import resolve_device
    from nopelab.runtime.rundir import check_out, default_out, staged_run
    from nopelab.training.headscale import (
        head_scale_run,
        head_scale_settings,
        read_text_run,
        uniform_run,
    )
    from nopelab.training.sources import TextSource
    from nopelab.training.trained import load_trained, make_source

    typed = given.section("headscale")
    if "length" not in typed and "uniform" not in typed:  # neither mode: name the flag to type
        raise UserError(f"--length: {HeadScaleConfig.NO_MODE}")
    h = HeadScaleConfig(**typed)
    device = resolve_device(AnalysisConfig(**given.section("analysis")).device)
    out = out or default_out(f"headscale-{run_dir.name}")
    check_out(out, force, [run_dir])
    run = read_text_run(run_dir)
    source = make_source(run, run_dir)
    assert isinstance(source, TextSource)  # read_text_run: a run without a task has a corpus
    settings = None
    if h.uniform is None:
        assert h.length is not None  # HeadScaleConfig: --length or --uniform
        settings = head_scale_settings(
            run, source, h.length, h.steps, h.lr, h.init_scale, h.batch_size, h.seed
        )
    _, model = load_trained(run_dir)
    with staged_run(out, force, [run_dir], command="headscale") as staging:
        if settings is None:
            assert h.uniform is not None  # the mode without training
            uniform_run(staging, run_dir, run, model, source, h.uniform)
        else:
            head_scale_run(staging, run_dir, run, model, source, settings, device)
    typer.echo(f"wrote {out}")
