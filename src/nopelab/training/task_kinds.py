"""The synthetic tasks, one class each: what a line says, how its operands are drawn, its
longest line and how many distinct prompts a length has.

Adding a task is one class here, registered with :func:`task`, and its name in :data:`Task`
(the choices the command line shows); ``tests/unit/training/test_tasks.py`` then checks it against
an independent solver once its prompt pattern is added there.
"""

from __future__ import annotations

import functools
import math
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

Task = Literal[
    "add", "reverse", "order", "wherex", "copy", "dup", "count", "sort", "sum", "parity", "scan"
]
MAX_LEN = 1024  # the longest operand a task allows unless it says otherwise
DIGITS = string.digits
LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class Example:
    """One task instance: the prompt (ending in ``=``) and the answer that follows it."""

    prompt: str
    answer: str

    @property
    def text(self) -> str:
        return self.prompt + self.answer + "\n"


Operands = tuple[str, ...]


class TaskKind:
    """One task. The default (lo, hi) operand lengths in the ``plain`` format (a length uniform
    over the range, every operand that long) and, for a task that has it, in Zuo's format
    (``zuo``: numbers uniform below 10**hi, as in Zuo et al.'s data files); ``limit``: the
    longest operand allowed."""

    name: ClassVar[str]
    plain_lengths: ClassVar[tuple[int, int]]
    zuo_lengths: ClassVar[tuple[int, int] | None] = None
    limit: ClassVar[int] = MAX_LEN

    def default_lengths(self, fmt: str) -> tuple[int, int]:
        lengths = self.zuo_lengths if fmt == "zuo" else self.plain_lengths
        if lengths is None:
            raise ValueError(f"{self.name} has no {fmt} format")
        return lengths

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        """The line of one instance, its answer computed from the operands."""
        raise NotImplementedError

    def draw_zuo(self, lengths: tuple[int, int], rng: random.Random) -> Operands:
        """Random operands in Zuo's format (only for tasks that have it)."""
        raise NotImplementedError

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        """Random operands of length ``k``."""
        raise NotImplementedError

    def longest(self, k: int) -> Operands:
        """Operands of length ``k`` whose line is the longest one of that length."""
        raise NotImplementedError

    def extremes(self, k: int) -> tuple[Operands, ...]:
        """Operands whose lines hold, between them, the longest prompt, answer and line of
        lengths up to ``k`` (a task whose lines all grow with the length: :meth:`longest`)."""
        return (self.longest(k),)

    def count(self, fmt: str, k: int) -> int:
        """How many distinct prompts of length ``k`` exist."""
        raise NotImplementedError

    def draw(self, fmt: str, lengths: tuple[int, int], rng: random.Random) -> Operands:
        """Random operands: Zuo's law of lengths (``zuo``) or a uniform length (``plain``)."""
        if fmt == "zuo":
            return self.draw_zuo(lengths, rng)
        return self.draw_plain(rng.randint(*lengths), rng)

    def count_in(self, fmt: str, lengths: tuple[int, int]) -> int:
        """How many distinct prompts have lengths in ``lengths`` (inclusive)."""
        lo, hi = lengths
        return sum(self.count(fmt, k) for k in range(lo, hi + 1))


TASK_KINDS: dict[str, TaskKind] = {}


def task(cls: type[TaskKind]) -> type[TaskKind]:
    """Register a task class under its name."""
    TASK_KINDS[cls.name] = cls()
    return cls


def _number(lengths: tuple[int, int], rng: random.Random) -> str:
    """A uniform integer below 10**hi without leading zeros, redrawn until it has >= lo digits."""
    lo, hi = lengths
    while len(text := str(rng.randrange(10**hi))) < lo:
        pass
    return text


def _numbers_of_length(k: int) -> int:
    """How many integers have exactly k digits (written without leading zeros)."""
    return 10 if k == 1 else 9 * 10 ** (k - 1)


@task
class Add(TaskKind):
    """``$50+148=891$`` (zuo: the sum least-significant digit first) or ``123+45=168``."""

    name = "add"
    zuo_lengths = (1, 3)
    plain_lengths = (1, 3)

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        a, b = operands
        total = str(int(a) + int(b))
        if fmt == "zuo":
            return Example(f"${a}+{b}=", total[::-1] + "$")
        return Example(f"{a}+{b}=", total[::-1] if reversed_answer else total)

    def draw_zuo(self, lengths: tuple[int, int], rng: random.Random) -> Operands:
        return _number(lengths, rng), _number(lengths, rng)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        low = 10 ** (k - 1) if k > 1 else 0  # no leading zero
        return str(rng.randrange(low, 10**k)), str(rng.randrange(low, 10**k))

    def longest(self, k: int) -> Operands:
        return "9" * k, "9" * k  # a carry out of the top digit

    def count(self, fmt: str, k: int) -> int:
        return _numbers_of_length(k) ** 2  # both operands of length k

    def count_in(self, fmt: str, lengths: tuple[int, int]) -> int:
        if fmt != "zuo":
            return super().count_in(fmt, lengths)
        lo, hi = lengths  # the two operands' lengths are drawn independently
        return sum(_numbers_of_length(k) for k in range(lo, hi + 1)) ** 2


