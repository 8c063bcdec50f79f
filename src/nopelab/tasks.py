"""Character-level synthetic tasks (after Zuo et al. 2025), their data and their accuracy.

Each task line is ``prompt + answer + "\\n"``, e.g. ``123+45=168``. The prompt ends with ``=``;
a model is trained to continue it with the answer and a newline. ``make_splits`` draws distinct
training and test instances (disjoint prompts, optionally of different lengths for length
generalisation), ``packed_batch`` packs random lines into fixed-length training rows whose loss
covers the answers only, and ``accuracy`` scores exact-match greedy decoding.
"""

from __future__ import annotations

import math
import random
import string
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from nopelab.config import _check_types, _choice, _positive
from nopelab.errors import ConfigError, UserError

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))  # token id = index in VOCAB
TASKS = ("add", "reverse", "order", "wherex", "copy", "count")
IGNORE = -100  # target id that cross-entropy skips (PyTorch's default ignore_index)

DEFAULT_LENGTHS = {
    "add": (1, 3),
    "reverse": (1, 16),
    "order": (2, 10),
    "wherex": (1, 16),
    "copy": (1, 16),
    "count": (1, 16),
}
LENGTH_LIMITS = {"order": 10}  # order needs distinct digits
DIGITS = string.digits
LETTERS = string.ascii_lowercase

_IDS = {char: i for i, char in enumerate(VOCAB)}
_ASCII_TO_ID = np.full(128, -1, dtype=np.int64)  # token id by ASCII code; -1 outside VOCAB
_ASCII_TO_ID[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB))


def encode(text: str) -> list[int]:
    """Token ids of ``text``; a character outside VOCAB is a UserError."""
    try:
        return [_IDS[char] for char in text]
    except KeyError as exc:
        raise UserError(
            f"character {exc.args[0]!r} is not in the vocabulary "
            "(allowed: newline and printable ASCII 32..126)"
        ) from None


def decode(ids: Sequence[int] | Tensor | np.ndarray) -> str:
    """The text of token ids (a list, tensor or array)."""
    if isinstance(ids, (Tensor, np.ndarray)):
        ids = ids.tolist()
    for i in ids:
        if not 0 <= i < len(VOCAB):
            raise UserError(f"token id {i} is not in the vocabulary; allowed: 0..{len(VOCAB) - 1}")
    return "".join(VOCAB[i] for i in ids)


@dataclass(frozen=True)
class TaskConfig:
    """Which task, the operand lengths of training and test instances, and how many of each.

    A length is the number of digits of each addend (add), of the digit string (reverse, wherex),
    of each argument (order), or of the letter string (copy, count). ``None`` means the task's
    default (:data:`DEFAULT_LENGTHS`) for training, and the training range for testing.
    """

    name: str = "add"
    min_len: int | None = None
    max_len: int | None = None
    test_min_len: int | None = None
    test_max_len: int | None = None
    reversed_answer: bool = False  # add only: the sum's digits least-significant first
    train_size: int = 10_000
    test_size: int = 1_000

    def __post_init__(self) -> None:
        _check_types(self)
        _choice("task", self.name, TASKS)
        _positive("train_size", self.train_size)
        _positive("test_size", self.test_size)
        if self.reversed_answer and self.name != "add":
            raise ConfigError(
                "reversed_answer", f"only allowed with name='add', not name={self.name!r}"
            )
        limit = LENGTH_LIMITS.get(self.name)
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
        for prefix, (lo, hi) in (("", self.train_lengths), ("test_", self.test_lengths)):
            if lo > hi:
                unset = getattr(self, f"{prefix}max_len") is None
                raise ConfigError(
                    f"{prefix}min_len",
                    f"{lo} exceeds {prefix}max_len={hi}{' (its default; set it too)' if unset else ''}"
                    f"; allowed: {prefix}min_len <= {prefix}max_len",
                )

    @property
    def train_lengths(self) -> tuple[int, int]:
        """(lo, hi) operand lengths of training instances, defaults resolved."""
        lo, hi = DEFAULT_LENGTHS[self.name]
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


@dataclass(frozen=True)
class Example:
    """One task instance: the prompt (ending in ``=``) and the answer that follows it."""

    prompt: str
    answer: str

    @property
    def text(self) -> str:
        return self.prompt + self.answer + "\n"


# ------------------------------------------------------------------------ the six tasks


def _example(name: str, operands: tuple[str, ...], reversed_answer: bool = False) -> Example:
    """The line of one instance, its answer computed from the operands."""
    match name, operands:
        case "add", (a, b):
            total = str(int(a) + int(b))
            return Example(f"{a}+{b}=", total[::-1] if reversed_answer else total)
        case "reverse", (digits,):
            return Example(f"rev({digits})=", digits[::-1])
        case "order", (first, second):
            return Example(
                f"order({first},{second})=", "".join(str(first.index(d)) for d in second)
            )
        case "wherex", (digits, x):
            return Example(f"wherex({digits},{x})=", str(digits.index(x)))
        case "copy", (letters,):
            return Example(f"copy({letters})=", letters)
        case "count", (letters,):
            return Example(f"count({letters})=", str(len(letters)))
    raise ValueError(f"bad operands {operands!r} for task {name!r}")


