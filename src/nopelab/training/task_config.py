"""What a synthetic task run trains on: the task, its format, lengths and sizes, the row layout.

Torch-free, so that settings can be checked (``nopelab sweep`` validates a grid) without
importing the data code in :mod:`nopelab.training.tasks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from nopelab.config import check_choice, check_positive, check_types, setting
from nopelab.errors import ConfigError
from nopelab.training.task_kinds import TASK_KINDS, Example, Task

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))  # token id = index in VOCAB
Format = Literal["zuo", "plain"]
Layout = Literal["packed", "windows", "padded"]
LossMode = Literal["answer", "all"]
TASKS = get_args(Task)
ZUO_TASKS = tuple(name for name, kind in TASK_KINDS.items() if kind.zuo_lengths)
FORMATS = get_args(Format)
LAYOUTS = get_args(Layout)
LOSS_MODES = get_args(LossMode)


@dataclass(frozen=True)
class TaskConfig:
    """Which task in which format, its lengths and sizes, and how training rows are laid out.

    A length is the number of digits of each addend (add), of the digit string (reverse, wherex),
    of each argument (order), of the letter or digit string (copy, dup, count, sort, sum,
    parity), or the number of actions of a SCAN command (scan). ``None`` means the task's
    default (its class in :mod:`nopelab.training.task_kinds`) for training, and the training
    range for testing; ``format = None`` means ``zuo`` where the task has it, else ``plain``.
    """

    name: Task = setting("add", "Synthetic task", flag="--task")
    format: Format | None = setting(
        None,
        "zuo ($50+148=891$, Zuo et al.'s data files) or plain (123+45=168)",
        shown="zuo where the task has it",
    )
    min_len: int | None = setting(None, "Shortest training operand", shown="task default")
    max_len: int | None = setting(None, "Longest training operand", shown="task default")
    test_min_len: int | None = setting(None, "Shortest test operand", shown="--min-len")
    test_max_len: int | None = setting(None, "Longest test operand", shown="--max-len")
    reversed_answer: bool = setting(
        False,
        "Plain add: the sum's digits least-significant first",
        flag="--reversed-answer/--plain-answer",
    )
    train_size: int = setting(10_000, "Training lines")
    test_size: int = setting(1_000, "Test lines")
    layout: Layout = setting(
        "packed",
        "Lines end to end, random windows of the concatenated lines (as Zuo et al.), or one "
        "line per row with the prompt left-padded",
    )
    loss_mode: LossMode = setting(
        "answer", "Loss on answers only, or on every character (as Zuo et al.)"
    )

    def __post_init__(self) -> None:
        check_choice("task", self.name, TASKS)  # named as the flag: "name" would say little
        limit = TASK_KINDS[self.name].limit
        for field in ("min_len", "max_len", "test_min_len", "test_max_len"):
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(field, f"expected int or None, got {value!r}")
            if value < 1 or (limit is not None and value > limit):
                allowed = f"1..{limit}" if limit is not None else ">= 1"
                raise ConfigError(
                    field, f"{value} is not allowed for {self.name}; allowed: {allowed}"
                )
        check_types(self)
        if self.format == "zuo" and self.name not in ZUO_TASKS:
            raise ConfigError("format", f"{self.name} has only the plain format; allowed: plain")
        check_positive("train_size", self.train_size)
        check_positive("test_size", self.test_size)
        if self.reversed_answer and (self.name != "add" or self.resolved_format != "plain"):
            raise ConfigError(
                "reversed_answer",
                "only allowed with the plain add format (Zuo's add format is always reversed)",
            )
        for prefix, (lo, hi) in (("", self.train_lengths), ("test_", self.test_lengths)):
            if lo > hi:
                unset = getattr(self, f"{prefix}max_len") is None
                raise ConfigError(
                    f"{prefix}min_len",
                    f"{lo} exceeds {prefix}max_len={hi}{' (its default; set it too)' if unset else ''}"
                    f"; allowed: {prefix}min_len <= {prefix}max_len",
                )

    @property
    def resolved_format(self) -> str:
        """``format`` with its default resolved."""
        if self.format is not None:
            return self.format
        return "zuo" if self.name in ZUO_TASKS else "plain"

    @property
    def train_lengths(self) -> tuple[int, int]:
        """(lo, hi) operand lengths of training instances, defaults resolved."""
        lo, hi = TASK_KINDS[self.name].default_lengths(self.resolved_format)
        return (
            lo if self.min_len is None else self.min_len,
            hi if self.max_len is None else self.max_len,
        )

    @property
    def test_lengths(self) -> tuple[int, int]:
        """(lo, hi) operand lengths of test instances, defaults resolved."""
        lo, hi = self.train_lengths
        return (
            lo if self.test_min_len is None else self.test_min_len,
            hi if self.test_max_len is None else self.test_max_len,
        )


def _longest_examples(cfg: TaskConfig) -> list[Example]:
    """Examples holding, between them, the longest prompt, answer and line of the lengths."""
    k = max(cfg.train_lengths[1], cfg.test_lengths[1])
    kind = TASK_KINDS[cfg.name]
    fmt = cfg.resolved_format
    return [kind.example(ops, fmt, cfg.reversed_answer) for ops in kind.extremes(k)]


def max_answer_len(cfg: TaskConfig) -> int:
    """The longest answer over training and test lengths (without the newline)."""
    return max(len(e.answer) for e in _longest_examples(cfg))


def max_prompt_len(cfg: TaskConfig) -> int:
    """The longest prompt over training and test lengths."""
    return max(len(e.prompt) for e in _longest_examples(cfg))


def max_line_len(cfg: TaskConfig) -> int:
    """The longest line ``prompt + answer + "\\n"`` over training and test lengths."""
    return max(len(e.text) for e in _longest_examples(cfg))


def check_seq_len(cfg: TaskConfig, seq_len: int) -> None:
    """A training row (``seq_len`` characters) must hold the task's longest line."""
    longest = max_line_len(cfg)
    if longest > seq_len:
        raise ConfigError(
            "seq_len", f"must hold a whole line of the task ({longest} characters), got {seq_len}"
        )
