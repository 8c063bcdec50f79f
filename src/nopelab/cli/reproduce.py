"""``nopelab reproduce``: a paper's results at a chosen scale."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.cli import resolve
from nopelab.cli.app import app
from nopelab.errors import UserError


@app.command()
def reproduce(
    paper: Annotated[
        str,
        typer.Argument(
            help="chi2023 | zuo2025 | haviv2022 | kazemnejad2023 | wang2024 | real-model"
        ),
    ],
    part: Annotated[
        str | None,
        typer.Option(
            help="chi2023: random-init | pretrained | probe-study (probes of the random model "
            "over inputs, sites, probes and training sequences); zuo2025: random-init | trained | probes | "
            "mastery (the trained part's models at three seeds, steps to mastery); "
            "haviv2022: pretrained | sizes (five encodings at three sizes, the gap to NoPE); "
            "kazemnejad2023: tasks (five encodings on tasks, accuracy at every length to 3x "
            "the trained ones); "
            "wang2024: lengths (NoPE and RoPE past the training length, the logit-scale fixes); "
            "real-model: smollm2"
        ),
    ] = None,
    scale: Annotated[
        str,
        typer.Option(
            help="smoke | small | medium (zuo2025 trained and probes: Zuo's task lengths; "
            "the language models of chi2023 pretrained and haviv2022: 18 M "
            "tokens per model, 12 M for haviv2022 sizes) | paper (full sizes, GPU advised)"
        ),
    ] = "small",
    seed: Annotated[int, typer.Option(help="Seed for weights and inputs")] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:N]")] = "auto",
    out: Annotated[
        Path | None, typer.Option(help="Run directory \\[runs/PAPER-SCALE-TIMESTAMP]")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue an interrupted run in --out (the parts with several models: all but "
            "chi2023 random-init and real-model): finished models are kept, an interrupted one "
            "continues from its checkpoint"
        ),
    ] = False,
    models: Annotated[
        Path | None,
        typer.Option(
            help="zuo2025 probes: take the NoPE models from this finished `--part trained` run "
            "(same --scale, --seed, --device) instead of training them again"
        ),
    ] = None,
    samples: Annotated[
        str | None,
        typer.Option(
            help="chi2023 probe-study: counts of training sequences to compare, increasing, "
            "e.g. 32,256,1024 \\[the scale's]"
        ),
    ] = None,
    sizes: Annotated[
        str | None,
        typer.Option(
            help="haviv2022 sizes: model sizes D_MODELxLAYERS or D_MODELxLAYERSxHEADS (2 heads "
            "unless given), smallest first, e.g. 24x2,48x2,80x3x4 \\[the scale's]"
        ),
    ] = None,
) -> None:
    """Reproduce a paper's results at a chosen scale, with figures and a markdown summary."""
    from nopelab.experiments import EXPERIMENTS, taking, with_reuse
    from nopelab.runtime.rundir import check_resume, default_out, resumable_run, staged_run

    if paper not in EXPERIMENTS:
        raise UserError(f"paper: unknown {paper!r}; allowed: {', '.join(EXPERIMENTS)}")
    experiment = EXPERIMENTS[paper]
    part = part or experiment.default_part
    if part not in experiment.parts:
        raise UserError(
            f"--part: {paper} has no part {part!r}; allowed: {', '.join(experiment.parts)}"
        )
    runner = experiment.parts[part]
    if scale not in runner.scales:
        raise UserError(f"--scale: unknown {scale!r}; allowed: {', '.join(runner.scales)}")
    if resume and not runner.resumable:
        resumable = [
            f"{name} --part {p}" for name, e in EXPERIMENTS.items() for p, r in e.parts.items()
            if r.resumable
        ]  # fmt: skip
        raise UserError(
            f"--resume: {paper} --part {part} cannot be resumed; allowed for "
            + ", ".join(resumable)
        )
    check_resume(resume, force, out)
    out = out or default_out(f"{paper}-{part}-{scale}")
    from nopelab.runtime.device import resolve_device

    resolve_device(device)
    options: dict[str, Any] = {}
    if samples is not None:
        options["samples"] = _counts("--samples", samples)
    if sizes is not None:
        options["sizes"] = _sizes("--sizes", sizes)
    for name in options:
        if name not in runner.options:
            raise UserError(f"--{name}: only for {', '.join(taking(name))}")
    settings = runner.settings(scale, seed, device, **options)  # validates before any output
    if models is not None:
        if runner.reuse_models is None:
            raise UserError(f"--models: only for {', '.join(with_reuse())}")
        settings = runner.reuse_models(settings, models)
    if not runner.resumable:
        with staged_run(out, force, (), command="reproduce") as staging:
            runner.run(settings, staging)
        typer.echo(f"wrote {out}; see {out / 'summary.md'}")
        return
    marker: dict[str, object] = {
        "paper": paper, "part": part, "scale": scale, "seed": seed, "device": device, **options
    }  # fmt: skip
    if models is not None:
        marker["models"] = str(settings.models)
    with resumable_run(out, marker, resume, force, resolve.inputs(models)) as folder:
        try:
            runner.run(settings, folder)
        except KeyboardInterrupt:
            again = shlex.join(
                [
                    "nopelab",
                    "reproduce",
                    paper,
                    "--part",
                    part,
                    "--scale",
                    scale,
                    "--seed",
                    str(seed),
                    "--device",
                    device,
                    "--out",
                    str(out),
                    "--resume",
                    *(["--models", str(models)] if models is not None else []),
                    *(["--samples", samples] if samples is not None else []),
                    *(["--sizes", sizes] if sizes is not None else []),
                ]
            )
            typer.echo(
                f"nopelab: interrupted; finished models are kept: continue with {again}", err=True
            )
            sys.exit(130)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


def _counts(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers, e.g. ``32,256,1024``."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(
            f"{flag}: expected comma-separated whole numbers like 32,256,1024, got {text!r}"
        ) from None


def _sizes(flag: str, text: str) -> list[dict[str, int]]:
    """``24x2,80x3x4`` → model sizes (d_model, n_layers, n_heads; 2 heads unless given)."""
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            numbers = [int(n) for n in part.lower().split("x")]
        except ValueError:
            numbers = []
        if len(numbers) not in (2, 3) or min(numbers) < 1:
            raise UserError(
                f"{flag}: expected sizes like 24x2,48x2,80x3x4 (d_model x layers [x heads]), "
                f"got {part!r}"
            )
        d_model, n_layers, n_heads = (*numbers, 2)[:3]
        if d_model % n_heads:
            raise UserError(
                f"{flag}: {part}: d_model {d_model} is not divisible by {n_heads} heads"
            )
        sizes.append({"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads})
    return sizes
