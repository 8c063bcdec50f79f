"""Synthetic tasks: every answer checked by an independent solver, splits, packing, accuracy."""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from nopelab.config import ModelConfig
from nopelab.errors import ConfigError, UserError
from nopelab.models.transformer import Transformer
from nopelab.training import tasks
from nopelab.training.task_config import (
    LAYOUTS,
    LOSS_MODES,
    TASKS,
    VOCAB,
    ZUO_TASKS,
    TaskConfig,
    max_answer_len,
    max_line_len,
    max_prompt_len,
)
from nopelab.training.task_kinds import TASK_KINDS
from nopelab.training.tasks import (
    Example,
    accuracy,
    decode,
    encode,
    exact_matches,
    greedy_answers,
    left_pad,
    make_splits,
    packed_batch,
)

# --------------------------------------------------------------- an independent solver

PROMPTS = {
    "zuo-add": re.compile(r"\$(\d+)\+(\d+)="),
    "add": re.compile(r"(\d+)\+(\d+)="),
    "reverse": re.compile(r"rev\((\d+)\)="),
    "order": re.compile(r"order\((\d+),(\d+)\)="),
    "wherex": re.compile(r"wherex\((\d+),(\d)\)="),
    "copy": re.compile(r"copy\(([a-z]+)\)="),
    "dup": re.compile(r"dup\(([a-z]+)\)="),
    "count": re.compile(r"count\(([a-z]+)\)="),
    "sort": re.compile(r"sort\(([a-z]+)\)="),
    "sum": re.compile(r"sum\((\d+)\)="),
    "parity": re.compile(r"parity\(([01]+)\)="),
    "scan": re.compile(r"scan\(([wkrjt<>oa23&^]+)\)="),
}

SCAN_WORDS = {  # SCAN's words and their characters in the scan task
    "walk": "w", "look": "k", "run": "r", "jump": "j", "turn": "t", "left": "<", "right": ">",
    "opposite": "o", "around": "a", "twice": "2", "thrice": "3", "and": "&", "after": "^",
}  # fmt: skip
SCAN_ACTIONS = {"W": "WALK", "K": "LOOK", "R": "RUN", "J": "JUMP", "<": "LTURN", ">": "RTURN"}
SCAN_PHRASE = re.compile(r"([wkrjt])(?:([oa]?)([<>]))?([23]?)")


def interpret_scan(command: str) -> str:
    """SCAN's semantics, read off the command by a parser (the task enumerates instead)."""
    if "&" in command or "^" in command:
        first, glue, second = re.split(r"([&^])", command)
        a, b = interpret_scan(first), interpret_scan(second)
        return a + b if glue == "&" else b + a
    match = SCAN_PHRASE.fullmatch(command)
    assert match, f"malformed SCAN phrase {command!r}"
    verb, how, side, times = match.groups()
    act = "" if verb == "t" else verb.upper()
    assert act or side, f"turn without a direction: {command!r}"
    if side is None:
        phrase = act
    else:
        phrase = {"": side + act, "o": side + side + act, "a": (side + act) * 4}[how]
    return phrase * int(times or 1)


def column_sum(a: str, b: str) -> list[str]:
    """Schoolbook addition of equal-length digit strings; digits least-significant first."""
    digits, carry = [], 0
    for x, y in zip(reversed(a), reversed(b), strict=True):
        carry, digit = divmod(int(x) + int(y) + carry, 10)
        digits.append(str(digit))
    return [*digits, "1"] if carry else digits


