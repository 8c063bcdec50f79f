"""Character-level synthetic tasks (after Zuo et al. 2025), their data and their accuracy.

Each task line is ``prompt + answer + "\\n"``. Two formats:

* ``zuo`` (the default of add, reverse, order and wherex), as in Zuo et al.'s data files:
  ``$50+148=891$`` (the sum written least-significant digit first, the line wrapped in ``$``),
  ``rev(5973245481290159)=9510921845423795``, ``order(74283,87234)=30241``,
  ``wherex(360465066,6)=1``. Numbers are uniform integers below 10**max_len written without
  leading zeros, so most have max_len digits (90 %, then 9 %, 0.9 %, …); order's digit count
  follows the same law.
* ``plain``: the length is uniform over the range and every operand has that length:
  ``123+45=168`` (``reversed_answer`` writes the sum backwards), copy and count.

The prompt ends with ``=``; a model is trained to continue it with the answer and a newline.
``make_splits`` draws distinct training and test instances (disjoint prompts). Training rows
come in three layouts (``TaskConfig.layout``): ``packed`` lines end to end from a line start,
``windows`` of the shuffled, concatenated training lines starting anywhere (Zuo's ``train.py``),
or ``padded``: one line per row, its prompt left-padded with newlines to the longest prompt.
The loss covers the answers (``loss_mode = "answer"``) or every character (``"all"``).
``accuracy`` scores exact-match greedy decoding, all prompts of a batch at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from nopelab.encodings import encoding
from nopelab.errors import ConfigError, UserError
from nopelab.training.task_config import VOCAB, TaskConfig
from nopelab.training.task_kinds import TASK_KINDS, Example

T = TypeVar("T")

NEWLINE = 0  # token id of "\n": line end and left padding
IGNORE = -100  # target id that cross-entropy skips (PyTorch's default ignore_index)

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


# ------------------------------------------------------------------------------- splits


def make_splits(cfg: TaskConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Distinct training and test examples (no test prompt occurs in training), by seed.

    A range with fewer distinct instances than asked for is a ConfigError.
    """
    fmt, kind = cfg.resolved_format, TASK_KINDS[cfg.name]
    train_space = kind.count_in(fmt, cfg.train_lengths)
    if cfg.train_size > train_space:
        raise ConfigError("train_size", _too_few(cfg.name, train_space, cfg.train_lengths))
    (lo, hi), (test_lo, test_hi) = cfg.train_lengths, cfg.test_lengths
    overlap = (max(lo, test_lo), min(hi, test_hi))
    blocked = min(cfg.train_size, kind.count_in(fmt, overlap)) if overlap[0] <= overlap[1] else 0
    test_space = kind.count_in(fmt, cfg.test_lengths) - blocked
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
    fmt, kind = cfg.resolved_format, TASK_KINDS[cfg.name]
    seen = set(exclude)
    examples: list[Example] = []
    for _ in range(50 * size + 1000):  # ample unless the range is nearly exhausted
        example = kind.example(kind.draw(fmt, lengths, rng), fmt, cfg.reversed_answer)
        if example.prompt not in seen:
            seen.add(example.prompt)
            examples.append(example)
            if len(examples) == size:
                return examples
    raise ConfigError(
        field,
        f"drew only {len(examples)} distinct instances before giving up; "
        + _too_few(cfg.name, kind.count_in(fmt, lengths), lengths),
    )


# ------------------------------------------------------------------------------ batches


def _encode_array(text: str) -> np.ndarray:
    """``encode`` for long texts, as an int64 array."""
    ids = _ASCII_TO_ID[np.frombuffer(text.encode("ascii", errors="ignore"), dtype=np.uint8)]
    if len(ids) != len(text) or (ids < 0).any():
        encode(text)  # raises the UserError that names the character
    return ids


def _answer_mask(lines: Sequence[Example]) -> np.ndarray:
    """Per character of the concatenated lines: True on answers and their closing newline."""
    spans = [length for line in lines for length in (len(line.prompt), len(line.answer) + 1)]
    return np.repeat(np.tile([False, True], len(lines)), spans)


def _targets(tokens: np.ndarray, loss_on: np.ndarray) -> tuple[Tensor, Tensor]:
    """(idx, targets) from rows of seq_len + 1 tokens: targets shifted by one, IGNORE where
    ``loss_on`` (per token, same shape) is False."""
    targets = np.where(loss_on[:, 1:], tokens[:, 1:], IGNORE)
    return torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])), torch.from_numpy(targets)


