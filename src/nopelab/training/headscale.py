"""Wang et al.'s (2024) attention-logit scaling of a frozen language model, past its training
length: one scale for every head, or one learned per head ("HeadScale").

The attention of a NoPE model spreads out over the many more tokens a longer context holds, and
its perplexity breaks shortly past the training length. Scaling the logits of the frozen model
(``ModelConfig.logit_scale``, a factor on the usual 1/sqrt(head_dim)) sharpens it again: Wang et
al. find the best uniform factor near 1.2 at 2x the training length, 1.5 at 4x and 1.8 at 8x, and
fit 1 + 0.3973 ln F at F times it. ``head_scales`` gives each head its own factor, trained here
by language-model loss on windows of the target length while every other weight stays frozen,
and kept >= 1 (their constraint λ >= 1/sqrt(head_dim)).

A rescaled run directory is a training run like any other (``config.json``, the checkpoint,
``tokenizer.json``) plus ``headscale.json``: how it was made, the loss of every step and the
scales of every layer and head.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from nopelab.encodings import encoding
from nopelab.errors import RunFailed, UserError
from nopelab.limits import check_head_scales
from nopelab.models.transformer import Block, Transformer
from nopelab.runtime.progress import stage
from nopelab.runtime.rundir import environment, write_json
from nopelab.training.checkpoint import OPTIMIZER_FILE, load_optimizer, read_state, save_checkpoint
from nopelab.training.run import CONFIG_FILE, TrainRun, read_run
from nopelab.training.sources import IGNORE, Autocast, TextSource
from nopelab.training.train import autocast_for, make_optimizer, step_seed

# Wang et al.'s fit: the best uniform factor at F x the training length is 1 + FIT_SLOPE ln F
# (Wang et al. 2024, Appendix B, Figure 7; experiments/wang2024/published.toml [fit], which a
# test keeps equal to this): a method constant, where HeadScale starts, not a result
FIT_SLOPE = 0.3973
RECORD_FILE = "headscale.json"
MIN_SCALE = 1.0  # a head's factor never drops below 1: λ >= 1/sqrt(head_dim)


def fitted_scale(factor: float) -> float:
    """Wang et al.'s fit of the best uniform logit factor at ``factor`` x the training length."""
    return 1 + FIT_SLOPE * math.log(factor)


@dataclass(frozen=True)
class HeadScaleTraining:
    """How to train the head scales: windows of ``length`` tokens (``length_factor`` x the
    training length), ``batch_size`` a step."""

    length_factor: float
    length: int
    steps: int
    lr: float
    init_scale: float
    batch_size: int
    seed: int


def rescaled(model: Transformer, logit_scale: float, head_scales: bool) -> Transformer:
    """A copy of ``model`` whose logits are scaled by ``logit_scale`` / sqrt(head_dim), or with
    ``head_scales`` by a learnable factor per head that starts there; any scales ``model`` had
    are replaced, every other weight is copied."""
    cfg = dataclasses.replace(model.cfg, logit_scale=logit_scale, head_scales=head_scales)
    copy = Transformer(cfg)
    weights = {k: w for k, w in model.state_dict().items() if not k.endswith(".head_scale")}
    missing, unexpected = copy.load_state_dict(weights, strict=False)
    if unexpected or any(not key.endswith(".head_scale") for key in missing):
        raise ValueError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    return copy.to(next(model.parameters()).device).eval()


def head_scale_parameters(model: Transformer) -> list[nn.Parameter]:
    """Every layer's learnable ``head_scale`` (a model with ``head_scales`` on)."""
    scales = [cast(Block, block).attn.head_scale for block in model.blocks]
    assert all(scale is not None for scale in scales)  # the caller turned head_scales on
    return cast(list[nn.Parameter], scales)


def train_head_scales(
    model: Transformer,
    source: TextSource,
    settings: HeadScaleTraining,
    device: torch.device,
    autocast: Autocast,
) -> tuple[list[float], torch.optim.Optimizer]:
    """Train only the head scales of ``model`` (in place) by language-model loss on training
    windows of ``settings.length`` tokens, with AdamW without weight decay; every scale is
    clamped to >= 1 after each step. Returns the loss of every step and the optimiser."""
    scales = head_scale_parameters(model)
    model.requires_grad_(False).eval()  # frozen, and no dropout: the model as it is used
    for scale in scales:
        scale.requires_grad_(True)
    optimizer = torch.optim.AdamW(scales, lr=settings.lr, weight_decay=0.0)
    stage(
        f"headscale: training {len(scales)} x {len(scales[0])} head scales on windows of "
        f"{settings.length} tokens ({settings.length_factor:g}x the training length)"
    )
    losses = []
    for step in range(settings.steps):
        generator = torch.Generator().manual_seed(step_seed(settings.seed, step))
        idx, targets = source.batch(settings.batch_size, settings.length, generator)
        with autocast():
            logits = model(idx.to(device))
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), targets.to(device).flatten(), ignore_index=IGNORE
        )
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RunFailed(f"headscale: step {step + 1}: the loss is {value:g}; lower --lr")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for scale in scales:
                scale.clamp_(min=MIN_SCALE)
        losses.append(value)
        _report(step + 1, settings.steps, value)
    return losses, optimizer


def _report(done: int, steps: int, loss: float) -> None:
    """A progress line at every tenth of the steps."""
    if 10 * done // steps > 10 * (done - 1) // steps:
        stage(f"headscale step {done}/{steps}: loss {loss:.4g}")