def solve_zuo(name: str, prompt: str) -> tuple[str, int]:
    """The answer to a prompt in Zuo's format and its longest operand, checking the format:
    numbers without leading zeros, add wrapped in ``$`` with the sum reversed."""
    match = PROMPTS["zuo-add" if name == "add" else name].fullmatch(prompt)
    assert match, f"malformed zuo {name} prompt {prompt!r}"
    numbers = match.groups()[: 2 if name == "add" else 1]
    if name != "order":  # order's arguments are digit strings
        assert all(n == "0" or n[0] != "0" for n in numbers), prompt
    if name == "add":
        a, b = numbers
        width = max(len(a), len(b))
        digits = column_sum(a.zfill(width), b.zfill(width))
        return ("".join(digits).rstrip("0") or "0") + "$", width  # no leading zero in the sum
    answer, _ = solve(name, prompt)
    return answer, max(len(n) for n in numbers)


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
        "reverse": lambda: "".join(reversed(first)),
        "copy": lambda: first,
        "dup": lambda: first + first,
        "count": lambda: str(sum(1 for _ in first)),
        "sort": lambda: "".join(sorted(first, key=ord)),
        "sum": lambda: str(sum(int(d) for d in first) % 10),
        "parity": lambda: "1" if first.count("1") % 2 else "0",
    }
    if name == "scan":  # a SCAN command's length is its number of actions
        actions = interpret_scan(first)
        return actions, len(actions)
    return answers[name](), len(first)


def check_examples(cfg: TaskConfig, examples: list[Example], lengths: tuple[int, int]) -> None:
    for example in examples:
        if cfg.resolved_format == "zuo":
            answer, k = solve_zuo(cfg.name, example.prompt)
        else:
            answer, k = solve(cfg.name, example.prompt, cfg.reversed_answer)
        assert example.answer == answer, example
        assert lengths[0] <= k <= lengths[1], example
        assert len(example.answer) <= max_answer_len(cfg)
        assert len(example.prompt) <= max_prompt_len(cfg)
        assert len(example.text) <= max_line_len(cfg)


VARIANTS = (
    [TaskConfig(name=name, format="plain") for name in TASKS]
    + [TaskConfig(format="plain", reversed_answer=True)]
    + [TaskConfig(name=name) for name in ZUO_TASKS]
)
VARIANT_IDS = [*TASKS, "add-reversed", *(f"zuo-{name}" for name in ZUO_TASKS)]


@pytest.fixture(scope="module")
def default_splits() -> dict[TaskConfig, tuple[list[Example], list[Example]]]:
    return {cfg: make_splits(cfg, seed=0) for cfg in VARIANTS}


# ----------------------------------------------------------------------------- formats


def test_zuo_formats_by_hand() -> None:
    assert solve_zuo("add", "$50+148=") == ("891$", 3)
    assert solve_zuo("reverse", "rev(5973245481290159)=") == ("9510921845423795", 16)
    assert solve_zuo("order", "order(74283,87234)=") == ("30241", 5)
    assert solve_zuo("wherex", "wherex(360465066,6)=") == ("1", 9)
    assert TASK_KINDS["add"].example(("50", "148"), "zuo") == Example("$50+148=", "891$")
    assert TASK_KINDS["add"].example(("5", "5"), "zuo").text == "$5+5=01$\n"
    assert TASK_KINDS["reverse"].example(("5973245481290159",), "zuo").text == (
        "rev(5973245481290159)=9510921845423795\n"
    )
    assert TASK_KINDS["order"].example(("74283", "87234"), "zuo").answer == "30241"
    assert TASK_KINDS["wherex"].example(("360465066", "6"), "zuo").answer == "1"


@pytest.mark.parametrize(("name", "top"), [("add", 9), ("reverse", 22), ("wherex", 20)])
def test_zuo_lengths_follow_uniform_integers(name: str, top: int, default_splits) -> None:
    """Numbers are uniform below 10**max_len: 90 % have max_len digits (add: 81 % of lines 3+3)."""
    train, _ = default_splits[TaskConfig(name=name)]
    share = sum(len(e.prompt) == top for e in train) / len(train)
    assert share == pytest.approx(0.81 if name == "add" else 0.9, abs=0.02)


