"""Synthetic tasks: every answer checked by an independent solver, splits, packing, accuracy."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from nopelab import tasks
from nopelab.config import ModelConfig
from nopelab.errors import ConfigError, UserError
from nopelab.model import Transformer
from nopelab.tasks import (
    TASKS,
    VOCAB,
    Example,
    TaskConfig,
    accuracy,
    decode,
    encode,
    make_splits,
    max_answer_len,
    max_line_len,
    packed_batch,
)

# --------------------------------------------------------------- an independent solver

PROMPTS = {
    "add": re.compile(r"(\d+)\+(\d+)="),
    "reverse": re.compile(r"rev\((\d+)\)="),
    "order": re.compile(r"order\((\d+),(\d+)\)="),
    "wherex": re.compile(r"wherex\((\d+),(\d)\)="),
    "copy": re.compile(r"copy\(([a-z]+)\)="),
    "count": re.compile(r"count\(([a-z]+)\)="),
}


def column_sum(a: str, b: str) -> list[str]:
    """Schoolbook addition of equal-length digit strings; digits least-significant first."""
    digits, carry = [], 0
    for x, y in zip(reversed(a), reversed(b), strict=True):
        carry, digit = divmod(int(x) + int(y) + carry, 10)
        digits.append(str(digit))
    return [*digits, "1"] if carry else digits


def solve(name: str, prompt: str, reversed_answer: bool = False) -> tuple[str, int]:
    """The answer to ``prompt`` and its operand length, checking the prompt's format."""
    match = PROMPTS[name].fullmatch(prompt)
    assert match, f"malformed {name} prompt {prompt!r}"
    first = match.group(1)
    if name == "add":
        second = match.group(2)
        assert len(first) == len(second)
        assert len(first) == 1 or (first[0] != "0" and second[0] != "0")
        digits = column_sum(first, second)
        return "".join(digits if reversed_answer else reversed(digits)), len(first)
    if name == "order":
        second = match.group(2)
        assert len(set(first)) == len(first) and sorted(first) == sorted(second)
        where = {digit: i for i, digit in enumerate(first)}
        return "".join(str(where[d]) for d in second), len(first)
    if name == "wherex":
        query = match.group(2)
        assert query in first
        return str(first.find(query)), len(first)
    answers = {
        "reverse": "".join(reversed(first)),
        "copy": first,
        "count": str(sum(1 for _ in first)),
    }
    return answers[name], len(first)


def check_examples(cfg: TaskConfig, examples: list[Example], lengths: tuple[int, int]) -> None:
    for example in examples:
        answer, k = solve(cfg.name, example.prompt, cfg.reversed_answer)
        assert example.answer == answer, example
        assert lengths[0] <= k <= lengths[1], example
        assert len(example.answer) <= max_answer_len(cfg)
        assert len(example.text) <= max_line_len(cfg)


VARIANTS = [TaskConfig(name=name) for name in TASKS] + [TaskConfig(reversed_answer=True)]
VARIANT_IDS = [*TASKS, "add-reversed"]


@pytest.fixture(scope="module")
def default_splits() -> dict[TaskConfig, tuple[list[Example], list[Example]]]:
    return {cfg: make_splits(cfg, seed=0) for cfg in VARIANTS}


# ----------------------------------------------------------------------------- formats


def test_solver_agrees_with_the_documented_examples() -> None:
    assert solve("add", "12+89=") == ("101", 2)
    assert solve("add", "5+7=", reversed_answer=True) == ("21", 1)
    assert solve("reverse", "rev(8275106102553610)=") == ("0163552016015728", 16)
    assert solve("order", "order(13597,79351)=") == ("43120", 5)
    assert solve("wherex", "wherex(1845124,4)=") == ("2", 7)
    assert solve("copy", "copy(hello)=") == ("hello", 5)
    assert solve("count", "count(hello)=") == ("5", 5)


@pytest.mark.parametrize("cfg", VARIANTS, ids=VARIANT_IDS)
def test_every_default_example_is_right(cfg: TaskConfig, default_splits) -> None:
    train, test = default_splits[cfg]
    assert len(train) == cfg.train_size and len(test) == cfg.test_size
    check_examples(cfg, train, cfg.train_lengths)
    check_examples(cfg, test, cfg.test_lengths)
    lo, hi = cfg.train_lengths
    assert {solve(cfg.name, e.prompt)[1] for e in train} == set(range(lo, hi + 1))