def _draw_operands(name: str, k: int, rng: random.Random) -> tuple[str, ...]:
    """Uniformly random operands of length ``k``."""
    match name:
        case "add":
            low = 10 ** (k - 1) if k > 1 else 0  # no leading zero
            return str(rng.randrange(low, 10**k)), str(rng.randrange(low, 10**k))
        case "reverse":
            return ("".join(rng.choices(DIGITS, k=k)),)
        case "order":
            first = "".join(rng.sample(DIGITS, k))
            return first, "".join(rng.sample(first, k))
        case "wherex":
            digits = "".join(rng.choices(DIGITS, k=k))
            return digits, rng.choice(digits)
        case _:  # copy, count
            return ("".join(rng.choices(LETTERS, k=k)),)


def _longest_operands(name: str, k: int) -> tuple[str, ...]:
    """Operands of length ``k`` whose line is the longest one of that length."""
    match name:
        case "add":
            return "9" * k, "9" * k  # a carry out of the top digit
        case "order":
            return DIGITS[:k], DIGITS[:k]
        case "wherex":
            return "0" * (k - 1) + "1", "1"  # the largest index
        case "reverse":
            return ("0" * k,)
        case _:  # copy, count
            return ("a" * k,)


def _instance_count(name: str, k: int) -> int:
    """How many distinct prompts of length ``k`` exist."""
    match name:
        case "add":
            return (10 if k == 1 else 9 * 10 ** (k - 1)) ** 2
        case "reverse":
            return 10**k
        case "order":  # k distinct digits in order, then a permutation of them
            return math.perm(10, k) * math.factorial(k)
        case "wherex":  # sum over strings of their distinct digits
            return 10 * (10**k - 9**k)
        case _:  # copy, count
            return 26**k


def _count_in(name: str, lengths: tuple[int, int]) -> int:
    lo, hi = lengths
    return sum(_instance_count(name, k) for k in range(lo, hi + 1))


# ------------------------------------------------------------------------------- splits


def make_splits(cfg: TaskConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Distinct training and test examples (no test prompt occurs in training), by seed.

    Each instance draws its length uniformly from the range, then its operands uniformly.
    A range with fewer distinct instances than asked for is a ConfigError.
    """
    train_space = _count_in(cfg.name, cfg.train_lengths)
    if cfg.train_size > train_space:
        raise ConfigError("train_size", _too_few(cfg.name, train_space, cfg.train_lengths))
    (lo, hi), (test_lo, test_hi) = cfg.train_lengths, cfg.test_lengths
    overlap = (max(lo, test_lo), min(hi, test_hi))
    blocked = min(cfg.train_size, _count_in(cfg.name, overlap)) if overlap[0] <= overlap[1] else 0
    test_space = _count_in(cfg.name, cfg.test_lengths) - blocked
    if cfg.test_size > test_space:
        raise ConfigError("test_size", _too_few(cfg.name, test_space, cfg.test_lengths))

    rng = random.Random(seed)
    train = _draw(cfg, rng, "train_size", cfg.train_size, cfg.train_lengths, exclude=set())
    test = _draw(cfg, rng, "test_size", cfg.test_size, cfg.test_lengths, {e.prompt for e in train})
    return train, test


def _too_few(name: str, space: int, lengths: tuple[int, int]) -> str:
    return (
        f"only about {space} distinct {name} instances of lengths {lengths[0]}..{lengths[1]} "
        "are available; lower it or widen the lengths"
    )


def _draw(
    cfg: TaskConfig,
    rng: random.Random,
    field: str,
    size: int,
    lengths: tuple[int, int],
    exclude: set[str],
) -> list[Example]:
    """``size`` examples with distinct prompts outside ``exclude``, by rejection sampling."""
    seen = set(exclude)
    examples: list[Example] = []
    for _ in range(50 * size + 1000):  # ample unless the range is nearly exhausted
        operands = _draw_operands(cfg.name, rng.randint(*lengths), rng)
        example = _example(cfg.name, operands, cfg.reversed_answer)
        if example.prompt not in seen:
            seen.add(example.prompt)
            examples.append(example)
            if len(examples) == size:
                return examples
    raise ConfigError(
        field,
        f"drew only {len(examples)} distinct instances before giving up; "
        + _too_few(cfg.name, _count_in(cfg.name, lengths), lengths),
    )


def _longest_example(cfg: TaskConfig) -> Example:
    k = max(cfg.train_lengths[1], cfg.test_lengths[1])
    return _example(cfg.name, _longest_operands(cfg.name, k), cfg.reversed_answer)


def max_answer_len(cfg: TaskConfig) -> int:
    """The longest answer over training and test lengths (without the newline)."""
    return len(_longest_example(cfg).answer)


def max_line_len(cfg: TaskConfig) -> int:
    """The longest line ``prompt + answer + "\\n"`` over training and test lengths."""
    return len(_longest_example(cfg).text)


# ------------------------------------------------------------------------------ batches


def packed_batch(
    examples: Sequence[Example], batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Rows of random lines packed end to end, as (idx, targets), each (batch_size, seq_len).

    Every row starts at the start of a line; lines are drawn uniformly with replacement until
    the row has seq_len + 1 tokens (the last line may be cut). ``targets`` is ``idx`` shifted by
    one, with IGNORE wherever the target is not an answer character or the newline after one.
    """
    if not examples or batch_size < 1 or seq_len < 1:
        raise ValueError("packed_batch needs examples, batch_size >= 1 and seq_len >= 1")
    need = seq_len + 1
    lines: list[list[Example]] = [[] for _ in range(batch_size)]
    filled = [0] * batch_size  # characters per row so far
    mean_len = None  # of the lines drawn so far
    # Draw in rounds: one line per row first, then enough lines of the mean length to fill the
    # emptiest open row, plus one; a row stops taking lines once it is full.
    while open_rows := [row for row in range(batch_size) if filled[row] < need]:
        n = 1 if mean_len is None else math.ceil((need - min(filled)) / mean_len) + 1
        drawn = torch.randint(len(examples), (len(open_rows), n), generator=generator)
        for row, picks in zip(open_rows, drawn.tolist(), strict=True):
            for i in picks:
                if filled[row] >= need:
                    break
                lines[row].append(examples[i])
                filled[row] += len(examples[i].prompt) + len(examples[i].answer) + 1
        mean_len = sum(filled) / sum(map(len, lines))
    flat = [line for row in lines for line in row]
    tokens = _encode_array("".join([line.text for line in flat]))
    # per character: True on answers and their closing newline, False on prompts
    spans = [length for line in flat for length in (len(line.prompt), len(line.answer) + 1)]
    loss_on = np.repeat(np.tile([False, True], len(flat)), spans)
    row_starts = np.cumsum(filled) - filled
    window = row_starts[:, None] + np.arange(need)  # (batch_size, need) character positions
    tokens, loss_on = tokens[window], loss_on[window]
    targets = np.where(loss_on[:, 1:], tokens[:, 1:], IGNORE)
    return torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])), torch.from_numpy(targets)


