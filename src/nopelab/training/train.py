"""Train a model on a synthetic task or on text: AdamW, warm-up and cosine decay, checkpoints,
exact resume, and data parallelism through ``torchrun``.

Every step's batch comes from a generator seeded by (seed, step), and so does its dropout, so a
run resumed from a checkpoint retraces the loss curve of an uninterrupted one. Under torchrun
each process takes its slice of the same global batch and the loss is normalised by the global
number of target tokens, so N processes compute the update of one process on the whole batch.

A training run directory holds:

* ``config.json`` — model, train and task or corpus settings (plus versions);
* ``model.safetensors``, ``optimizer.safetensors``, ``trainer_state.json`` — the checkpoint;
* ``metrics.csv`` — one row per step: step, loss, lr, grad_norm, tokens_per_second;
* ``eval.csv`` — one row per evaluation: step and the source's metrics;
* ``tokenizer.json`` — text runs: the tokenizer, so the run can be analysed later;
* ``training.png`` — loss and evaluation curves;
* ``tensorboard/`` — with ``tensorboard=True``: the same rows as TensorBoard scalars
  (``train/<column>``, ``eval/<column>``), written at each checkpoint as the CSV files are;
* ``summary.json`` — written when training ends: ``final_eval`` (task: ``accuracy`` on every
  test line; text: ``loss`` and ``perplexity``, also at 2x and 4x the training length, and
  with a BPE ``loss_per_byte``),
  ``steps`` trained, ``steps_to_target`` (the step at which a task run with ``stop_at`` reached
  it, else null), ``tokens_per_second``, ``threads`` (CPU threads per process: one for a step
  too small to split, :mod:`nopelab.runtime.threads`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nopelab.config import (
    TrainConfig,
    first_difference,
)
from nopelab.errors import ConfigError, RunFailed, UserError, first_line
from nopelab.limits import check_training, parameter_count
from nopelab.models.transformer import Transformer
from nopelab.plots import training_curves
from nopelab.runtime.device import resolve_device
from nopelab.runtime.progress import progress_bar, stage
from nopelab.runtime.rundir import (
    RUN_MARKER,
    check_out,
    check_path,
    check_resume,
    environment,
    locked,
    missing_folders,
    remove_empty,
    replace_atomically,
    staged_run,
    write_json,
)
from nopelab.runtime.threads import torch_threads, training_threads
from nopelab.training.checkpoint import (
    KEPT_FOLDER,
    MODEL_FILE,
    STATE_FILE,
    CheckpointError,
    load_checkpoint,
    read_state,
    save_checkpoint,
    settle_checkpoint,
)
from nopelab.training.run import CONFIG_FILE, TrainRun, rank, read_run, world_size
from nopelab.training.sources import IGNORE, Source, TextSource
from nopelab.training.trained import make_source

# ------------------------------------------------------------------------ processes


def _setup_processes(device_name: str) -> torch.device:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA) and pick this process's device."""
    device = resolve_device(device_name)
    if world_size() > 1 and not dist.is_initialized():
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# ------------------------------------------------------------------------ the loop pieces


def step_seed(seed: int, step: int) -> int:
    """A distinct, reproducible seed for each (seed, step)."""
    return (seed * 1_000_003 + step) % (2**63)


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices only (not on norms and biases).

    The fused kernel is used on CPU and CUDA (benchmarks/bench_train.py compares the two).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu")
    )