def packed_batch(
    examples: Sequence[Example],
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    loss_mode: str = "answer",
) -> tuple[Tensor, Tensor]:
    """Rows of random lines packed end to end, as (idx, targets), each (batch_size, seq_len).

    Every row starts at the start of a line; lines are drawn uniformly with replacement until
    the row has seq_len + 1 tokens (the last line may be cut). ``targets`` is ``idx`` shifted by
    one; with ``loss_mode = "answer"`` it is IGNORE wherever the target is not an answer
    character or the newline after one.
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
    loss_on = _answer_mask(flat) if loss_mode == "answer" else np.ones(len(tokens), dtype=bool)
    row_starts = np.cumsum(filled) - filled
    window = row_starts[:, None] + np.arange(need)  # (batch_size, need) character positions
    return _targets(tokens[window], loss_on[window])


class LineStream:
    """The training lines shuffled once and concatenated, as in Zuo et al.'s data files; rows
    are random windows of it that start anywhere (mid-line too)."""

    def __init__(self, examples: Sequence[Example], seed: int):
        lines = list(examples)
        random.Random(seed).shuffle(lines)
        self.tokens = _encode_array("".join(line.text for line in lines))
        self.answers = _answer_mask(lines)

    def batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator, loss_mode: str = "all"
    ) -> tuple[Tensor, Tensor]:
        if len(self.tokens) < seq_len + 1:
            raise ConfigError(
                "seq_len",
                f"{seq_len} is longer than all training lines together ({len(self.tokens)} "
                "characters); use more lines or a shorter seq_len",
            )
        starts = torch.randint(len(self.tokens) - seq_len, (batch_size,), generator=generator)
        window = starts.numpy()[:, None] + np.arange(seq_len + 1)
        loss_on = self.answers[window] if loss_mode == "answer" else np.ones(window.shape, bool)
        return _targets(self.tokens[window], loss_on)


def left_pad(prompt: str, length: int) -> str:
    """``prompt`` after newlines, ``length`` characters in all (Zuo's analysis inputs)."""
    if len(prompt) > length:
        raise ConfigError(
            "seq_len",
            f"{length} is shorter than the prompt {prompt!r} ({len(prompt)} characters); "
            f"allowed: >= {len(prompt)}",
        )
    return "\n" * (length - len(prompt)) + prompt


class PaddedLines:
    """One line per row: its prompt left-padded with newlines to ``prompt_len``, then the answer,
    the closing newline and newline filler (never a target) up to the row's end."""

    def __init__(self, examples: Sequence[Example], prompt_len: int, width: int):
        n = len(examples)
        self.tokens = np.zeros((n, width), dtype=np.int64)  # NEWLINE everywhere first
        self.answers = np.zeros((n, width), dtype=bool)
        self.lines = np.zeros((n, width), dtype=bool)  # the line's own characters
        for i, example in enumerate(examples):
            text = left_pad(example.prompt, prompt_len) + example.answer + "\n"
            self.tokens[i, : len(text)] = encode(text)
            self.answers[i, prompt_len : len(text)] = True
            self.lines[i, prompt_len - len(example.prompt) : len(text)] = True

    def batch(
        self,
        batch_size: int,
        seq_len: int,
        generator: torch.Generator,
        loss_mode: str = "answer",
    ) -> tuple[Tensor, Tensor]:
        rows = torch.randint(len(self.tokens), (batch_size,), generator=generator).numpy()
        mask = self.answers if loss_mode == "answer" else self.lines
        tokens, loss_on = self.tokens[rows, : seq_len + 1], mask[rows, : seq_len + 1]
        if (extra := seq_len + 1 - tokens.shape[1]) > 0:  # more newline filler, no targets
            tokens = np.pad(tokens, ((0, 0), (0, extra)), constant_values=NEWLINE)
            loss_on = np.pad(loss_on, ((0, 0), (0, extra)), constant_values=False)
        return _targets(tokens, loss_on)


# ----------------------------------------------------------------------------- accuracy


@torch.no_grad()
def greedy_answers(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    pad_to: int | None = None,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> list[str]:
    """What greedy decoding writes after each prompt: up to the first newline (kept), at most
    len(answer) + 1 characters.

    The prompts of a batch are decoded together, each on its own row from position 0 (or
    left-padded with newlines to ``pad_to`` characters). Rows are right-padded and each row
    reads its next token at its own position; causal attention never looks right, so every
    row gets what decoding it alone would give. ``model`` must already be on ``device``.
    """
    _check_examples(model, examples, pad_to)

    def decode_batch(batch: Sequence[Example]) -> list[str]:
        budgets = [len(e.answer) + 1 for e in batch]
        return _decode_batch(model, _prompts(batch, pad_to), budgets, device)

    return _in_eval_batches(model, examples, batch_size, decode_batch)


def _decode_batch(
    model: nn.Module, prompts: Sequence[str], budgets: Sequence[int], device: torch.device | str
) -> list[str]:
    """Greedy-decode prompts of any lengths at once, each for at most its budget of tokens."""
    lengths = torch.tensor([len(p) for p in prompts])
    budget = torch.tensor(budgets)
    seq = torch.full((len(prompts), int((lengths + budget).max())), NEWLINE, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        seq[row, : len(prompt)] = torch.tensor(encode(prompt))
    rows = torch.arange(len(prompts))
    cursor = lengths.clone()  # where each row writes its next token
    open_ = torch.ones(len(prompts), dtype=torch.bool)
    while open_.any():
        logits = model(seq[:, : int(cursor.max())].to(device))
        next_id = logits[rows.to(device), (cursor - 1).to(device)].argmax(dim=-1).cpu()
        seq[rows[open_], cursor[open_]] = next_id[open_]
        cursor += open_
        open_ &= (next_id != NEWLINE) & (cursor - lengths < budget)
    return [decode(seq[row, lengths[row] : cursor[row]]) for row in range(len(prompts))]


def _prompts(examples: Sequence[Example], pad_to: int | None) -> list[str]:
    return [e.prompt if pad_to is None else left_pad(e.prompt, pad_to) for e in examples]


def _in_eval_batches(
    model: nn.Module,
    examples: Sequence[Example],
    batch_size: int,
    each: Callable[[Sequence[Example]], list[T]],
) -> list[T]:
    """``each`` over the batches of ``examples``, joined, with ``model`` in eval mode meanwhile."""
    was_training = model.training
    model.eval()
    try:
        out: list[T] = []
        for start in range(0, len(examples), batch_size):
            out += each(examples[start : start + batch_size])
        return out
    finally:
        model.train(was_training)


def _check_examples(model: nn.Module, examples: Sequence[Example], pad_to: int | None) -> None:
    """At least one example, and a learned position table long enough for every line."""
    if not examples:
        raise ValueError("decoding needs at least one example")
    cfg = getattr(model, "cfg", None)
    if cfg is not None and encoding(cfg.pos_encoding).table:
        longest = max((pad_to or len(e.prompt)) + len(e.answer) for e in examples)
        if longest > cfg.max_seq_len:
            raise UserError(
                f"decoding needs {longest} positions but the learned position table has "
                f"max_seq_len={cfg.max_seq_len}; use shorter test lengths or a larger max_seq_len"
            )


@torch.no_grad()
def exact_matches(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    pad_to: int | None = None,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> list[bool]:
    """Whether greedy decoding (:func:`greedy_answers`) writes each answer followed by a newline.

    A causal nopelab model is not decoded: greedy decoding writes the answer exactly when, fed
    the prompt and the answer (teacher forcing), the model's top token at each position of the
    answer and its newline is that character, for decoding follows the answer while its top
    tokens do and leaves it at the first that does not. One forward pass a batch then does the
    work of one per written character. Any other model is decoded.
    """
    cfg = getattr(model, "cfg", None)
    if cfg is None or cfg.bidirectional:
        written = greedy_answers(
            model, examples, pad_to=pad_to, batch_size=batch_size, device=device
        )
        return [w == e.answer + "\n" for w, e in zip(written, examples, strict=True)]
    _check_examples(model, examples, pad_to)
    return _in_eval_batches(
        model, examples, batch_size, lambda batch: _teacher_forced(model, batch, pad_to, device)
    )


def _teacher_forced(
    model: nn.Module, examples: Sequence[Example], pad_to: int | None, device: torch.device | str
) -> list[bool]:
    """:func:`exact_matches` of one batch of a causal model, from one forward pass."""
    prompts = _prompts(examples, pad_to)
    lines = [encode(p + e.answer + "\n") for p, e in zip(prompts, examples, strict=True)]
    seq = torch.full((len(lines), max(map(len, lines))), NEWLINE, dtype=torch.long)
    for row, line in enumerate(lines):
        seq[row, : len(line)] = torch.tensor(line)
    # position t predicts token t + 1; a row's answer and newline are its tokens from len(prompt)
    predicted = model(seq[:, :-1].to(device)).argmax(dim=-1).cpu()
    t = torch.arange(seq.shape[1] - 1)
    first = torch.tensor([len(p) - 1 for p in prompts])[:, None]
    last = torch.tensor([len(line) - 2 for line in lines])[:, None]
    judged = (t >= first) & (t <= last)
    return ((predicted == seq[:, 1:]) | ~judged).all(dim=1).tolist()


def accuracy(
    model: nn.Module,
    examples: Sequence[Example],
    *,
    pad_to: int | None = None,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> float:
    """Exact-match accuracy of greedy decoding (:func:`exact_matches`): a prediction is right
    iff it is the answer followed by a newline."""
    right = exact_matches(model, examples, pad_to=pad_to, batch_size=batch_size, device=device)
    return sum(right) / len(examples)