def test_solver_agrees_with_the_documented_examples() -> None:
    assert solve("add", "12+89=") == ("101", 2)
    assert solve("add", "5+7=", reversed_answer=True) == ("21", 1)
    assert solve("reverse", "rev(8275106102553610)=") == ("0163552016015728", 16)
    assert solve("order", "order(13597,79351)=") == ("43120", 5)
    assert solve("wherex", "wherex(1845124,4)=") == ("2", 7)
    assert solve("copy", "copy(hello)=") == ("hello", 5)
    assert solve("dup", "dup(hello)=") == ("hellohello", 5)
    assert solve("count", "count(hello)=") == ("5", 5)
    assert solve("sort", "sort(hello)=") == ("ehllo", 5)
    assert solve("sum", "sum(3141)=") == ("9", 4)
    assert solve("parity", "parity(1011)=") == ("1", 4)
    assert solve("scan", "scan(jo<3&w)=") == ("<<J<<J<<JW", 10)


@pytest.mark.parametrize(
    ("words", "actions"),
    [  # examples of Lake and Baroni's SCAN paper
        ("jump", "JUMP"),
        ("jump left", "LTURN JUMP"),
        ("jump around right", "RTURN JUMP RTURN JUMP RTURN JUMP RTURN JUMP"),
        ("turn left twice", "LTURN LTURN"),
        ("jump thrice", "JUMP JUMP JUMP"),
        ("jump opposite left and walk thrice", "LTURN LTURN JUMP WALK WALK WALK"),
        (
            "jump opposite left after walk around left",
            "LTURN WALK LTURN WALK LTURN WALK LTURN WALK LTURN LTURN JUMP",
        ),
    ],
)
def test_scan_follows_the_papers_examples(words: str, actions: str) -> None:
    command = "".join(SCAN_WORDS[w] for w in words.split())
    example = TASK_KINDS["scan"].example((command,), "plain")
    assert example.prompt == f"scan({command})="
    assert " ".join(SCAN_ACTIONS[a] for a in example.answer) == actions
    assert interpret_scan(command) == example.answer


@functools.cache
def scan_grammar() -> tuple[str, ...]:
    """Every command SCAN's grammar derives, expanded word by word, then written a character a
    word."""
    verbs = ["walk", "look", "run", "jump"]
    directions = [f"{d} {side}" for d in [*verbs, "turn"] for side in ("left", "right")]
    views = [
        *verbs,
        *directions,
        *(f"{v} {how} {side}" for v in [*verbs, "turn"] for how in ("opposite", "around")
          for side in ("left", "right")),
    ]  # fmt: skip
    singles = [f"{v}{times}" for v in views for times in ("", " twice", " thrice")]
    glued = [f"{a} {glue} {b}" for a in singles for b in singles for glue in ("and", "after")]
    return tuple("".join(SCAN_WORDS[w] for w in c.split()) for c in singles + glued)


def test_scan_has_every_command_of_the_grammar_once() -> None:
    """SCAN's 20 910 commands, counted per number of actions as the task counts them."""
    commands = scan_grammar()
    assert len(commands) == len(set(commands)) == 20_910
    lengths: dict[int, int] = {}
    for command in commands:
        k = len(interpret_scan(command))
        lengths[k] = lengths.get(k, 0) + 1
    kind = TASK_KINDS["scan"]
    assert {k: kind.count("plain", k) for k in range(1, 49) if kind.count("plain", k)} == lengths
    assert kind.count_in("plain", (1, 48)) == 20_910 and kind.count("plain", 23) == 0
    answers = {c: kind.example((c,), "plain").answer for c in commands}
    assert answers == {c: interpret_scan(c) for c in commands}


