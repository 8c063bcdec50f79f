"""What defines a training run (``config.json``), assembled from a config file and flags.

Torch-free, so that settings can be checked (a sweep's grid, ``--resume`` refusals) without
importing the training loop in :mod:`nopelab.training.train`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nopelab.config import CorpusConfig, ModelConfig, TrainConfig, build, check_sections
from nopelab.errors import ConfigError, UserError
from nopelab.training.task_config import VOCAB, TaskConfig, max_line_len


def world_size() -> int:
    """Processes of a torchrun launch (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's number in a torchrun launch (0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))


CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class TrainRun:
    """Everything that defines a training run: what ``config.json`` holds."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig | None = None
    corpus: CorpusConfig | None = None

    def __post_init__(self) -> None:
        if (self.task is None) == (self.corpus is None):
            raise ConfigError("data", "give exactly one of a task (--task) and a corpus (--corpus)")
        if self.train.stop_at is not None and self.task is None:
            raise ConfigError("stop_at", "stops a task run at an accuracy; a corpus has none")
        if self.train.batch_size % world_size():
            raise ConfigError(
                "batch_size",
                f"{self.train.batch_size} does not split evenly over {world_size()} processes",
            )

    @property
    def task_config(self) -> TaskConfig:
        """The task this run trains on (for parts that train only on tasks; a run on text has
        none)."""
        assert self.task is not None, "a run on text has no task"
        return self.task

    def to_dict(self) -> dict[str, Any]:
        data = {"model": dataclasses.asdict(self.model), "train": dataclasses.asdict(self.train)}
        if self.task is not None:
            data["task"] = dataclasses.asdict(self.task)
        if self.corpus is not None:
            data["corpus"] = dataclasses.asdict(self.corpus)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> TrainRun:
        written = {"environment", "data"}  # written with the run, not settings
        sections = ("model", "train", "task", "corpus")
        check_sections({k: v for k, v in data.items() if k not in written}, sections, where)
        return cls(
            model=build(ModelConfig, data.get("model", {}), f"{where}.model"),
            train=build(TrainConfig, data.get("train", {}), f"{where}.train"),
            task=build(TaskConfig, data["task"], f"{where}.task") if "task" in data else None,
            corpus=build(CorpusConfig, data["corpus"], f"{where}.corpus")
            if "corpus" in data
            else None,
        )


def assemble_run(
    data: dict[str, Any], typed: dict[str, dict[str, Any]], resume: bool = False
) -> TrainRun:
    """A run's settings: ``data``'s tables (a config file's, or a resumed run's config) with
    what the user typed laid over them, section by section (``typed``: field values by
    section); what the data imply fills the rest: the model's ``vocab_size`` and, for a padded
    task, ``seq_len`` (its longest line). Errors name the (section, field) the user set."""
    data = dict(data)
    task, corpus = typed.get("task", {}), typed.get("corpus", {})
    if "name" in task:  # a task or a corpus picks what to train on
        data.setdefault("task", {})
    if "source" in corpus:
        data.setdefault("corpus", {})
    if not resume and "task" not in data and "corpus" not in data:
        raise UserError(
            "--task or --corpus: say what to train on (e.g. --task add or --corpus default)"
        )

    def lay_over(section: str) -> dict[str, Any]:
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise UserError(f"--config: [{section}] must be a table of settings")
        data[section] = {**table, **typed.get(section, {})}
        return data[section]

    for section, other in (("task", "corpus"), ("corpus", "task")):
        if section in data:
            lay_over(section)
        elif typed.get(section):
            raise ConfigError(
                next(iter(typed[section])),
                f"only applies when training on a {section}, not a {other}",
                section=section,
            )
    model = lay_over("model")
    if not resume and "vocab_size" not in model:
        if "corpus" in data:  # its own errors first: the vocabulary is derived from it
            build(CorpusConfig, data["corpus"], "config.corpus")
        model["vocab_size"] = data_vocab_size(data)
    train = lay_over("train")
    padded = isinstance(data.get("task"), dict) and data["task"].get("layout") == "padded"
    if not resume and padded and "seq_len" not in train:
        # one line per row: a longer context would only add padding
        train["seq_len"] = max_line_len(build(TaskConfig, data["task"], "config.task"))
    return TrainRun.from_dict(data)


def data_vocab_size(settings: dict[str, Any]) -> int:
    """The vocabulary the data of a run's settings implies: the task characters, 256 bytes, or
    the BPE's size, and a masked LM's mask token (what the model's ``vocab_size`` is when not
    given)."""
    if "task" in settings:
        return len(VOCAB)
    corpus = settings.get("corpus", {})
    tokens = int(corpus.get("bpe_vocab", 4096)) if corpus.get("tokenizer") == "bpe" else 256
    return tokens + (corpus.get("objective") == "masked")


def read_run(out: Path) -> TrainRun:
    """The configuration of a training run directory."""
    path = out / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"run: {out} has no {CONFIG_FILE}; is it a training run directory?")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise UserError(f"run: {path} is not valid JSON") from None
    if not isinstance(data, dict) or "train" not in data:
        raise UserError(f"run: {path} is not the config of a training run")
    return TrainRun.from_dict(data, where=str(path))