@pytest.mark.parametrize("cfg", VARIANTS, ids=VARIANT_IDS)
def test_splits_are_distinct_and_disjoint(cfg: TaskConfig, default_splits) -> None:
    train, test = default_splits[cfg]
    train_prompts, test_prompts = {e.prompt for e in train}, {e.prompt for e in test}
    assert len(train_prompts) == len(train) and len(test_prompts) == len(test)
    assert not train_prompts & test_prompts


@pytest.mark.parametrize("cfg", VARIANTS, ids=VARIANT_IDS)
def test_max_lengths_are_reached(cfg: TaskConfig) -> None:
    k = cfg.train_lengths[1]
    longest = {
        "add": f"{'9' * k}+{'9' * k}=",
        "reverse": f"rev({'1' * k})=",
        "order": f"order({'0123456789'[:k]},{'0123456789'[:k]})=",
        "wherex": f"wherex({'0' * (k - 1)}1,1)=",
        "copy": f"copy({'a' * k})=",
        "count": f"count({'a' * k})=",
    }[cfg.name]
    answer, _ = solve(cfg.name, longest, cfg.reversed_answer)
    assert max_answer_len(cfg) == len(answer)
    assert max_line_len(cfg) == len(longest) + len(answer) + 1


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(TASKS),
    lengths=st.lists(st.integers(1, 10), min_size=2, max_size=2).map(sorted),
    test_lengths=st.lists(st.integers(4, 10), min_size=2, max_size=2).map(sorted),
    reversed_answer=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_random_configs_give_right_examples(
    name: str, lengths: list[int], test_lengths: list[int], reversed_answer: bool, seed: int
) -> None:
    lo, hi = lengths
    cfg = TaskConfig(
        name=name,
        min_len=lo,
        max_len=hi,
        test_min_len=test_lengths[0],  # >= 4: plenty of test instances beside the training ones
        test_max_len=test_lengths[1],
        reversed_answer=reversed_answer and name == "add",
        train_size=min(60, tasks._count_in(name, (lo, hi))),
        test_size=30,
    )
    train, test = make_splits(cfg, seed)
    check_examples(cfg, train, cfg.train_lengths)
    check_examples(cfg, test, cfg.test_lengths)
    assert not {e.prompt for e in train} & {e.prompt for e in test}


# ------------------------------------------------------------------------------ splits


def test_same_seed_same_splits_different_seed_different() -> None:
    cfg = TaskConfig(name="wherex", train_size=300, test_size=100)
    assert make_splits(cfg, seed=3) == make_splits(cfg, seed=3)
    assert make_splits(cfg, seed=3) != make_splits(cfg, seed=4)


@pytest.mark.parametrize("name", TASKS)
def test_length_generalisation_split(name: str) -> None:
    test_max = 10 if name == "order" else 12
    cfg = TaskConfig(
        name=name,
        min_len=1,
        max_len=8,
        test_min_len=9,
        test_max_len=test_max,
        train_size=300,
        test_size=200,
    )
    assert cfg.train_lengths == (1, 8) and cfg.test_lengths == (9, test_max)
    train, test = make_splits(cfg, seed=0)
    assert {solve(name, e.prompt)[1] for e in train} <= set(range(1, 9))
    assert {solve(name, e.prompt)[1] for e in test} == set(range(9, test_max + 1))


def test_test_lengths_default_to_the_training_lengths() -> None:
    assert TaskConfig(name="copy", min_len=2, max_len=5).test_lengths == (2, 5)
    assert TaskConfig(name="order").test_lengths == (2, 10)


def test_an_exhausted_instance_space_is_drawn_completely() -> None:
    cfg = TaskConfig(name="copy", min_len=1, max_len=1, train_size=20, test_size=6)
    train, test = make_splits(cfg, seed=0)
    assert {e.prompt for e in train + test} == {f"copy({c})=" for c in "abcdefghijklmnopqrstuvwxyz"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "copy", "min_len": 1, "max_len": 1, "train_size": 27}, "train_size"),
        (
            {"name": "copy", "min_len": 1, "max_len": 1, "train_size": 20, "test_size": 7},
            "test_size",
        ),
        ({"min_len": 2, "test_min_len": 1, "test_max_len": 1, "test_size": 101}, "test_size"),
        ({"name": "order", "min_len": 1, "max_len": 1, "train_size": 11}, "train_size"),
    ],
)
def test_too_small_an_instance_space_is_a_config_error(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match="lower it or widen the lengths") as info:
        make_splits(TaskConfig(**kwargs), seed=0)
    assert info.value.field == field