@pytest.mark.parametrize("cfg", VARIANTS, ids=VARIANT_IDS)
def test_every_default_example_is_right(cfg: TaskConfig, default_splits) -> None:
    train, test = default_splits[cfg]
    assert len(train) == cfg.train_size and len(test) == cfg.test_size
    check_examples(cfg, train, cfg.train_lengths)
    check_examples(cfg, test, cfg.test_lengths)
    lo, hi = cfg.train_lengths
    if cfg.resolved_format == "plain":
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
        "wherex": f"wherex({'1' * (k - 1)}2,2)=",
        "copy": f"copy({'a' * k})=",
        "dup": f"dup({'a' * k})=",
        "count": f"count({'a' * k})=",
        "sort": f"sort({'a' * k})=",
        "sum": f"sum({'9' * k})=",
        "parity": f"parity({'1' * k})=",
        "scan": "scan(to<2&to<2)=",  # a longest command; its line is not the longest one
    }[cfg.name]
    if cfg.resolved_format == "zuo":
        longest = "$" * (cfg.name == "add") + longest
        answer, _ = solve_zuo(cfg.name, longest)
    else:
        answer, _ = solve(cfg.name, longest, cfg.reversed_answer)
    if cfg.name == "scan":  # prompt and answer grow apart: the longest of each, brute force
        lines = [(f"scan({c})=", a) for c in scan_grammar() if len(a := interpret_scan(c)) <= k]
        assert max_answer_len(cfg) == max(len(a) for _, a in lines)
        assert max_prompt_len(cfg) == max(len(p) for p, _ in lines) == len(longest)
        assert max_line_len(cfg) == max(len(p) + len(a) + 1 for p, a in lines)
        return
    assert max_answer_len(cfg) == len(answer)
    assert max_prompt_len(cfg) == len(longest)
    assert max_line_len(cfg) == len(longest) + len(answer) + 1


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(TASKS),
    zuo=st.booleans(),
    lengths=st.lists(st.integers(1, 10), min_size=2, max_size=2).map(sorted),
    test_lengths=st.lists(st.integers(4, 10), min_size=2, max_size=2).map(sorted),
    reversed_answer=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_random_configs_give_right_examples(
    name: str,
    zuo: bool,
    lengths: list[int],
    test_lengths: list[int],
    reversed_answer: bool,
    seed: int,
) -> None:
    lo, hi = lengths
    fmt = "zuo" if zuo and name in ZUO_TASKS else "plain"
    if name == "parity":  # 2^k bit strings: from 8 bits on, plenty beside the training ones
        test_lengths = [k + 4 for k in test_lengths]
    cfg = TaskConfig(
        name=name,
        format=fmt,
        min_len=lo,
        max_len=hi,
        test_min_len=test_lengths[0],  # >= 4: plenty of test instances beside the training ones
        test_max_len=test_lengths[1],
        reversed_answer=reversed_answer and name == "add" and fmt == "plain",
        train_size=min(60, TASK_KINDS[name].count_in(fmt, (lo, hi))),
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
        format="plain",
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
    assert TaskConfig(name="order", format="plain").test_lengths == (2, 10)
    assert TaskConfig(name="order").test_lengths == (2, 5)
    assert TaskConfig(name="wherex").train_lengths == (1, 9)


def test_an_exhausted_instance_space_is_drawn_completely() -> None:
    cfg = TaskConfig(name="copy", min_len=1, max_len=1, train_size=20, test_size=6)
    train, test = make_splits(cfg, seed=0)
    assert {e.prompt for e in train + test} == {f"copy({c})=" for c in "abcdefghijklmnopqrstuvwxyz"}


SMALL_SPACES = [
    (name, fmt, k)
    for name, kind in TASK_KINDS.items()
    for fmt in ("plain", "zuo")
    if fmt == "plain" or kind.zuo_lengths is not None
    for k in (1, 2, 3)
    if kind.count(fmt, k) <= 1000 and k <= kind.limit
]


@pytest.mark.parametrize(("name", "fmt", "k"), SMALL_SPACES)
def test_a_task_counts_the_prompts_it_can_draw(name: str, fmt: str, k: int) -> None:
    """Every registered task: drawing operands of length k many times finds exactly as many
    distinct prompts as the task counts (a coupon collector: 20 000 draws cover 1000 prompts)."""
    kind, rng = TASK_KINDS[name], random.Random(0)
    prompts = {kind.example(kind.draw(fmt, (k, k), rng), fmt).prompt for _ in range(20_000)}
    assert len(prompts) == kind.count(fmt, k) == kind.count_in(fmt, (k, k))
    longest = kind.example(kind.longest(k), fmt)
    assert max(len(kind.example(kind.draw(fmt, (k, k), rng), fmt).text) for _ in range(500)) <= len(
        longest.text
    )


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
    monkeypatch.setattr(TASK_KINDS["copy"], "count_in", lambda *args: 10**9)  # fool the size check
    cfg = TaskConfig(name="copy", min_len=1, max_len=1, train_size=30)
    with pytest.raises(ConfigError, match="drew only 26 distinct") as info:
        make_splits(cfg, seed=0)
    assert info.value.field == "train_size"


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "multiply"}, "task"),
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
        ({"reversed_answer": True}, "reversed_answer"),  # Zuo's add is reversed already
        ({"format": "lee"}, "format"),
        ({"format": 1}, "format"),
        ({"name": "copy", "format": "zuo"}, "format"),
        ({"layout": "stacked"}, "layout"),
        ({"loss_mode": "prompt"}, "loss_mode"),
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
            start = len(text) - len(text.lstrip("\n"))  # after any left padding
            prompt = text[start : text.index("=", start) + 1]
            line = self.lines[prompt]  # so the row holds a prompt right after its padding
            for t in range(start + len(prompt) - 1, T):
                next_char = line[t + 1 - start : t + 2 - start] or "\n"  # then more newlines
                if prompt in self.no_newline and next_char == "\n":
                    next_char = "x"
                logits[b, t, VOCAB.index(next_char)] = 1.0
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


