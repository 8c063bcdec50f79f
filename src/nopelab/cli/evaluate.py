"""``nopelab evaluate``: held-out loss by position, and perplexity past the training length."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from nopelab.cli import resolve
from nopelab.cli.app import ANALYSIS, HF, Force, Out, app
from nopelab.cli.options import Given, Group, with_options
from nopelab.config import AnalysisConfig, EvaluateConfig, HFConfig
from nopelab.errors import UserError

EVALUATION = "Evaluation"


@app.command()
@with_options(
    Group("evaluate", EvaluateConfig, EVALUATION),
    Group("analysis", AnalysisConfig, ANALYSIS, only=("batch_size", "device")),
    Group("hf", HFConfig, HF, only=("text", "train_len", "trust_remote_code")),
)
def evaluate(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A training run directory of a language model trained on text, or hf:PATH, "
            "a Hugging Face model folder or .gguf file"
        ),
    ],
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
    from nopelab.measure.shuffle import prefix_shuffle
    from nopelab.runtime.device import resolve_device
    from nopelab.runtime.progress import stage
    from nopelab.runtime.rundir import check_out, default_out, staged_run

    ev = EvaluateConfig(**given.section("evaluate"))
    hf_settings = HFConfig(**given.section("hf"))
    analysis = AnalysisConfig(**given.section("analysis"))
    device = resolve_device(analysis.device)
    out = out or default_out(f"evaluate-{Path(str(run_dir)).name}")
    check_out(out, force, resolve.inputs(run_dir))
    hf = resolve.hf_path(run_dir)
    asked = {"factors": ev.lengths, "windows": ev.windows, "batch_size": analysis.batch_size}
    if hf is None:
        if typed := given.flags("hf"):
            raise UserError(f"{typed[0]}: only applies to an hf:PATH model")
        target = native_target(run_dir, asked)
    else:
        target = hf_target(
            hf, hf_settings.text, hf_settings.train_len, hf_settings.trust_remote_code, asked
        )
    if ev.shuffle and ev.shuffle[-1] >= target.train_len:
        raise UserError(
            f"--shuffle: a prefix of {ev.shuffle[-1]} tokens is beyond the sequence (windows of "
            f"the training length, {target.train_len} tokens); use 0..{target.train_len - 1}"
        )
    model = target.model.to(device).eval()
    settings = {
        "source": str(run_dir),
        "train_len": target.train_len,
        "lengths": list(ev.lengths),
        "windows": ev.windows,
        "buckets": ev.buckets,
        "seed": ev.seed,
        "batch_size": analysis.batch_size,
        "device": str(device),
        **({"text": hf_settings.text} if hf else {}),
        **({"shuffle": list(ev.shuffle)} if ev.shuffle else {}),
    }
    with staged_run(out, force, resolve.inputs(run_dir), command="evaluate") as staging:
        start, losses = time.perf_counter(), {}
        for plan in target.plan:
            stage(f"evaluate: {plan.factor}x ({plan.length} tokens), {plan.windows} windows")
            pairs = chosen_windows(target.stream, plan.length, plan.windows, ev.seed)
            losses[plan] = position_loss(model, pairs, plan.length, plan.batch_size, device)
        shuffle = None
        if ev.shuffle:
            stage(f"evaluate: prefix shuffle at 1x, k = {','.join(map(str, ev.shuffle))}")
            windows = list(chosen_windows(target.stream, target.train_len, ev.windows, ev.seed))
            rows = prefix_shuffle(model, windows, ev.shuffle, analysis.batch_size, device, ev.seed)
            shuffle = pd.DataFrame(rows)
        seconds = time.perf_counter() - start
        stage("evaluate: writing tables, figures and summary")
        result = result_tables(losses, ev.buckets, shuffle)
        write_result(staging, result, settings, resolve.title(run_dir), seconds)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")