def _encode_array(text: str) -> np.ndarray:
    """``encode`` for long texts, as an int64 array."""
    ids = _ASCII_TO_ID[np.frombuffer(text.encode("ascii", errors="ignore"), dtype=np.uint8)]
    if len(ids) != len(text) or (ids < 0).any():
        encode(text)  # raises the UserError that names the character
    return ids


# ----------------------------------------------------------------------------- accuracy


@torch.no_grad()
def accuracy(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> float:
    """Exact-match accuracy of greedy decoding, each prompt alone from position 0.

    A prediction is correct iff the generated text up to its first newline equals the answer
    and a newline was generated (within len(answer) + 1 tokens). Prompts are batched by length,
    so no padding is needed. ``model`` must already be on ``device``.
    """
    if not examples:
        raise ValueError("accuracy needs at least one example")
    cfg = getattr(model, "cfg", None)
    if cfg is not None and cfg.pos_encoding == "learned":
        longest = max(len(e.prompt) + len(e.answer) for e in examples)
        if longest > cfg.max_seq_len:
            raise UserError(
                f"decoding needs {longest} positions but the learned position table has "
                f"max_seq_len={cfg.max_seq_len}; use shorter test lengths or a larger max_seq_len"
            )
    by_length: dict[int, list[Example]] = defaultdict(list)
    for example in examples:
        by_length[len(example.prompt)].append(example)

    was_training = model.training
    model.eval()
    try:
        correct = 0
        for group in by_length.values():
            for start in range(0, len(group), batch_size):
                batch = group[start : start + batch_size]
                correct += _count_correct(model, batch, device)
    finally:
        model.train(was_training)
    return correct / len(examples)


def _count_correct(model: nn.Module, batch: Sequence[Example], device: torch.device | str) -> int:
    """Greedy-decode a batch of equal-length prompts; count the exact matches."""
    seq = torch.tensor([encode(e.prompt) for e in batch], device=device)
    prompt_len = seq.shape[1]
    done = torch.zeros(len(batch), dtype=torch.bool, device=device)
    for _ in range(max(len(e.answer) for e in batch) + 1):
        next_id = model(seq)[:, -1].argmax(dim=-1)
        seq = torch.cat([seq, next_id[:, None]], dim=1)
        done |= next_id == 0  # VOCAB[0] is the newline
        if done.all():
            break
    correct = 0
    for example, row in zip(batch, seq[:, prompt_len:].cpu(), strict=True):
        generated = decode(row)[: len(example.answer) + 1]
        correct += generated == example.answer + "\n"
    return correct