def test_drawing_gives_up_instead_of_looping_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_count_in", lambda name, lengths: 10**9)  # fool the size check
    cfg = TaskConfig(name="copy", min_len=1, max_len=1, train_size=30)
    with pytest.raises(ConfigError, match="drew only 26 distinct") as info:
        make_splits(cfg, seed=0)
    assert info.value.field == "train_size"


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "sort"}, "task"),
        ({"min_len": 3, "max_len": 2}, "min_len"),
        ({"min_len": 4}, "min_len"),  # above the default max_len of add
        ({"test_min_len": 9}, "test_min_len"),
        ({"name": "order", "max_len": 11}, "max_len"),
        ({"name": "order", "test_max_len": 11}, "test_max_len"),
        ({"min_len": 0}, "min_len"),
        ({"name": "reverse", "reversed_answer": True}, "reversed_answer"),
        ({"max_len": "8"}, "max_len"),
        ({"max_len": 8.0}, "max_len"),
        ({"test_min_len": True}, "test_min_len"),
        ({"train_size": "100"}, "train_size"),
        ({"train_size": 0}, "train_size"),
        ({"test_size": -1}, "test_size"),
        ({"reversed_answer": 1}, "reversed_answer"),
    ],
)
def test_bad_configs_are_config_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        TaskConfig(**kwargs)
    assert info.value.field == field
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------- encoding


def test_vocabulary() -> None:
    assert len(VOCAB) == 96 and VOCAB[0] == "\n" and VOCAB[1:] == "".join(map(chr, range(32, 127)))


@given(st.text(alphabet=VOCAB))
def test_encode_decode_round_trip(text: str) -> None:
    ids = encode(text)
    assert all(0 <= i < len(VOCAB) for i in ids)
    assert decode(ids) == text
    assert decode(torch.tensor(ids, dtype=torch.long)) == text


@pytest.mark.parametrize("text", ["héllo", "a\tb", "\r"])
def test_encode_rejects_characters_outside_the_vocabulary(text: str) -> None:
    with pytest.raises(UserError, match="not in the vocabulary"):
        encode(text)


@pytest.mark.parametrize("ids", [[-100], [96]])
def test_decode_rejects_ids_outside_the_vocabulary(ids: list[int]) -> None:
    with pytest.raises(UserError, match="not in the vocabulary"):
        decode(ids)


# ------------------------------------------------------------------------ packed batches


@pytest.fixture(scope="module")
def add_examples() -> list[Example]:
    return make_splits(TaskConfig(train_size=500, test_size=10), seed=0)[0]


def check_row(row: Tensor, targets: Tensor, lines: set[str]) -> None:
    """Recompute the row's loss mask by brute force from its text."""
    text = decode(row)
    *complete, last = text.split("\n")
    assert all(line + "\n" in lines for line in complete)
    assert any(line.startswith(last) for line in lines)  # a line cut by the row's end
    for t in range(len(text)):
        line_so_far = text[: t + 1].rsplit("\n", 1)[-1]  # the line of token t + 1, before it
        on_answer = "=" in line_so_far
        assert (targets[t].item() != -100) == on_answer, (text, t)
        if on_answer and t + 1 < len(text):
            assert targets[t].item() == row[t + 1].item()
        elif on_answer:  # the last target lies beyond the row
            assert any(line.startswith(line_so_far + VOCAB[targets[t]]) for line in lines)


@pytest.mark.parametrize("seq_len", [3, 64, 256])
def test_packed_batch_rows_and_loss_mask(add_examples: list[Example], seq_len: int) -> None:
    generator = torch.Generator().manual_seed(0)
    idx, targets = packed_batch(add_examples, 8, seq_len, generator)
    for tensor in (idx, targets):
        assert tensor.shape == (8, seq_len) and tensor.dtype == torch.int64
        assert tensor.device.type == "cpu"
    lines = {e.text for e in add_examples}
    for row, row_targets in zip(idx, targets, strict=True):
        check_row(row, row_targets, lines)


