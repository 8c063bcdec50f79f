"""``nopelab reproduce``: a paper's results at a chosen scale."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli import resolve
from nopelab.cli.app import app
from nopelab.config import CORPUS_NAMES, MAX_SEED, TOKENIZERS, check_seed, embedded_names
from nopelab.errors import UserError
from nopelab.experiments import EXPERIMENTS, Part, named, parts, resumable, taking, with_reuse
from nopelab.training.task_config import LAYOUTS

SCALES = ("smoke", "small", "medium", "large", "paper")  # in --help's order


def _help() -> dict[str, str]:
    """The help of ``paper``, ``--part``, ``--scale`` and ``--resume``, from the registry."""

    def about(name: str, part: Part) -> str:
        return f"{name} ({part.about})" if part.about else name

    by_paper = (
        f"{paper}: " + " | ".join(about(n, p) for n, p in e.parts.items())
        for paper, e in EXPERIMENTS.items()
    )
    scales = {s for _, _, part in parts() for s in part.scales}
    at = {
        s: _compact([p for p in parts() if s in p[2].scales]) for s in ("medium", "large", "paper")
    }
    fixed = " and ".join(named([p for p in parts() if not p[2].resumable]))
    return {
        "paper": " | ".join(EXPERIMENTS),
        "part": "; ".join(by_paper),
        "scale": " | ".join(s for s in SCALES if s in scales)
        + ". smoke: a check in seconds; small (the default): a CPU's budget; medium (language "
        f"models trained on 12-18 M tokens, Zuo's task lengths, more seeds): {at['medium']}; "
        "large (language models near convergence: 59.7 M tokens of sotu+default, hours): "
        f"{at['large']}; "
        f"paper (the papers' sizes, GPU advised): {at['paper']}",
        "resume": f"Continue an interrupted run in --out (all parts but {fixed}): finished "
        "models are kept, an interrupted one continues from its checkpoint",
    }


def _scale_corpora() -> str:
    """The corpus the language-model parts train on unless --corpus names one: ``default``, and
    where a scale names its own, which and where (``sotu+default at large: chi2023 pretrained``)."""
    own: dict[tuple[str, str], list[tuple[str, str, Part]]] = {}
    for paper, name, part in parts():
        for scale in part.scales if "corpus" in part.options else ():
            if corpus := part.scale_table(scale).get("corpus"):
                own.setdefault((corpus, scale), []).append((paper, name, part))
    return "; ".join(
        ["default", *(f"{c} at --scale {s}: {_compact(found)}" for (c, s), found in own.items())]
    )


def _compact(found: list[tuple[str, str, Part]]) -> str:
    """Parts grouped by paper: ``chi2023 pretrained, zuo2025 trained/probes, wang2024``."""
    by_paper: dict[str, list[str]] = {}
    for paper, name, _ in found:
        by_paper.setdefault(paper, []).append(name)
    return ", ".join(
        paper if len(EXPERIMENTS[paper].parts) == 1 else f"{paper} {'/'.join(names)}"
        for paper, names in by_paper.items()
    )


HELP = _help()


@app.command()
def reproduce(
    paper: Annotated[str, typer.Argument(help=HELP["paper"])],
    part: Annotated[str | None, typer.Option(help=HELP["part"])] = None,
    scale: Annotated[str, typer.Option(help=HELP["scale"])] = "small",
    seed: Annotated[int, typer.Option(help="Seed for weights and inputs")] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:N]")] = "auto",
    out: Annotated[
        Path | None, typer.Option(help="Run directory \\[runs/PAPER-SCALE-TIMESTAMP]")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
    resume: Annotated[bool, typer.Option(help=HELP["resume"])] = False,
    models: Annotated[
        Path | None,
        typer.Option(
            help=f"{', '.join(with_reuse())}: take the NoPE models from this finished "
            "`--part trained` run (same --scale, --seed, --device) instead of training them again"
        ),
    ] = None,
    samples: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('samples'))}: counts of training sequences to compare, "
            "increasing, e.g. 32,256,1024 \\[the scale's]"
        ),
    ] = None,
    sizes: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('sizes'))}: model sizes D_MODELxLAYERS or "
            "D_MODELxLAYERSxHEADS (2 heads unless given), smallest first, e.g. "
            "24x2,48x2,80x3x4 \\[the scale's]"
        ),
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('corpus'))}: the embedded corpus the language models train "
            f"on: {CORPUS_NAMES}, or names joined by + (sotu+default) \\[{_scale_corpora()}]"
        ),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('layout'))}: the task models' rows: {' | '.join(LAYOUTS)} "
            "(windows: Zuo et al.'s 256-character windows of the shuffled lines) \\[the scale's]"
        ),
    ] = None,
    encodings: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('encodings'))}: the encodings to train, comma-separated, "
            "none among them, e.g. none,learned \\[all the part's]"
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(taking('tokenizer'))}: {' | '.join(TOKENIZERS)}: bytes, or a "
            "byte-level BPE trained on the corpus, with the scale's BPE sizes and budget "
            "\\[byte]"
        ),
    ] = None,
) -> None:
    """Reproduce a paper's results at a chosen scale, with figures and a markdown summary."""
    from nopelab.runtime import provenance
    from nopelab.runtime.rundir import (
        check_resume,
        default_out,
        resumable_run,
        staged_run,
        write_json,
    )

    check_seed("--seed", seed)
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
        raise UserError(
            f"--resume: {paper} --part {part} cannot be resumed; allowed for "
            + ", ".join(resumable())
        )
    if (count := runner.seed_count(scale)) > 1 and seed > MAX_SEED - (count - 1):
        raise UserError(
            f"--seed: {paper} --part {part} --scale {scale} uses seeds --seed to --seed + "
            f"{count - 1}: allowed 0..{MAX_SEED - (count - 1)}, got {seed}"
        )
    check_resume(resume, force, out)
    out = out or default_out(f"{paper}-{part}-{scale}")
    from nopelab.runtime.device import resolve_device

    resolve_device(device)
    typed = {  # as typed
        "samples": samples, "sizes": sizes, "corpus": corpus, "layout": layout,
        "encodings": encodings, "tokenizer": tokenizer,
    }  # fmt: skip
    parsers = {
        "samples": _counts, "sizes": _sizes, "corpus": _corpus,
        "layout": _one_of(LAYOUTS, "layout"), "encodings": _names,
        "tokenizer": _one_of(TOKENIZERS, "tokenizer"),
    }  # fmt: skip
    options = {k: parsers[k](f"--{k}", v) for k, v in typed.items() if v is not None}
    for name in options:
        if name not in runner.options:
            raise UserError(f"--{name}: only for {', '.join(taking(name))}")
    settings = runner.settings(scale, seed, device, **options)  # validates before any output
    if models is not None:
        if runner.reuse_models is None:
            raise UserError(f"--models: only for {', '.join(with_reuse())}")
        settings = runner.reuse_models(settings, models)
    given = {"part": part, "scale": scale, "seed": seed, "device": device, "out": out}
    given |= {"models": models, **typed}
    flags = [f for k, v in given.items() if v is not None for f in (f"--{k}", str(v))]
    command = shlex.join(["nopelab", "reproduce", paper, *flags])
    begun, start = provenance.start(), time.perf_counter()

    def write_record(folder: Path) -> None:
        """``run.json``: what made the run, on which machine, in how long."""
        seconds = time.perf_counter() - start
        run = provenance.record(command + (" --resume" if resume else ""), begun, seconds)
        write_json(folder / "run.json", run)

    if not runner.resumable:
        with staged_run(out, force, (), command="reproduce") as staging:
            runner.run(settings, staging)
            write_record(staging)
        typer.echo(f"wrote {out}; see {out / 'summary.md'}")
        return
    said = _said(runner, scale, seed, device, options)
    marker: dict[str, object] = {
        "paper": paper, "part": part, "scale": scale, "seed": seed, "device": device, **said
    }  # fmt: skip
    if models is not None:
        marker["models"] = str(settings.models)
    with resumable_run(out, marker, resume, force, resolve.inputs(models)) as folder:
        try:
            runner.run(settings, folder)
            write_record(folder)
        except KeyboardInterrupt:
            typer.echo(
                f"nopelab: interrupted; finished models are kept: continue with {command} --resume",
                err=True,
            )
            sys.exit(130)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