@pytest.mark.parametrize("pad_to", [None, 24])
@pytest.mark.parametrize("training", [True, False])
def test_oracle_scores_one(mixed_examples: list[Example], training: bool, pad_to) -> None:
    model = OracleModel(mixed_examples)
    model.train(training)
    assert accuracy(model, mixed_examples, batch_size=7, pad_to=pad_to) == 1.0
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


# ------------------------------------------------------------- batched decoding, layouts


def decode_alone(model: nn.Module, example: Example, pad_to: int | None = None) -> str:
    """Greedy decoding of one prompt, token by token, with nothing else in the batch."""
    text = (
        example.prompt if pad_to is None else "\n" * (pad_to - len(example.prompt)) + example.prompt
    )
    written = ""
    with torch.no_grad():
        while len(written) < len(example.answer) + 1 and not written.endswith("\n"):
            ids = torch.tensor([encode(text + written)])
            written += VOCAB[int(model(ids)[0, -1].argmax())]
    return written


def another(character: str) -> str:
    return "1" if character != "1" else "2"


class EarlyNewlines(nn.Module):
    """A transformer whose newline logit is raised after some tokens, so that rows of a batch
    stop at different steps (a random model rarely writes a newline)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model, self.cfg = model, model.cfg

    def forward(self, idx: Tensor) -> Tensor:
        logits = self.model(idx)
        logits[..., 0] += 5.0 * (idx % 5 == 0)
        return logits


@pytest.mark.parametrize("pad_to", [None, 24])
@pytest.mark.parametrize("pos_encoding", ["none", "learned", "rope"])
def test_batched_decoding_equals_one_by_one(
    mixed_examples: list[Example], pos_encoding: str, pad_to: int | None
) -> None:
    torch.manual_seed(0)  # large weights: logits far apart, varied answers
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, pos_encoding=pos_encoding, init_std=0.3)
    model = EarlyNewlines(Transformer(cfg)).eval()
    examples = mixed_examples[::3]
    batched = greedy_answers(model, examples, pad_to=pad_to, batch_size=16)
    assert batched == [decode_alone(model, e, pad_to) for e in examples]
    assert len(set(batched)) > len(examples) // 4  # not one constant answer
    assert any(w.endswith("\n") for w in batched) and any(not w.endswith("\n") for w in batched)


@pytest.mark.parametrize("pad_to", [None, 24])
@pytest.mark.parametrize("pos_encoding", ["none", "learned", "rope", "alibi", "t5"])
def test_teacher_forcing_judges_as_decoding_does(
    mixed_examples: list[Example], pos_encoding: str, pad_to: int | None
) -> None:
    """A causal model is judged from one teacher-forced pass; each verdict equals what greedy
    decoding writes. The answers are the model's own writing (right), that writing with its
    first or last character or its newline changed, and the task's answers."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, pos_encoding=pos_encoding, init_std=0.3)
    model = EarlyNewlines(Transformer(cfg)).eval()
    # a long budget, so that most writings end in a newline of the model's own
    prompts = [Example(e.prompt, "0" * 12) for e in mixed_examples[::3]]
    examples = list(mixed_examples[::3])
    for e, w in zip(prompts, greedy_answers(model, prompts, pad_to=pad_to), strict=True):
        own = w.removesuffix("\n")
        examples += [Example(e.prompt, own), Example(e.prompt, own + "7")]
        if own:  # wrong in the first character only, or in the last only
            examples += [
                Example(e.prompt, another(own[0]) + own[1:]),
                Example(e.prompt, own[:-1] + another(own[-1])),
            ]
    decoded = [
        w == e.answer + "\n"
        for w, e in zip(greedy_answers(model, examples, pad_to=pad_to), examples, strict=True)
    ]
    assert exact_matches(model, examples, pad_to=pad_to, batch_size=16) == decoded
    assert sum(decoded) >= 8 and not all(decoded)  # both verdicts, many times