def autocast_for(cfg: TrainConfig, device: torch.device):
    """A factory of autocast contexts: bfloat16 on CUDA under ``auto``, none on the CPU."""
    use_bf16 = cfg.precision == "bfloat16" or (cfg.precision == "auto" and device.type == "cuda")
    if not use_bf16:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def _summary_writer_class() -> type:
    """TensorBoard's ``SummaryWriter``, or a clear error when the optional package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UserError(
            "--tensorboard: needs the tensorboard package: pip install 'nopelab[tensorboard]'"
        ) from None
    return SummaryWriter


class Log:
    """Rows kept in memory and added to a CSV file just before each checkpoint (the file is
    replaced whole, never left half-written); a resumed run cuts the rows past the checkpoint
    it starts from. ``writer``, a TensorBoard ``SummaryWriter``, gets the same rows as scalars
    under ``tag/<column>``."""

    def __init__(
        self,
        out: Path,
        name: str,
        keep_until: int | None = None,
        writer: Any = None,
        tag: str = "",
    ):
        self.path = out / name
        self.writer, self.tag = writer, tag
        self.rows: list[dict[str, Any]] = []
        if keep_until is not None and self.path.is_file():
            frame = self.check(self.path)
            kept = frame[frame["step"] <= keep_until]
            replace_atomically(self.path, lambda tmp: kept.to_csv(tmp, index=False))

    @staticmethod
    def check(path: Path) -> pd.DataFrame:
        """A log as written by a run (a table with whole step numbers), or a one-line error."""
        if not path.is_file():
            return pd.DataFrame({"step": []})
        try:
            frame = pd.read_csv(path)
        except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
            raise UserError(f"--resume: {path} cannot be read ({first_line(exc)})") from None
        if "step" in frame and frame.empty:  # the header alone: no rows before the checkpoint
            return frame.astype({"step": "int64"})
        if "step" not in frame or not pd.api.types.is_integer_dtype(frame["step"]):
            raise UserError(f"--resume: {path} has no column of whole step numbers")
        return frame

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        if not self.rows:
            return
        frame = pd.DataFrame(self.rows)

        def write(tmp: Path) -> None:  # the old rows and the new ones, moved into place whole
            header = not self.path.is_file() or self.path.stat().st_size == 0
            if not header:
                shutil.copyfile(self.path, tmp)
            frame.to_csv(tmp, mode="a", header=header, index=False)

        replace_atomically(self.path, write)
        if self.writer is not None:
            for row in self.rows:
                for column, value in row.items():
                    if column != "step":
                        self.writer.add_scalar(f"{self.tag}/{column}", value, row["step"])
            self.writer.flush()
        self.rows = []

    def read(self) -> pd.DataFrame:
        return pd.read_csv(self.path) if self.path.is_file() else pd.DataFrame()


# ------------------------------------------------------------------------ the run directory


def prepare_out(out: Path, resume: bool, force: bool, steps: int | None = None) -> bool:
    """Check ``out`` before any work; returns whether to resume from its checkpoint.

    ``steps``: the total a resumed run trains to; a finished run continues only to more steps
    than it was started with.
    """
    check_resume(resume, force, out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    holds_files = out.is_dir() and any(out.iterdir())
    if resume:
        if not holds_files:
            raise UserError(f"--resume: {out} holds no run to resume")
        read_state(out)  # fails clearly without a checkpoint
        stored = read_run(out)
        if stored.model.head_scales:  # its weights were frozen; its optimiser is the scales'
            raise UserError(
                f"--resume: {out} holds head scales trained on a frozen model by "
                "`nopelab headscale`; train the run it was made from further, then scale that "
                "again"
            )
        finished = (out / "summary.json").is_file()
        if finished and (steps is None or steps <= stored.train.steps):
            raise UserError(
                f"--resume: the run in {out} has already finished; pass a larger --steps to "
                "train it further"
            )
        return True
    if holds_files and not force:
        raise UserError(
            f"--out: {out} already holds files; pass --resume to continue a run or --force to replace it"
        )
    check_out(out, force)
    return False


def stopped_before_checkpoint(out: Path) -> bool:
    """Whether ``out`` holds a training run that was killed before its first checkpoint (its
    settings written, no checkpoint, no summary): such a folder holds nothing to keep."""
    return (
        (out / RUN_MARKER).is_file()
        and (out / CONFIG_FILE).is_file()
        and not (out / STATE_FILE).is_file()
        and not (out / "summary.json").is_file()
    )


# ------------------------------------------------------------------------ training


def check_objective(run: TrainRun) -> None:
    """A text run's attention fits what it learns: a causal LM masks the future (a bidirectional
    one would see the token it predicts), a masked LM is bidirectional (a causal one would be
    exported as a causal LM with a mask token)."""
    if run.corpus is None:
        return
    masked = run.corpus.objective == "masked"
    if run.model.bidirectional and not masked:
        raise ConfigError(
            "bidirectional",
            "a bidirectional model sees the next token it would predict; train it as a masked "
            "LM (--objective masked)",
        )
    if masked and not run.model.bidirectional:
        raise ConfigError("objective", "a masked LM attends both ways: add --bidirectional")


def train(
    run: TrainRun,
    out: Path,
    *,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    tensorboard: bool = False,
    label: str = "train",
    figures: bool = True,
) -> dict[str, Any] | None:
    """Train, checkpointing into ``out``; returns the summary (None when stopped early).

    Nothing lands in ``out`` before every check has passed; a new run that fails or is
    interrupted before its first checkpoint leaves nothing behind (not even parent folders it
    created). ``stop_after`` ends the run after that many steps without finishing it, as an
    interruption would (used to test resuming). ``tensorboard`` mirrors the logs to
    ``out/tensorboard``. ``label`` names the run in progress output (a bar on a terminal, else a
    line per evaluation). ``figures=False`` skips ``training.png`` (a sweep's cells).
    """
    check_training(run.model, run.train.batch_size, run.train.seq_len)
    check_objective(run)
    check_path(out)
    out = out.expanduser().absolute()
    summary_writer = _summary_writer_class() if tensorboard else None
    device = _setup_processes(run.train.device)
    main_process = rank() == 0
    if stopped_before_checkpoint(out):  # nothing to keep: start it again in place
        resume, force = False, True
    resume = prepare_out(out, resume, force, run.train.steps)
    if not resume and run.train.init_from is not None:
        check_init_from(run, out)
    created = missing_folders(out.parent) if main_process else []
    placed = False  # whether this run's folder is in place (so a failure removes it)
    try:
        if main_process:
            out.parent.mkdir(parents=True, exist_ok=True)
        with locked(out) if main_process else contextlib.nullcontext():
            if resume:
                stored = read_run(out)
                difference = _first_difference(stored, run)
                if difference is not None:
                    raise UserError(f"--resume: {difference}")
                at_step = read_state(out)["step"]
                if main_process and settle_checkpoint(out):
                    stage(
                        f"{label}: its last save was interrupted between files; resuming "
                        f"from the checkpoint before it (step {at_step})"
                    )
                if run.train.steps != stored.train.steps and run.train.steps < at_step:
                    raise UserError(
                        f"--steps: the checkpoint in {out} is at step {at_step}; allowed: "
                        f">= {at_step}, got {run.train.steps}"
                    )
                _check_state(out, run.train.steps)
            source = make_source(run, out if resume else None)
            if resume:
                _check_data(out, source)
                if main_process and run.train.steps != stored.train.steps:
                    # config.json records the new total (and keeps the device it started on);
                    # the run is unfinished until it reaches it
                    recorded = json.loads((out / CONFIG_FILE).read_text())
                    recorded["train"]["steps"] = run.train.steps
                    (out / "summary.json").unlink(missing_ok=True)
                    replace_atomically(out / CONFIG_FILE, lambda tmp: write_json(tmp, recorded))
            _barrier()
            if main_process and not resume:
                with staged_run(out, force, command="train") as staging:
                    config = {
                        **run.to_dict(),
                        "data": {"sha256": source.fingerprint},
                        "environment": environment(),
                    }
                    write_json(staging / CONFIG_FILE, config)
                    if isinstance(source, TextSource):
                        source.save_tokenizer(staging)
                placed = True
            _barrier()
            cfg = run.train
            small = training_threads(cfg.batch_size * cfg.seq_len, run.model.d_model)
            with torch_threads(small if device.type == "cpu" else None):
                return _train(
                    run, out, source, device, resume, progress, stop_after, summary_writer,
                    label, figures,
                )  # fmt: skip
    except BaseException:
        if placed and not (out / STATE_FILE).is_file():  # no checkpoint yet: nothing to keep
            shutil.rmtree(out, ignore_errors=True)
        remove_empty(created)
        raise


def check_init_from(run: TrainRun, out: Path) -> None:
    """``init_from`` must be another run's folder with a checkpoint of this very model."""
    if run.train.init_from is None:
        return
    source, out = Path(run.train.init_from).expanduser().resolve(), out.resolve()
    if source == out or out in source.parents or source in out.parents:
        raise UserError(
            f"--init-from: {source} and --out {out} overlap; a run's input is never its output"
        )
    if not (source / CONFIG_FILE).is_file() or not (source / STATE_FILE).is_file():
        raise UserError(f"--init-from: {source} holds no training run with a checkpoint")
    try:
        theirs = read_run(source).model
    except UserError as exc:
        raise UserError(f"--init-from: {exc}") from None
    difference = first_difference(
        {"model": dataclasses.asdict(theirs)}, {"model": dataclasses.asdict(run.model)}
    )
    if difference is not None:
        key, old, new = difference
        raise UserError(
            f"--init-from: {source} has {key}={old!r}, this run {new!r}; "
            "the model settings must be the same"
        )


def _check_state(out: Path, steps: int) -> None:
    """A resumed run's checkpoint state must be one this run could have written."""
    state = read_state(out)
    if not 0 <= state["step"] <= steps:
        raise UserError(
            f"--resume: {out / STATE_FILE} says step {state['step']}, outside 0..{steps}"
        )
    seconds = state.get("train_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise UserError(f"--resume: {out / STATE_FILE} has no valid train_seconds")
    for name in ("metrics.csv", "eval.csv"):
        Log.check(out / name)


def _check_data(out: Path, source: Source) -> None:
    """A resumed run must see the data it started on (a corpus file may have changed)."""
    data = json.loads((out / CONFIG_FILE).read_text()).get("data")
    recorded = data.get("sha256") if isinstance(data, dict) else None
    if recorded is not None and recorded != source.fingerprint:
        raise UserError(
            f"--resume: the training data differ from those the run started on (sha256 "
            f"{recorded[:12]}… then, {source.fingerprint[:12]}… now); was the corpus changed?"
        )


def _train(
    run: TrainRun,
    out: Path,
    source: Source,
    device: torch.device,
    resume: bool,
    progress: bool,
    stop_after: int | None,
    summary_writer: type | None,
    label: str,
    figures: bool,
) -> dict[str, Any] | None:
    """The loop: steps, an evaluation every ``eval_every``, a checkpoint every
    ``checkpoint_every``, until ``steps``, ``stop_after`` or the ``stop_at`` target."""
    cfg = run.train
    trainer = Trainer.start(run, out, source, device, resume, summary_writer, label, figures)
    start = trainer.start_step
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    final_eval: dict[str, float] = {}
    reached = resume and _reached_before(trainer.evals, cfg, start)  # stopped before its summary
    if reached:
        end = start
    with progress_bar(transient=False) as bar:
        shown = progress and trainer.main_process
        task = bar.add_task(label, total=cfg.steps, completed=start, visible=shown)
        trainer.lines = shown and bar.disable  # a log or a pipe: lines, no bar
        if trainer.lines and start < end:
            stage(f"{label}: training steps {start + 1}-{end} of {cfg.steps}")
        for step in range(start, end):
            loss = trainer.step(step)
            done = step + 1
            bar.update(task, advance=1, description=f"{label} loss {loss:.3f}")
            final = done == cfg.steps
            if done % cfg.eval_every == 0 or final:
                result = trainer.evaluate(done, loss, final)
                reached = _agree(_reaches(cfg, result), device)
                if reached:  # the checkpoint below is the last one
                    final, end = True, done
                if final and trainer.main_process:
                    final_eval = result
                _barrier()
            else:
                trainer.report(done, loss)
            if done % cfg.checkpoint_every == 0 or final or done == end:
                trainer.checkpoint(done)
            if reached:
                break
    trainer.close()
    if end < cfg.steps and not reached:
        return None
    return trainer.finish(end, reached, final_eval)


@dataclass
class Trainer:
    """One process's training state: the model, its optimiser, the logs and the clocks."""

    run: TrainRun
    out: Path
    source: Source
    device: torch.device
    label: str
    model: Transformer
    train_model: nn.Module  # the model as trained: wrapped by DDP or compiled
    optimizer: torch.optim.Optimizer
    autocast: Any
    writer: Any  # a TensorBoard SummaryWriter, or None
    metrics: Log
    evals: Log
    start_step: int
    train_seconds: float  # before this segment (a resumed run's earlier segments)
    segment_seconds: float = 0.0
    tokens: int = 0
    lines: bool = False  # progress as lines (not a terminal)
    figures: bool = True  # draw training.png at the end
    last_line: float = field(default_factory=time.monotonic)

    @property
    def main_process(self) -> bool:
        return rank() == 0

    @classmethod
    def start(
        cls,
        run: TrainRun,
        out: Path,
        source: Source,
        device: torch.device,
        resume: bool,
        summary_writer: type | None,
        label: str,
        figures: bool = True,
    ) -> Trainer:
        """Build the model (seeded), its optimiser, and the state a resumed run left;
        ``figures``: draw training.png at the end."""
        cfg = run.train
        torch.manual_seed(cfg.seed)
        model = Transformer(run.model).to(device)
        optimizer = make_optimizer(model, cfg, device)
        state: dict[str, Any] = {"step": 0, "train_seconds": 0.0}
        if resume:
            state = load_checkpoint(out, model, optimizer)
        if not resume and cfg.init_from is not None:  # fine-tuning: the weights of another run
            try:
                load_checkpoint(Path(cfg.init_from).expanduser(), model)
            except CheckpointError as exc:
                raise UserError(f"--init-from: {exc}") from None
        start = int(state["step"])
        train_model: nn.Module = model
        if world_size() > 1:
            train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        if cfg.compile:
            train_model = torch.compile(train_model)  # type: ignore[assignment]
        main_process = rank() == 0
        writer = None
        if summary_writer is not None and main_process:
            writer = summary_writer(log_dir=str(out / "tensorboard"), purge_step=start + 1)
        keep = start if main_process else None
        model.train()
        return cls(
            run=run,
            out=out,
            source=source,
            device=device,
            label=label,
            figures=figures,
            model=model,
            train_model=train_model,
            optimizer=optimizer,
            autocast=autocast_for(cfg, device),
            writer=writer,
            metrics=Log(out, "metrics.csv", keep, writer, "train"),
            evals=Log(out, "eval.csv", keep, writer, "eval"),
            start_step=start,
            train_seconds=float(state["train_seconds"]),
        )

    def step(self, step: int) -> float:
        """One optimiser step on the batch of ``step`` (0-based); returns the loss."""
        cfg = self.run.train
        tick = time.perf_counter()
        lr = learning_rate(cfg, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        idx, targets = run_source_batch(self.source, cfg, step)
        n_targets = int((targets != IGNORE).sum())
        local = cfg.batch_size // world_size()
        rows = slice(rank() * local, (rank() + 1) * local)
        idx, targets = idx[rows].to(self.device), targets[rows].to(self.device)
        torch.manual_seed(step_seed(cfg.seed, step) + 1)  # dropout
        loss, grad_norm = _update(
            self.train_model, self.optimizer, idx, targets, n_targets, cfg, self.autocast
        )
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise _diverged(
                self.label, step + 1, f"the loss is {loss:g} and the gradient norm {grad_norm:g}"
            )
        seconds = time.perf_counter() - tick
        self.segment_seconds += seconds
        self.tokens += idx.numel() * world_size()
        self.metrics.add(
            {
                "step": step + 1,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_second": idx.numel() * world_size() / seconds,
            }
        )
        return loss

    def report(self, done: int, loss: float) -> None:
        """A progress line at every tenth of the run, and at least every 30 s (lines only)."""
        steps = self.run.train.steps
        tenth = 10 * done // steps > 10 * (done - 1) // steps
        if self.lines and (tenth or time.monotonic() - self.last_line >= 30):
            stage(f"{self.label} step {done}/{steps}: loss {loss:.4g}")
            self.last_line = time.monotonic()

    def evaluate(self, done: int, loss: float, final: bool) -> dict[str, float]:
        """The held-out metrics after ``done`` steps (main process; others get ``{}``).
        ``final``: on every test line rather than the evaluation sample."""
        if not self.main_process:
            return {}
        self.model.eval()
        result = self.source.evaluate(
            self.model, self.run.train.seq_len, final, self.device, self.autocast
        )
        self.model.train()
        self.evals.add({"step": done, **result})
        if self.lines:  # a line per evaluation
            shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items())
            steps = self.run.train.steps
            stage(f"{self.label} step {done}/{steps}: loss {loss:.4g}; held out: {shown}")
            self.last_line = time.monotonic()
        return result

    def checkpoint(self, done: int) -> None:
        """Save the weights, the optimiser and the logs up to step ``done``."""
        # every process holds the same weights: all of them stop together
        if not all(bool(p.isfinite().all()) for p in self.model.parameters()):
            raise _diverged(self.label, done, "the weights are no longer finite")
        if self.main_process:
            # the logs first: a resumed run cuts rows past its checkpoint, but cannot get back
            # rows that were never written
            self.metrics.flush()
            self.evals.flush()
            seconds = self.train_seconds + self.segment_seconds
            save_checkpoint(
                self.out, self.model, self.optimizer, {"step": done, "train_seconds": seconds}
            )
            if self.run.train.keep_checkpoints:
                kept = self.out / KEPT_FOLDER / f"step-{done}.safetensors"
                kept.parent.mkdir(exist_ok=True)
                replace_atomically(kept, lambda tmp: shutil.copyfile(self.out / MODEL_FILE, tmp))
        _barrier()

    def close(self) -> None:
        if self.writer is not None:  # everything was flushed at the last checkpoint
            self.writer.close()

    def finish(self, end: int, reached: bool, final_eval: dict[str, float]) -> dict[str, Any]:
        """The summary of a run that ended at step ``end``; written with the curves."""
        cfg = self.run.train
        if self.main_process and (reached or not final_eval):
            # every test line (the stopping check saw the evaluation sample), or resumed from
            # a final checkpoint without a summary
            self.model.eval()
            final_eval = self.source.evaluate(
                self.model, cfg.seq_len, True, self.device, self.autocast
            )
        seconds = self.segment_seconds
        summary = {
            "steps": end,
            "stop_at": cfg.stop_at,
            "steps_to_target": end if reached else None,
            "final_eval": final_eval,
            "tokens_per_second": self.tokens / seconds if seconds else float("nan"),
            "train_seconds": self.train_seconds + seconds,
            "parameters": parameter_count(self.run.model),
            "processes": world_size(),
            "threads": torch.get_num_threads(),
            "device": str(self.device),
        }
        if self.main_process:
            if self.figures:
                training_curves(self.metrics.read(), self.evals.read(), self.out / "training.png")
            write_json(self.out / "summary.json", summary)
        if dist.is_initialized():
            dist.destroy_process_group()
        return summary


def _reaches(cfg: TrainConfig, result: dict[str, float]) -> bool:
    """Whether an evaluation's accuracy reached ``stop_at`` (never without ``stop_at``)."""
    return cfg.stop_at is not None and result.get("accuracy", -1.0) >= cfg.stop_at


def _agree(decision: bool, device: torch.device) -> bool:
    """The main process's decision, on every process (only it evaluates)."""
    if not dist.is_initialized():
        return decision
    flag = torch.tensor([int(decision)], device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _reached_before(evals: Log, cfg: TrainConfig, step: int) -> bool:
    """Whether a resumed run had already stopped at ``stop_at`` at its checkpoint ``step``
    (it was stopped after the checkpoint, before writing its summary)."""
    frame = Log.check(evals.path)
    if cfg.stop_at is None or "accuracy" not in frame or step == 0:
        return False
    last = frame[frame["step"] == step]
    return bool(len(last)) and bool(last["accuracy"].iloc[-1] >= cfg.stop_at)


def _diverged(label: str, step: int, what: str) -> RunFailed:
    where = "" if label == "train" else f"{label}: "
    return RunFailed(
        f"{where}step {step}: {what}: training diverged (lower --lr, raise --warmup or --grad-clip)"
    )


def _update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    idx: torch.Tensor,
    targets: torch.Tensor,
    n_targets: int,
    cfg: TrainConfig,
    autocast: Any,
) -> tuple[float, float]:
    """One optimiser step on this process's rows; returns the global mean loss and grad norm.

    ``n_targets`` counts the target tokens of the whole global batch. DDP averages gradients
    over processes, so scaling each process's summed loss by world_size / n_targets makes the
    update that of the global mean loss.
    """
    with autocast():
        logits = model(idx)
    loss_sum = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum"
    )
    (loss_sum * world_size() / max(n_targets, 1)).backward()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    loss_sum = loss_sum.detach()
    if dist.is_initialized():
        dist.all_reduce(loss_sum)
    loss = float(loss_sum) / max(n_targets, 1)
    if math.isfinite(loss) and math.isfinite(grad_norm):  # else the caller stops the run
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm


def run_source_batch(
    source: Source, cfg: TrainConfig, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same on every process and in every resumed run."""
    generator = torch.Generator().manual_seed(step_seed(cfg.seed, step))
    return source.batch(cfg.batch_size, cfg.seq_len, generator)


def _first_difference(stored: TrainRun, asked: TrainRun) -> str | None:
    """The first setting a resumed run asks to change, described; ``None`` when there is none.

    Where the run executes (``train.device``) and how far it trains (``train.steps``) may
    change: they are not what the run is.
    """
    difference = first_difference(
        stored.to_dict(), asked.to_dict(), ignore=("train.device", "train.steps")
    )
    if difference is None:
        return None
    key, old, new = difference
    return (
        f"{key} is {new!r} but the run was started with {old!r}; drop the flag or start a new run"
    )
