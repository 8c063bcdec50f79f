"""The ``nopelab`` command line: ``analyze`` a model, ``reproduce`` a paper's results."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure where transformers without positional encodings keep position.",
)

MODEL = "Model"
ANALYSIS = "Analysis"
OUTPUT = "Output"


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise UserError(
            f"{flag}: expected comma-separated layer numbers like 2,4, got {text!r}"
        ) from None


def _words(text: str | None) -> tuple[str, ...] | None:
    return (
        None if text is None else tuple(part for part in text.replace(" ", "").split(",") if part)
    )


@app.command()
def analyze(
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML, YAML or JSON file with [model] and [analysis] tables; flags override it.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    pos_encoding: Annotated[
        str | None,
        typer.Option(help="none | learned | sinusoidal | rope | alibi", rich_help_panel=MODEL),
    ] = None,
    nope_layers: Annotated[
        str | None,
        typer.Option(help="1-based layers without rope/alibi, e.g. 2,4", rich_help_panel=MODEL),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help="Number of blocks [6]", rich_help_panel=MODEL)
    ] = None,
    heads: Annotated[
        int | None, typer.Option(help="Attention heads [6]", rich_help_panel=MODEL)
    ] = None,
    d_model: Annotated[
        int | None, typer.Option(help="Hidden size [384]", rich_help_panel=MODEL)
    ] = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Vocabulary for --input tokens [96]", rich_help_panel=MODEL)
    ] = None,
    max_seq_len: Annotated[
        int | None, typer.Option(help="Learned position table size [256]", rich_help_panel=MODEL)
    ] = None,
    bidirectional: Annotated[
        bool | None,
        typer.Option(
            "--bidirectional/--causal", help="Attention mask [causal]", rich_help_panel=MODEL
        ),
    ] = None,
    norm: Annotated[
        str | None, typer.Option(help="layernorm | rmsnorm", rich_help_panel=MODEL)
    ] = None,
    norm_position: Annotated[
        str | None, typer.Option(help="pre | post", rich_help_panel=MODEL)
    ] = None,
    bias: Annotated[
        bool | None,
        typer.Option(
            "--bias/--no-bias", help="Biases in linear layers and norms [no]", rich_help_panel=MODEL
        ),
    ] = None,
    init: Annotated[
        str | None,
        typer.Option(
            help="normal | gpt2 | xavier_normal | xavier_uniform | kaiming_uniform | uniform | pytorch",
            rich_help_panel=MODEL,
        ),
    ] = None,
    init_std: Annotated[
        float | None,
        typer.Option(
            help="σ of normal/gpt2 init, half-width a of uniform [0.02]", rich_help_panel=MODEL
        ),
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Sequence length [256]", rich_help_panel=ANALYSIS)
    ] = None,
    samples: Annotated[
        int | None, typer.Option(help="Number of sequences [64]", rich_help_panel=ANALYSIS)
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Sequences per forward pass [8]", rich_help_panel=ANALYSIS)
    ] = None,
    input: Annotated[
        str | None,
        typer.Option(
            help="random (N(0,1) vectors) | tokens (uniform ids)", rich_help_panel=ANALYSIS
        ),
    ] = None,
    sites: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: embed,attn_out,resid_mid,mlp_out,resid_post [all]",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    attn_entropy: Annotated[
        bool | None,
        typer.Option(
            "--attn-entropy/--no-attn-entropy",
            help="Also record attention entropy and logit spread [no]",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float32 | bfloat16 | float16", rich_help_panel=ANALYSIS)
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed for weights and inputs [0]", rich_help_panel=ANALYSIS)
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda[:N] [auto]", rich_help_panel=ANALYSIS)
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Run directory [runs/analyze-TIMESTAMP]", rich_help_panel=OUTPUT),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Replace a non-empty --out", rich_help_panel=OUTPUT)
    ] = False,
) -> None:
    """Analyse a randomly initialised model: variance, norms, cosine similarity, adjacency scores."""
    from nopelab.analysis import analyze_model, build_model, resolve_device
    from nopelab.config import RunConfig, read_config_file
    from nopelab.report import write_analysis
    from nopelab.rundir import default_out, staged_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    model_flags = {
        "pos_encoding": pos_encoding,
        "nope_layers": _ints(nope_layers, "--nope-layers"),
        "n_layers": layers,
        "n_heads": heads,
        "d_model": d_model,
        "vocab_size": vocab_size,
        "max_seq_len": max_seq_len,
        "bidirectional": bidirectional,
        "norm": norm,
        "norm_position": norm_position,
        "bias": bias,
        "init": init,
        "init_std": init_std,
    }
    analysis_flags = {
        "seq_len": seq_len,
        "samples": samples,
        "batch_size": batch_size,
        "input": input,
        "sites": _words(sites),
        "attn_entropy": attn_entropy,
        "dtype": dtype,
        "seed": seed,
        "device": device,
    }
    for section, flags in (("model", model_flags), ("analysis", analysis_flags)):
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise UserError(f"--config: [{section}] must be a table of settings")
        table.update({k: v for k, v in flags.items() if v is not None})
    cfg = RunConfig.from_dict(data)
    resolve_device(cfg.analysis.device)
    out = out or default_out("analyze")
    with staged_run(out, force) as staging:
        start = time.perf_counter()
        result = analyze_model(build_model(cfg.model, cfg.analysis.seed), cfg.analysis)
        write_analysis(staging, cfg, result, time.perf_counter() - start)
    typer.echo(f"wrote {out}")


@app.command()
def reproduce(
    paper: Annotated[str, typer.Argument(help="chi2023 | zuo2025")],
    part: Annotated[str | None, typer.Option(help="zuo2025: random-init")] = None,
    scale: Annotated[
        str, typer.Option(help="smoke | small | paper (paper: full sizes, GPU advised)")
    ] = "small",
    seed: Annotated[int, typer.Option(help="Seed for weights and inputs")] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:N]")] = "auto",
    out: Annotated[
        Path | None, typer.Option(help="Run directory [runs/PAPER-SCALE-TIMESTAMP]")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
) -> None:
    """Reproduce a paper's results at a chosen scale, with figures and a markdown summary."""
    from nopelab.experiments import EXPERIMENTS
    from nopelab.rundir import default_out, staged_run

    if paper not in EXPERIMENTS:
        raise UserError(f"paper: unknown {paper!r}; allowed: {', '.join(EXPERIMENTS)}")
    experiment = EXPERIMENTS[paper]
    part = part or experiment.default_part
    if part not in experiment.parts:
        raise UserError(
            f"--part: {paper} has no part {part!r}; allowed: {', '.join(experiment.parts)}"
        )
    if scale not in ("smoke", "small", "paper"):
        raise UserError(f"--scale: unknown {scale!r}; allowed: smoke, small, paper")
    runner = experiment.parts[part]
    out = out or default_out(f"{paper}-{part}-{scale}")
    settings = runner.settings(scale, seed, device)  # validates before any output exists
    with staged_run(out, force) as staging:
        runner.run(settings, staging)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2."""
    try:
        app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"nopelab: error: {exc}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("nopelab: aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors from the parser (unknown flag, bad int)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message:  # empty when the parser has already printed the help instead
            typer.echo(f"nopelab: error: {message}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        typer.echo("nopelab: interrupted; nothing was written", err=True)
        sys.exit(130)