def _said(runner: Part, scale: str, seed: int, device: str, options: dict) -> dict:
    """The options that change the run: one whose leaving out gives the same models (the
    scale's own value, given or not) is left out of the run's marker, so that giving it or not
    is the same run on resume; each is judged beside the others (``--sizes`` equal to the
    byte scale's still changes a ``--tokenizer bpe`` run)."""
    try:
        given = runner.settings(scale, seed, device, **options)
        return {
            k: v
            for k, v in options.items()
            if runner.settings(scale, seed, device, **{o: w for o, w in options.items() if o != k})
            != given
        }
    except UserError:  # the scale's own values are refused here (e.g. too big for this machine)
        return options


def _counts(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers, e.g. ``32,256,1024``."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(
            f"{flag}: expected comma-separated whole numbers like 32,256,1024, got {text!r}"
        ) from None


def _one_of(allowed: tuple[str, ...], what: str) -> Callable[[str, str], str]:
    """A parser of a name from ``allowed`` (a ``what``: layout, tokenizer)."""

    def parse(flag: str, text: str) -> str:
        if text not in allowed:
            raise UserError(f"{flag}: unknown {what} {text!r}; allowed: {', '.join(allowed)}")
        return text

    return parse


def _names(flag: str, text: str) -> tuple[str, ...]:
    """Comma-separated names, each once, e.g. ``none,learned`` (the part checks which), sorted:
    the same set typed in another order is the same run (``--resume``)."""
    names = [part.strip() for part in text.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise UserError(
            f"{flag}: expected distinct comma-separated names like none,learned, got {text!r}"
        )
    return tuple(sorted(names))


def _corpus(flag: str, text: str) -> str:
    """An embedded corpus's name, or names joined by ``+``: what a reproduction trains on."""
    if embedded_names(text, flag) is None:  # raises for an unknown or repeated name
        raise UserError(
            f"{flag}: {text!r} is not an embedded corpus; allowed: {CORPUS_NAMES}, or names "
            "joined by + (e.g. sotu+default)"
        )
    return text


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
