"""``nopelab evaluate``: held-out loss by position, and perplexity past the training length."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli import resolve
from nopelab.cli.app import ANALYSIS, HF, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig, HFConfig, check_seed
from nopelab.errors import UserError

EVALUATION = "Evaluation"
ALLOWED = "comma-separated whole numbers >= 1 in increasing order (e.g. 1,2,4,8,16)"


@app.command()
@with_options(
    Group("analysis", AnalysisConfig, ANALYSIS, only=("batch_size", "device")),
    Group("hf", HFConfig, HF, only=("trust_remote_code",)),
)
def evaluate(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A training run directory of a language model trained on text, or hf:PATH, "
            "a Hugging Face model folder or .gguf file"
        ),
    ],
    lengths: Annotated[
        str,
        typer.Option(
            help="Comma-separated multiples of the training length to evaluate at",
            rich_help_panel=EVALUATION,
        ),
    ] = "1,2,4,8,16",
    windows: Annotated[
        int,
        typer.Option(
            min=1,
            help="Held-out windows per length (as many as the held-out text holds, up to this)",
            rich_help_panel=EVALUATION,
        ),
    ] = 8,
    buckets: Annotated[
        int,
        typer.Option(
            min=1, help="Log-spaced buckets of positions per length", rich_help_panel=EVALUATION
        ),
    ] = 32,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the choice of windows where the held-out text holds more than --windows",
            rich_help_panel=EVALUATION,
        ),
    ] = 0,
    text: Annotated[
        str,
        typer.Option(
            help="Held-out text: an embedded corpus's name (default, sotu; its held-out tail), "
            "a file or folder",
            rich_help_panel=HF,
        ),
    ] = "default",
    train_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The length the model was trained on \\[the config's max_position_embeddings]",
            show_default=False,
            rich_help_panel=HF,
        ),
    ] = None,
    out: Out = None,
    force: Force = False,
    *,
    given: Given,
) -> None:
    """Held-out loss by position and perplexity at multiples of the length a language model was
    trained on: a training run on text, or hf:PATH for a Hugging Face model."""
    from nopelab.hf.evaluate import hf_target
    from nopelab.measure.length import chosen_windows, position_loss, result_tables, write_result
    from nopelab.measure.length_target import native_target
    from nopelab.runtime.device import resolve_device
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import check_out, default_out, staged_run

    factors = parse_lengths(lengths)
    check_seed("--seed", seed)
    analysis = AnalysisConfig(**given.section("analysis"))
    device = resolve_device(analysis.device)
    out = out or default_out(f"evaluate-{Path(str(run_dir)).name}")
    check_out(out, force, resolve.inputs(run_dir))
    hf = resolve.hf_path(run_dir)
    asked = {"factors": factors, "windows": windows, "batch_size": analysis.batch_size}
    if hf is None:
        typed = given.flags("hf")
        typed[:0] = ["--train-len"] if train_len is not None else []
        typed[:0] = ["--text"] if text != "default" else []
        if typed:
            raise UserError(f"{typed[0]}: only applies to an hf:PATH model")
        target = native_target(run_dir, asked)
    else:
        trust = bool(given.section("hf").get("trust_remote_code"))
        target = hf_target(hf, text, train_len, trust, asked)
    model = target.model.to(device).eval()
    settings = {
        "source": str(run_dir),
        "train_len": target.train_len,
        "lengths": list(factors),
        "windows": windows,
        "buckets": buckets,
        "seed": seed,
        "batch_size": analysis.batch_size,
        "device": str(device),
        **({"text": text} if hf else {}),
    }
    with staged_run(out, force, resolve.inputs(run_dir), command="evaluate") as staging:
        start, losses = time.perf_counter(), {}
        for plan in target.plan:
            stage(f"evaluate: {plan.factor}x ({plan.length} tokens), {plan.windows} windows")
            pairs = chosen_windows(target.stream, plan.length, plan.windows, seed)
            losses[plan] = position_loss(model, pairs, plan.length, plan.batch_size, device)
        seconds = time.perf_counter() - start
        stage("evaluate: writing tables, figure and summary")
        result = result_tables(losses, buckets)
        write_result(staging, result, settings, resolve.title(run_dir), seconds)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``, or a one-line error naming ``--lengths``."""
    try:
        factors = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--lengths: expected {ALLOWED}; got {text!r}") from None
    if min(factors) < 1 or any(a >= b for a, b in itertools.pairwise(factors)):
        raise UserError(f"--lengths: expected {ALLOWED}; got {text!r}")
    return factors