@task
class Reverse(TaskKind):
    """``rev(5973245481290159)=9510921845423795``."""

    name = "reverse"
    zuo_lengths = (1, 16)
    plain_lengths = (1, 16)

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (digits,) = operands
        return Example(f"rev({digits})=", digits[::-1])

    def draw_zuo(self, lengths: tuple[int, int], rng: random.Random) -> Operands:
        return (_number(lengths, rng),)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        return ("".join(rng.choices(DIGITS, k=k)),)

    def longest(self, k: int) -> Operands:
        return ("1" * k,)

    def count(self, fmt: str, k: int) -> int:
        return _numbers_of_length(k) if fmt == "zuo" else 10**k


@task
class Order(TaskKind):
    """``order(74283,87234)=30241``: where each digit of the second argument is in the first."""

    name = "order"
    zuo_lengths = (2, 5)
    plain_lengths = (2, 10)
    limit = 10  # the first argument's digits are distinct

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        first, second = operands
        return Example(f"order({first},{second})=", "".join(str(first.index(d)) for d in second))

    def draw_zuo(self, lengths: tuple[int, int], rng: random.Random) -> Operands:
        first = "".join(rng.sample(DIGITS, len(_number(lengths, rng))))
        return first, "".join(rng.sample(first, len(first)))

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        first = "".join(rng.sample(DIGITS, k))
        return first, "".join(rng.sample(first, k))

    def longest(self, k: int) -> Operands:
        return DIGITS[:k], DIGITS[:k]

    def count(self, fmt: str, k: int) -> int:
        return math.perm(10, k) * math.factorial(k)  # k distinct digits, then a permutation


@task
class WhereX(TaskKind):
    """``wherex(360465066,6)=1``: the first position of a digit in a string."""

    name = "wherex"
    zuo_lengths = (1, 9)
    plain_lengths = (1, 16)

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        digits, x = operands
        return Example(f"wherex({digits},{x})=", str(digits.index(x)))

    def draw_zuo(self, lengths: tuple[int, int], rng: random.Random) -> Operands:
        digits = _number(lengths, rng)
        return digits, rng.choice(digits)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        digits = "".join(rng.choices(DIGITS, k=k))
        return digits, rng.choice(digits)

    def longest(self, k: int) -> Operands:
        return ("1" + "0" * (k - 2) + "2", "2") if k > 1 else ("1", "1")

    def count(self, fmt: str, k: int) -> int:  # summed over strings: their distinct digits
        if fmt == "plain":
            return 10 * (10**k - 9**k)
        return 10 if k == 1 else 9 * 10**k - 9 ** (k + 1)


class _Letters(TaskKind):
    """A task on a string of lowercase letters."""

    plain_lengths = (1, 16)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        return ("".join(rng.choices(LETTERS, k=k)),)

    def longest(self, k: int) -> Operands:
        return ("a" * k,)

    def count(self, fmt: str, k: int) -> int:
        return 26**k


@task
class Copy(_Letters):
    """``copy(abc)=abc``."""

    name = "copy"

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (letters,) = operands
        return Example(f"copy({letters})=", letters)


@task
class Duplicate(_Letters):
    """``dup(abc)=abcabc``: the letters twice (copy with a repeat)."""

    name = "dup"

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (letters,) = operands
        return Example(f"dup({letters})=", letters * 2)


@task
class Count(_Letters):
    """``count(abc)=3``."""

    name = "count"

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (letters,) = operands
        return Example(f"count({letters})=", str(len(letters)))


@task
class Sort(_Letters):
    """``sort(cab)=abc``: the letters in alphabetical order (Kazemnejad et al.'s sorting)."""

    name = "sort"

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (letters,) = operands
        return Example(f"sort({letters})=", "".join(sorted(letters)))