def scales_by_layer(model: Transformer) -> list[list[float]]:
    """Every layer's per-head factors on the 1/sqrt(head_dim) scale of the logits."""
    return [cast(Block, block).attn.logit_scales().tolist() for block in model.blocks]


def source_optimizer(run_dir: Path, run: TrainRun, model: Transformer) -> torch.optim.Optimizer:
    """The optimiser state of ``run_dir``'s checkpoint, for ``model``: a copy of its model with
    the same parameters (a uniform rescaling)."""
    optimizer = make_optimizer(model, run.train, torch.device("cpu"))
    state = read_state(run_dir)
    load_optimizer(optimizer, run_dir / OPTIMIZER_FILE, state.get("optimizer_sha256"))
    return optimizer


def check_length(run: TrainRun, source: TextSource, factor: float) -> int:
    """The tokens of a window ``factor`` x the training length, or a one-line error naming
    ``--length`` when a learned position table or the training text cannot take it."""
    tokens = round(factor * run.train.seq_len)
    cfg = run.model
    if encoding(cfg.pos_encoding).table and tokens > cfg.max_seq_len:
        raise UserError(
            f"--length: {factor:g}x is {tokens} tokens, beyond the learned position table of "
            f"{cfg.max_seq_len}"
        )
    if len(source.stream.train) < tokens + 1:
        raise UserError(
            f"--length: {factor:g}x is {tokens} tokens; the training text has "
            f"{len(source.stream.train)}, too few for one window and its next token"
        )
    return tokens


def read_text_run(run_dir: Path) -> TrainRun:
    """The settings of a run of a language model trained on text, without per-head scales."""
    run = read_run(run_dir)
    if run.task is not None:
        raise UserError(
            f"run: headscale needs a language model trained on text; {run_dir} was trained on "
            f"the task {run.task.name}"
        )
    if run.model.head_scales:
        raise UserError(
            f"run: {run_dir} has per-head scales already; rescale the run it was made from"
        )
    if run.corpus is not None and run.corpus.objective == "masked":
        raise UserError(f"run: headscale needs a causal language model; {run_dir} is a masked LM")
    return run


def head_scale_settings(
    run: TrainRun,
    source: TextSource,
    length: float,
    steps: int | None,
    lr: float | None,
    init_scale: float | None,
    batch_size: int | None,
    seed: int | None,
) -> HeadScaleTraining:
    """The head-scale training settings, defaults filled in, checked against the run (the
    command checks each value's range first)."""
    settings = HeadScaleTraining(
        length_factor=length,
        length=check_length(run, source, length),
        steps=200 if steps is None else steps,
        lr=0.05 if lr is None else lr,
        init_scale=fitted_scale(length) if init_scale is None else init_scale,
        batch_size=4 if batch_size is None else batch_size,
        seed=0 if seed is None else seed,
    )
    check_head_scales(run.model, settings.batch_size, settings.length)
    return settings


def head_scale_run(
    out: Path,
    run_dir: Path,
    run: TrainRun,
    model: Transformer,
    source: TextSource,
    settings: HeadScaleTraining,
    device: torch.device,
) -> None:
    """Train head scales on ``model``, ``run_dir``'s trained model, and write the run."""
    scaled = rescaled(model.to(device), settings.init_scale, head_scales=True)
    start = time.perf_counter()
    autocast = autocast_for(run.train, device)
    losses, optimizer = train_head_scales(scaled, source, settings, device, autocast)
    record = {
        "mode": "head_scales",
        "source": str(run_dir),
        "train_len": run.train.seq_len,
        **dataclasses.asdict(settings),
        "device": str(device),
        "seconds": time.perf_counter() - start,
        "loss": losses,
    }
    write_run(out, run_dir, run, scaled.cpu(), optimizer, source, record)


def uniform_run(
    out: Path, run_dir: Path, run: TrainRun, model: Transformer, source: TextSource, scale: float
) -> None:
    """Write ``model``, ``run_dir``'s trained model, with every head's logits scaled by
    ``scale``; its optimiser state is the run's, so ``nopelab train --resume`` can go on."""
    scaled = rescaled(model, scale, head_scales=False)
    record = {"mode": "uniform", "source": str(run_dir), "logit_scale": scale}
    write_run(out, run_dir, run, scaled, source_optimizer(run_dir, run, scaled), source, record)


def write_run(
    out: Path,
    run_dir: Path,
    run: TrainRun,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    source: TextSource,
    record: dict[str, Any],
) -> None:
    """Write ``model`` into ``out`` as a training run of ``run_dir``'s settings (``run``) with
    the model's scales: ``config.json``, the checkpoint (the step and time ``run_dir`` trained),
    ``tokenizer.json``, and ``headscale.json`` (``record`` and the scales of every head)."""
    rescaled_run = dataclasses.replace(run, model=model.cfg)
    data = {"sha256": source.fingerprint}
    write_json(
        out / CONFIG_FILE, {**rescaled_run.to_dict(), "data": data, "environment": environment()}
    )
    source.save_tokenizer(out)
    trained = read_state(run_dir)
    state = {"step": trained["step"], "train_seconds": trained.get("train_seconds", 0.0)}
    save_checkpoint(out, model, optimizer, state)
    write_json(out / RECORD_FILE, {**record, "scales": scales_by_layer(model)})