def test_packed_batch_by_hand() -> None:
    idx, targets = packed_batch([Example("ab=", "c")], 2, 10, torch.Generator())
    assert [decode(row) for row in idx] == ["ab=c\nab=c\n"] * 2
    kept = [VOCAB[i] if i != -100 else "_" for i in targets[0].tolist()]
    assert "".join(kept) == "__c\n___c\n_"


def test_packed_batch_is_deterministic(add_examples: list[Example]) -> None:
    def batch(seed: int) -> tuple[Tensor, Tensor]:
        return packed_batch(add_examples, 4, 32, torch.Generator().manual_seed(seed))

    assert all(torch.equal(a, b) for a, b in zip(batch(1), batch(1), strict=True))
    assert not torch.equal(batch(1)[0], batch(2)[0])


def test_packed_batch_is_fast(add_examples: list[Example]) -> None:
    generator = torch.Generator().manual_seed(0)
    packed_batch(add_examples, 64, 256, generator)
    start = time.perf_counter()
    for _ in range(10):
        packed_batch(add_examples, 64, 256, generator)
    assert (time.perf_counter() - start) / 10 < 0.05


def test_packed_batch_rejects_characters_outside_the_vocabulary() -> None:
    with pytest.raises(UserError, match="not in the vocabulary"):
        packed_batch([Example("é=", "1")], 2, 8, torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- accuracy


class OracleModel(nn.Module):
    """Puts all mass on the correct next character of the example whose prompt it is fed.

    For prompts in ``no_newline`` it writes the answer, then ``x`` instead of the newline.
    """

    def __init__(self, examples: Sequence[Example], no_newline: frozenset[str] = frozenset()):
        super().__init__()
        self.lines = {e.prompt: e.text for e in examples}
        self.no_newline = no_newline
        self.lengths_seen: list[tuple[int, int]] = []

    def forward(self, idx: Tensor) -> Tensor:
        assert not self.training
        B, T = idx.shape
        self.lengths_seen.append((B, T))
        logits = torch.zeros(B, T, len(VOCAB))
        for b in range(B):
            text = decode(idx[b])
            prompt = text[: text.index("=") + 1]
            line = self.lines[prompt]  # so the row starts with a prompt, at position 0
            next_char = line[T : T + 1] or "\n"  # past the line's end: more newlines
            if prompt in self.no_newline and next_char == "\n":
                next_char = "x"
            logits[b, -1, VOCAB.index(next_char)] = 1.0
        return logits


class NewlineModel(nn.Module):
    def forward(self, idx: Tensor) -> Tensor:
        logits = torch.zeros(*idx.shape, len(VOCAB))
        logits[..., 0] = 1.0
        return logits


@pytest.fixture(scope="module")
def mixed_examples() -> list[Example]:
    """Prompts of many lengths, answers of several lengths."""
    examples = []
    for name in ("add", "wherex", "count"):
        examples += make_splits(TaskConfig(name=name, train_size=40, test_size=1), seed=0)[0]
    return examples


@pytest.mark.parametrize("training", [True, False])
def test_oracle_scores_one(mixed_examples: list[Example], training: bool) -> None:
    model = OracleModel(mixed_examples)
    model.train(training)
    assert accuracy(model, mixed_examples, batch_size=7) == 1.0
    assert model.training == training
    assert max(b for b, _ in model.lengths_seen) <= 7


def test_a_missing_newline_is_wrong(mixed_examples: list[Example]) -> None:
    sabotaged = frozenset(e.prompt for e in mixed_examples[::4])
    model = OracleModel(mixed_examples, no_newline=sabotaged)
    assert accuracy(model, mixed_examples) == pytest.approx(
        1 - len(sabotaged) / len(mixed_examples)
    )


def test_always_newline_scores_zero(mixed_examples: list[Example]) -> None:
    assert accuracy(NewlineModel(), mixed_examples) == 0.0


def test_tiny_transformer_runs(mixed_examples: list[Example]) -> None:
    model = Transformer(ModelConfig(d_model=16, n_layers=1, n_heads=2))
    for training in (True, False):
        model.train(training)
        assert 0.0 <= accuracy(model, mixed_examples[::10], batch_size=4) <= 1.0
        assert model.training == training


def test_learned_positions_too_short_for_the_lines() -> None:
    model = Transformer(
        ModelConfig(d_model=16, n_layers=1, n_heads=2, pos_encoding="learned", max_seq_len=8)
    )
    with pytest.raises(UserError, match="max_seq_len=8"):
        accuracy(model, [Example("123+456=", "579")])