class _Symbols(TaskKind):
    """A task on a string of symbols drawn from ``alphabet``."""

    alphabet: ClassVar[str]
    plain_lengths = (1, 16)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        return ("".join(rng.choices(self.alphabet, k=k)),)

    def longest(self, k: int) -> Operands:
        return (self.alphabet[-1] * k,)

    def count(self, fmt: str, k: int) -> int:
        return len(self.alphabet) ** k


@task
class Sum(_Symbols):
    """``sum(3141)=9``: the digits' sum modulo 10 (Kazemnejad et al.'s summation)."""

    name = "sum"
    alphabet = DIGITS

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (digits,) = operands
        return Example(f"sum({digits})=", str(sum(map(int, digits)) % 10))


@task
class Parity(_Symbols):
    """``parity(1011)=1``: whether the bit string holds an odd number of ones."""

    name = "parity"
    alphabet = "01"

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (bits,) = operands
        return Example(f"parity({bits})=", str(bits.count("1") % 2))


SCAN_VERBS = {"w": "W", "k": "K", "r": "R", "j": "J"}  # walk, look, run, jump: their actions
SCAN_SIDES = "<>"  # left, right: each also the action of turning that way


def _scan_views() -> Iterator[tuple[str, str]]:
    """SCAN's V: a verb, with a direction, opposite or around one (``turn`` is ``t``)."""
    yield from SCAN_VERBS.items()
    for verb, act in [*SCAN_VERBS.items(), ("t", "")]:
        for side in SCAN_SIDES:
            yield verb + side, side + act
            yield verb + "o" + side, side + side + act
            yield verb + "a" + side, (side + act) * 4


@functools.cache
def scan_commands() -> dict[int, tuple[tuple[str, str], ...]]:
    """Every SCAN command (20 910) with its actions, by number of actions."""
    singles = [
        (view + times, acts * int(times or 1))
        for view, acts in _scan_views()
        for times in ("", "2", "3")
    ]
    commands = list(singles)
    for first, a in singles:
        for second, b in singles:
            commands += [(f"{first}&{second}", a + b), (f"{first}^{second}", b + a)]
    by_length: dict[int, list[tuple[str, str]]] = {}
    for command, acts in sorted(commands):
        by_length.setdefault(len(acts), []).append((command, acts))
    return {k: tuple(v) for k, v in sorted(by_length.items())}


@task
class Scan(TaskKind):
    """``scan(jo<3&w)=<<J<<J<<JW``: Lake and Baroni's SCAN commands (Kazemnejad et al.'s SCAN),
    a character a word: verbs ``w k r j`` (walk, look, run, jump) and ``t`` (turn), ``<``/``>``
    (left/right), ``o`` (opposite), ``a`` (around), ``2``/``3`` (twice/thrice), ``&`` (and),
    ``^`` (after); the answer's actions ``W K R J`` and the turns ``<``/``>``. A length is the
    number of actions, as in SCAN's length split (training on 1..22); some lengths (23, 29,
    ...) have no command and are skipped."""

    name = "scan"
    plain_lengths = (1, 22)
    limit = 48  # the most actions a command has

    def example(self, operands: Operands, fmt: str, reversed_answer: bool = False) -> Example:
        (command,) = operands
        return Example(f"scan({command})=", self._actions()[command])

    @staticmethod
    @functools.cache
    def _actions() -> dict[str, str]:
        return {c: a for group in scan_commands().values() for c, a in group}

    def draw(self, fmt: str, lengths: tuple[int, int], rng: random.Random) -> Operands:
        lo, hi = lengths
        return self.draw_plain(rng.choice([k for k in scan_commands() if lo <= k <= hi]), rng)

    def draw_plain(self, k: int, rng: random.Random) -> Operands:
        return (rng.choice(scan_commands()[k])[0],)

    def longest(self, k: int) -> Operands:
        """The command of the longest line of at most ``k`` actions (some lengths have none)."""
        return self.extremes(k)[2]

    @functools.cache  # noqa: B019  # the registry's one instance lives as long as the module
    def extremes(self, k: int) -> tuple[Operands, ...]:
        upto = [(c, a) for n, group in scan_commands().items() if n <= k for c, a in group]
        command = max(upto, key=lambda line: len(line[0]))[0]
        answer = max(upto, key=lambda line: len(line[1]))[0]
        line = max(upto, key=lambda line: len(line[0]) + len(line[1]))[0]
        return (command,), (answer,), (line,)

    def count(self, fmt: str, k: int) -> int:
        return len(scan_commands().get(k, ()))


if set(TASK_KINDS) != set(get_args(Task)):
    raise ImportError(f"Task {get_args(Task)} and the registered tasks {tuple(TASK_KINDS)} differ")