def test_a_bidirectional_model_is_decoded(
    mixed_examples: list[Example], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teacher forcing would show a bidirectional model its answer: it is decoded instead."""
    monkeypatch.setattr(tasks, "_teacher_forced", lambda *_: pytest.fail("teacher forced"))
    model = Transformer(ModelConfig(d_model=16, n_layers=1, n_heads=2, bidirectional=True))
    written = greedy_answers(model, mixed_examples[:8])
    right = [w == e.answer + "\n" for w, e in zip(written, mixed_examples[:8], strict=True)]
    assert exact_matches(model, mixed_examples[:8]) == right


def test_left_pad() -> None:
    assert left_pad("$1+2=", 8) == "\n\n\n$1+2="
    assert left_pad("$1+2=", 5) == "$1+2="
    with pytest.raises(ConfigError, match="shorter than the prompt") as info:
        left_pad("$1+2=", 4)
    assert info.value.field == "seq_len"


def test_zuo_windows_with_every_character() -> None:
    """Zuo's train.py: windows of the shuffled, concatenated lines that start anywhere, the
    loss on every character."""
    cfg = TaskConfig(train_size=300, test_size=10, layout="windows", loss_mode="all")
    train, _ = make_splits(cfg, seed=0)
    stream = tasks.LineStream(train, seed=0)
    text = decode(stream.tokens)
    assert sorted(text.splitlines(keepends=True)) == sorted(e.text for e in train)
    idx, targets = stream.batch(64, 20, torch.Generator().manual_seed(0), "all")
    assert idx.shape == targets.shape == (64, 20)
    for row, row_targets in zip(idx, targets, strict=True):
        window = decode(row) + VOCAB[int(row_targets[-1])]
        assert window in text  # a contiguous piece of the stream
        assert torch.equal(row_targets[:-1], row[1:])
    starts = {decode(row)[0] for row in idx}
    assert starts - {"$"}  # windows start mid-line too


@pytest.mark.parametrize("loss_mode", LOSS_MODES)
def test_answer_mask_of_windows(loss_mode: str) -> None:
    stream = tasks.LineStream([Example("ab=", "c")], seed=0)
    idx, targets = stream.batch(1, 4, torch.Generator().manual_seed(0), loss_mode)
    assert decode(idx[0]) in ("ab=c", "b=c\n", "=c\na", "c\nab")  # 5 characters, start anywhere
    text = decode(idx[0]) + VOCAB[int(targets[0, -1])] if loss_mode == "all" else None
    if loss_mode == "all":
        assert text in "ab=c\nab=c\n"
    else:
        kept = "".join("_" if t < 0 else VOCAB[t] for t in targets[0].tolist())
        assert kept.replace("_", "") in ("c\n", "c", "\n", "")


@pytest.mark.parametrize("loss_mode", LOSS_MODES)
def test_padded_rows_by_hand(loss_mode: str) -> None:
    rows = tasks.PaddedLines([Example("$1+2=", "3$"), Example("$10+2=", "21$")], 6, 10)
    idx, targets = rows.batch(64, 12, torch.Generator().manual_seed(0), loss_mode)
    assert idx.shape == targets.shape == (64, 12)
    seen = {decode(row) for row in idx}
    assert seen == {"\n$1+2=3$\n\n\n\n", "$10+2=21$\n\n\n"}
    for row, row_targets in zip(idx, targets, strict=True):
        kept = "".join("_" if t < 0 else VOCAB[t] for t in row_targets.tolist())
        short = decode(row).startswith("\n")
        if loss_mode == "answer":
            assert kept == ("_____3$\n____" if short else "_____21$\n___")
        else:
            assert kept == ("$1+2=3$\n____" if short else "10+2=21$\n___")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_trains_the_answers(layout: str) -> None:
    """Through the source: each layout's answer targets are the right answers."""
    from nopelab.training.sources import TaskSource

    cfg = TaskConfig(name="wherex", train_size=200, test_size=20, layout=layout)
    source = TaskSource(cfg, seed=0, eval_samples=20)
    idx, targets = source.batch(16, max_line_len(cfg), torch.Generator().manual_seed(1))
    answers = {e.prompt: e.answer for e in source.train}
    for row, row_targets in zip(idx, targets, strict=True):
        text = decode(row)
        for t in (row_targets >= 0).nonzero().flatten().tolist():
            line = text[: t + 1].rsplit("\n", 1)[-1]  # the line so far, up to token t
            whole = layout != "windows" or "\n" in text[: t + 1]  # a window's first line is cut
            if line and whole:  # a target inside a line: the answer's next character
                prompt, _, written = line.partition("=")
                assert (answers[prompt + "="] + "\n")[len(written)] == VOCAB[row_targets[t]]


def test_prompts_are_left_padded_test_prompts() -> None:
    from nopelab.training.sources import TaskSource

    source = TaskSource(TaskConfig(train_size=100, test_size=20), seed=0, eval_samples=20)
    ids = source.prompts(30, 12, torch.Generator().manual_seed(0))
    assert ids.shape == (30, 12)
    texts = [decode(row) for row in ids]
    test_prompts = [e.prompt for e in source.test]
    assert all(text.lstrip("\n") in test_prompts for text in texts)
    assert len({t.lstrip("\n") for t in texts[:20]}) == 20  # without replacement first
    with pytest.raises(ConfigError, match="shorter than the longest add prompt") as info:
        source.prompts(4, 8, torch.Generator())
    assert info.value.field == "seq_len"


def test_windows_longer_than_the_test_lines_are_refused_before_training() -> None:
    from nopelab.config import ModelConfig as Model
    from nopelab.training.sources import TaskSource

    source = TaskSource(TaskConfig(train_size=300, test_size=5, layout="windows"), 0, 5)
    source.check_model(Model(), 32)  # five lines hold more than 33 characters
    with pytest.raises(ConfigError, match="longer than all test lines") as info:
        source.check_model(Model(), 256)
    assert info.value.field == "seq_len"
