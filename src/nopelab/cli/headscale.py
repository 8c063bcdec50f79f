"""``nopelab headscale``: Wang et al.'s attention-logit scaling of a frozen language model, one
factor trained per head or (``--uniform``) one for every head, written as a new training run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli.app import Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig, check_seed
from nopelab.errors import UserError

HEAD_SCALES, UNIFORM = "Head scales", "Uniform scale"


@app.command()
@with_options(Group("analysis", AnalysisConfig, HEAD_SCALES, only=("device",)))
def headscale(
    run_dir: Annotated[
        Path, typer.Argument(help="A training run directory of a language model trained on text")
    ],
    length: Annotated[
        float | None,
        typer.Option(
            help="Train a factor per head on windows of this multiple of the training length "
            "(the length to generalise to); needed unless --uniform",
            show_default=False,
            rich_help_panel=HEAD_SCALES,
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(min=1, help="Optimiser steps \\[200]", rich_help_panel=HEAD_SCALES),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(
            help="AdamW learning rate (no weight decay) \\[0.05]", rich_help_panel=HEAD_SCALES
        ),
    ] = None,
    init_scale: Annotated[
        float | None,
        typer.Option(
            help="Every head's starting factor, >= 1 \\[1 + 0.3973 ln LENGTH, Wang et al.'s fit]",
            rich_help_panel=HEAD_SCALES,
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(min=1, help="Windows per step \\[4]", rich_help_panel=HEAD_SCALES),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the training windows \\[0]", rich_help_panel=HEAD_SCALES),
    ] = None,
    uniform: Annotated[
        float | None,
        typer.Option(
            help="Train nothing: scale every head's logits by this factor (--logit-scale; Wang "
            "et al.: 1.2 at 2x the training length, 1.5 at 4x, 1.8 at 8x)",
            show_default=False,
            rich_help_panel=UNIFORM,
        ),
    ] = None,
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

    training = (length, steps, lr, init_scale, batch_size, seed)
    _check_flags(uniform, *training)
    if seed is not None:
        check_seed("--seed", seed)
    device = resolve_device(AnalysisConfig(**given.section("analysis")).device)
    out = out or default_out(f"headscale-{run_dir.name}")
    check_out(out, force, [run_dir])
    run = read_text_run(run_dir)
    source = make_source(run, run_dir)
    assert isinstance(source, TextSource)  # read_text_run: a run without a task has a corpus
    settings = None
    if uniform is None:
        assert length is not None  # _check_flags: --length or --uniform
        settings = head_scale_settings(run, source, length, steps, lr, init_scale, batch_size, seed)
    _, model = load_trained(run_dir)
    with staged_run(out, force, [run_dir], command="headscale") as staging:
        if settings is None:
            assert uniform is not None  # the mode without training
            uniform_run(staging, run_dir, run, model, source, uniform)
        else:
            head_scale_run(staging, run_dir, run, model, source, settings, device)
    typer.echo(f"wrote {out}")


def _check_flags(uniform: float | None, *training: float | None) -> None:
    """Refuse flags of the other mode, a missing --length and numbers out of range."""
    flags = ("--length", "--steps", "--lr", "--init-scale", "--batch-size", "--seed")
    typed = [  # --seed is taken in both modes (the uniform one draws nothing)
        flag
        for flag, value in zip(flags, training, strict=True)
        if value is not None and flag != "--seed"
    ]
    if uniform is not None:
        if typed:
            raise UserError(f"{typed[0]}: only applies to training head scales, not --uniform")
        _check_number("--uniform", uniform, 0.0, above=True)
        return
    length, _, lr, init_scale, _, _ = training
    if length is None:
        raise UserError(
            "--length: give the multiple of the training length to train head scales at "
            "(e.g. --length 4), or --uniform C for one factor"
        )
    _check_number("--length", length, 1.0)
    _check_number("--init-scale", init_scale, 1.0)
    _check_number("--lr", lr, 0.0, above=True)


def _check_number(flag: str, value: float | None, least: float, above: bool = False) -> None:
    """Refuse a typed value that is not finite or is below ``least`` (``above``: not above it)."""
    if value is None:
        return
    if not math.isfinite(value) or value < least or (above and value == least):
        bound = f"> {least:g}" if above else f">= {least:g}"
        raise UserError(f"{flag}: must be a finite number {bound}, got {value:g}")
