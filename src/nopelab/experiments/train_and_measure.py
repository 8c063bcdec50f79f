"""Shared by the trained-model parts: train a model, then analyse or probe it.

:func:`lm_runs` builds the byte-level language models on the embedded corpus that the
pretrained-LM parts compare (one per positional encoding, otherwise identical);
:func:`train_into` trains one run into its folder, after the earlier stages of its curriculum
if it has one (continuing an interrupted run, and reading a finished one's summary instead of
training again, once :func:`check_trained` has found it trained with the same settings);
:func:`training_job` makes that a job of :func:`~nopelab.runtime.jobs.run_jobs` checked the
same way when it finished before; :func:`analyze_trained` analyses a trained run's initial and
trained weights on the same held-out data; :func:`train_and_analyze` is both, as one job of
:func:`~nopelab.runtime.jobs.run_jobs`, and :func:`read_trained` reads its files back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nopelab.config import (
    AnalysisConfig,
    CorpusConfig,
    ModelConfig,
    PosEncoding,
    RunConfig,
    TrainConfig,
    first_difference,
)
from nopelab.errors import UserError
from nopelab.experiments.scale_files import scale_schema
from nopelab.measure.analysis import analyze_model
from nopelab.measure.run_files import WrittenAnalysis, read_analysis, write_analysis
from nopelab.models.transformer import build_model
from nopelab.runtime.jobs import Job
from nopelab.training.checkpoint import KEPT_FOLDER, STATE_FILE
from nopelab.training.run import TrainRun, read_run
from nopelab.training.train import train
from nopelab.training.trained import load_trained, make_source

PERPLEXITY_LENGTHS = ("perplexity", "perplexity_2x", "perplexity_4x")


@scale_schema
class CorpusScale:
    """The optional key of an LM part's scale table: the embedded corpus the scale trains on
    unless ``--corpus`` names one (``default`` where the table has none)."""

    corpus: str = "default"


def lm_runs(
    pos_encodings: tuple[PosEncoding, ...],
    model: dict[str, Any],
    train_cfg: dict[str, Any],
    seed: int,
    device: str,
    evaluations: int = 4,
    kept: int = 0,
    corpus: str = "default",
    bpe_vocab: int | None = None,
) -> dict[str, TrainRun]:
    """Language models on a corpus (an embedded one's name), one per encoding, keyed by it: of
    bytes, or of a byte-level BPE of ``bpe_vocab`` tokens trained on the corpus's training text.

    ``model`` and ``train_cfg`` hold a scale's ModelConfig and TrainConfig fields; each model is
    evaluated ``evaluations`` times along training, and keeps the weights of ``kept`` evenly
    spaced checkpoints (:func:`kept_checkpoints`; 0: none kept, but a checkpoint to continue
    from at every evaluation, so a stopped model loses at most one evaluation's steps). Every model
    can take 4x the training length, so each is evaluated there too; a learned table's rows
    beyond the training length are never trained.
    """
    steps, seq_len = train_cfg["steps"], train_cfg["seq_len"]
    eval_every = max(1, steps // evaluations)
    cfg = TrainConfig(
        **train_cfg,
        eval_every=eval_every,
        checkpoint_every=-(-steps // kept) if kept else eval_every,  # kept: the last at the end
        keep_checkpoints=kept > 0,
        seed=seed,
        device=device,
    )
    text = (
        CorpusConfig(source=corpus, tokenizer="byte")
        if bpe_vocab is None
        else CorpusConfig(source=corpus, tokenizer="bpe", bpe_vocab=bpe_vocab)
    )
    vocab = 256 if bpe_vocab is None else bpe_vocab
    return {
        pe: TrainRun(
            model=ModelConfig(**model, vocab_size=vocab, max_seq_len=4 * seq_len, pos_encoding=pe),
            train=cfg,
            corpus=text,
        )
        for pe in pos_encodings
    }


def kept_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """The weights a run kept at its checkpoints (``keep_checkpoints``): (step, file), by step."""
    files = (folder / KEPT_FOLDER).glob("step-*.safetensors")
    return sorted((int(file.stem.removeprefix("step-")), file) for file in files)


def perplexity_row(summary: dict[str, Any], **labels: Any) -> dict[str, Any]:
    """A text run's held-out perplexity at 1x, 2x and 4x the training length, and its speed."""
    final = summary["final_eval"]
    return {
        **labels,
        **{name: final.get(name) for name in PERPLEXITY_LENGTHS},
        "tokens_per_second": summary["tokens_per_second"],
    }


def train_into(run: TrainRun, folder: Path, stages: Sequence[TrainRun] = ()) -> dict[str, Any]:
    """Train ``run`` into ``folder``; return the training summary.

    A folder that already holds the finished run is read, not retrained (a run finished with
    other settings is refused: :func:`check_trained`); one with a checkpoint
    continues from it (a resumed run retraces the uninterrupted one exactly). ``stages`` are the
    earlier stages of a curriculum (the same model on easier data): each trains into
    :func:`stage_folder` and starts from the weights of the one before, ``run`` from the last.
    """
    previous = None
    for number, stage in enumerate(stages, 1):
        _train_one(starting_from(stage, previous), stage_folder(folder, number))
        previous = stage_folder(folder, number)
    return _train_one(starting_from(run, previous), folder)


def stage_folder(folder: Path, number: int) -> Path:
    """Where stage ``number`` (from 1) of the curriculum of the run in ``folder`` trains."""
    return folder.with_name(f"{folder.name}-stage{number}")


def starting_from(run: TrainRun, folder: Path | None) -> TrainRun:
    """``run`` starting from the weights of the run in ``folder`` (``None``: from its init)."""
    if folder is None:
        return run
    init_from = str(folder.absolute())
    return dataclasses.replace(run, train=dataclasses.replace(run.train, init_from=init_from))


def _train_one(run: TrainRun, folder: Path) -> dict[str, Any]:
    if (folder / "summary.json").is_file():
        _check_finished(run, folder)
        return json.loads((folder / "summary.json").read_text())
    resume = (folder / STATE_FILE).is_file()
    if resume:  # the weights come from the checkpoint: where a curriculum's stage started from
        # matters no more (the reproduction folder may have been moved since), nor how often a
        # run that keeps no checkpoints writes one (a run started by an older nopelab)
        stored = read_run(folder).train
        every = (
            run.train.checkpoint_every if run.train.keep_checkpoints else stored.checkpoint_every
        )
        train_cfg = dataclasses.replace(
            run.train, init_from=stored.init_from, checkpoint_every=every
        )
        run = dataclasses.replace(run, train=train_cfg)
    started = folder.is_dir() and any(folder.iterdir())  # stopped before its first checkpoint
    summary = train(run, folder, resume=resume, force=started and not resume, label=folder.name)
    assert summary is not None
    return summary


def training_job(
    key: str, fn: Callable[..., Any], args: tuple[Any, ...], run: TrainRun,
    stages: Sequence[TrainRun] = (),
) -> Job:  # fmt: skip
    """The job ``fn(*args, folder)`` that trains ``run`` (after ``stages``) into its folder as
    :func:`train_into` does; resumed, it refuses a folder finished with other settings."""
    return Job(key, fn, args, check=partial(check_trained, run, tuple(stages)))


def check_trained(run: TrainRun, stages: Sequence[TrainRun], folder: Path) -> None:
    """Refuse ``folder`` if it, or a stage of its curriculum, holds a run finished with other
    settings than :func:`train_into` would give it: a reproduction resumed after its scale
    changed would otherwise read back models trained otherwise."""
    previous = None
    for number, stage in enumerate(stages, 1):
        _check_finished(starting_from(stage, previous), stage_folder(folder, number))
        previous = stage_folder(folder, number)
    _check_finished(starting_from(run, previous), folder)


def _check_finished(asked: TrainRun, folder: Path) -> None:
    """A finished run in ``folder`` must be ``asked``, wherever it ran and wherever the folders
    have moved since (a curriculum stage's ``init_from`` is compared by folder name); how often
    a run that keeps no checkpoints wrote one does not change the model (a resumed run retraces
    the uninterrupted one)."""
    if not (folder / "summary.json").is_file():
        return
    ignore = ("train.device",) + (
        () if asked.train.keep_checkpoints else ("train.checkpoint_every",)
    )
    difference = first_difference(_comparable(read_run(folder)), _comparable(asked), ignore=ignore)
    if difference is not None:
        key, old, new = difference
        raise UserError(
            f"--resume: {folder} holds a run finished with {key} = {old!r}, but this run "
            f"asks for {new!r} (has the scale changed?); start a new --out"
        )


def _comparable(run: TrainRun) -> dict[str, dict[str, Any]]:
    settings = run.to_dict()
    if (start := settings["train"].get("init_from")) is not None:
        settings["train"]["init_from"] = Path(start).name
    return settings


@dataclass
class Trained:
    """A trained run's summary and the analyses of its model at init and after training."""

    summary: dict[str, Any]
    init: WrittenAnalysis
    trained: WrittenAnalysis

    def rows(self, **labels: Any) -> list[dict[str, Any]]:
        """Summary rows of both states, labelled (``state`` is ``init`` or ``trained``)."""
        return [
            {**labels, "state": state, **row}
            for state, result in (("init", self.init), ("trained", self.trained))
            for row in result.rows
        ]


def train_and_analyze(
    run: TrainRun, analysis: AnalysisConfig, stages: Sequence[TrainRun], folder: Path
) -> None:
    """Train ``run`` into ``folder`` (after its curriculum's ``stages``), then
    :func:`analyze_trained` it (a job)."""
    train_into(run, folder, stages)
    analyze_trained(run, folder, analysis)


def analyze_trained(run: TrainRun, folder: Path, analysis: AnalysisConfig) -> None:
    """Analyse a trained run's initial and trained weights on the same held-out data, writing
    both analyses beside its checkpoint (``analysis-init/``, ``analysis-trained/``; replacing
    earlier ones)."""
    source = make_source(run, folder)
    for state in ("init", "trained"):
        start = time.perf_counter()
        model = (
            build_model(run.model, run.train.seed)  # where training (its first stage) started
            if state == "init"
            else load_trained(folder)[1]
        )
        result = analyze_model(model, analysis, f"{folder.name} {state}", source=source)
        (folder / f"analysis-{state}").mkdir(exist_ok=True)
        write_analysis(
            folder / f"analysis-{state}",
            RunConfig(run.model, analysis),
            result,
            time.perf_counter() - start,
            title=f"{folder.name}, {state}",
            figures=False,
            random_init=state == "init",
        )


def read_trained(folder: Path) -> Trained:
    """The training summary and both analyses that :func:`train_and_analyze` wrote."""
    return Trained(
        json.loads((folder / "summary.json").read_text()),
        read_analysis(folder / "analysis-init"),
        read_analysis(folder / "analysis-trained"),
    )
