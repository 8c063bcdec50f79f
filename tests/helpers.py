"""Helpers the tests import: the command-line runner, its error line, a reproduction at smoke
scale, a tiny task run and a tiny language model trained on text, and the stored reference
summaries of the reproductions."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from nopelab.cli import main


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """Run ``nopelab ARGS`` in this process; returns the exit status."""
    monkeypatch.setattr(sys, "argv", ["nopelab", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def reproduce(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``nopelab reproduce ARGS --scale smoke --device cpu`` in this process."""
    monkeypatch.setattr(
        sys, "argv", ["nopelab", "reproduce", *args, "--scale", "smoke", "--device", "cpu"]
    )
    main()


CORPUS = "the quick brown fox jumps over the lazy dog. " * 200  # 9000 bytes, 450 held out


def tiny_run(**train: object) -> Any:
    """A :class:`~nopelab.training.run.TrainRun` of a two-layer model on copy (operands up to 5)
    for 8 steps on the CPU; ``train`` overrides its training settings."""
    from nopelab.config import ModelConfig, TrainConfig
    from nopelab.training.run import TrainRun
    from nopelab.training.task_config import TaskConfig

    settings: dict[str, Any] = dict(
        steps=8, batch_size=8, seq_len=32, lr=3e-3, warmup=2, eval_every=4, checkpoint_every=2
    )
    settings.update(train)
    return TrainRun(
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64),
        train=TrainConfig(device="cpu", **settings),
        task=TaskConfig(name="copy", max_len=5, train_size=2000, test_size=100),
    )


def text_run(folder: Path, n_layers: int = 1, objective: str = "next", **model: Any) -> Path:
    """A two-step byte-level language model trained on :data:`CORPUS` with a context of 16,
    in ``folder/run`` (``objective="masked"``: a masked LM, with its mask token)."""
    from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
    from nopelab.training.run import TrainRun
    from nopelab.training.train import train

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(CORPUS)
    vocab = 256 + (objective == "masked")
    run = TrainRun(
        model=ModelConfig(vocab_size=vocab, d_model=16, n_layers=n_layers, n_heads=2, **model),
        train=TrainConfig(steps=2, batch_size=4, seq_len=16, eval_every=2, warmup=1, device="cpu"),
        corpus=CorpusConfig(source=str(folder / "corpus.txt"), objective=objective),
    )
    train(run, folder / "run", progress=False)
    return folder / "run"


def failure_line(err: str) -> str:
    """The one error line of a command that failed after it started: before it, only progress
    lines (printed where stderr is not a terminal, each ending with the seconds since the
    start)."""
    *before, last = err.strip().splitlines()
    assert all(re.fullmatch(r".* \(\d+ s\)", line) for line in before), err
    assert "Traceback" not in err and last.startswith("nopelab: "), err
    return last


REFERENCES = Path(__file__).parent / "references"
# How far a stored number may move with the order of the arithmetic (another CPU's vector
# width, another thread count), by kind: relative for values and spreads (standard deviations);
# absolute for scores that count comparisons (a last-digit change flips tied pairs), for
# correlations (an r near 0 has no relative precision) and for differences of two values (a
# gap near 0 has none either; in the values' unit, percent for the *_percent ones). Each is 2-3
# times the largest deviation that scripts/reference_spread.py measured with AVX-512 kernels and
# with one thread (docs/reliability.md, "Stored references").
TOLERANCE = {
    "value": 5e-3,  # measured 1.7e-3: a trained smoke LM's perplexity
    "spread": 0.05,  # 1.8e-2: a probe's MAE std over seeds
    "counted": 0.05,  # 0.024: a trained model's adjacency std over samples
    "correlation": 2e-3,  # 6.3e-4: a probe's r std over seeds
    "difference": 0.5,  # 0.17 percentage points: a gap between two trained perplexities
}


def kind_of(where: str) -> tuple[str, bool]:
    """The kind of the number at JSON path ``where`` and whether its tolerance is relative."""
    key = where.rpartition(".")[2]
    if key.startswith(("adjacency", "norm_score", "norm_signed")):
        return "counted", False
    if key in ("r", "r_std"):
        return "correlation", False
    if key.endswith("_std"):
        return "spread", True
    if key == "gap" or key.startswith("gap_") or "_minus_" in key:
        return "difference", False
    return "value", True


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_timing(item)
            for key, item in value.items()
            if not key.endswith(("seconds", "per_second"))
        }
    if isinstance(value, list):
        return [_without_timing(item) for item in value]
    return value


def assert_matches_reference(run: Path, name: str, *, any_device: bool = False) -> None:
    """``run``'s summary.json holds the numbers of ``tests/references/NAME.json`` (a smoke
    reproduction at seed 0, stored so that a change of code that moves a number shows), timings
    aside: equal up to float rounding. Another CPU's arithmetic differs in the last digits, which a trained
    probe's error carries to the fourth digit and a spread over a few seeds further (seen
    between an Intel and an AMD CPU). The adjacency and norm scores are fractions of pairwise
    comparisons: a last-digit change in a similarity that ties another (left-padded prompts
    repeat one token) flips pairs and moves a sample's score by a few hundredths, so they are
    compared to an absolute tolerance (:data:`TOLERANCE`). ``any_device``: the run may have been
    made on another device than the reference (its recorded ``device`` is not compared)."""
    got = _without_timing(json.loads((run / "summary.json").read_text()))
    if dump := os.environ.get("NOPELAB_REFERENCE_DUMP"):  # scripts/reference_spread.py
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{name}.json").write_text(json.dumps(got, indent=1))
    want = json.loads((REFERENCES / f"{name}.json").read_text())
    if any_device and "device" in want:
        got["device"] = want["device"]
    assert (where := _first_mismatch(got, want)) is None, f"{name}: {where}"


def _first_mismatch(got: Any, want: Any, where: str = "") -> str | None:
    """Where two JSON values first differ (numbers within float rounding), or ``None``."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return f"{where}: keys {sorted(set(got) ^ set(want))}"
        items = [(f"{where}.{key}", got[key], want[key]) for key in want]
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{where}: {len(got)} items, not {len(want)}"
        items = [(f"{where}[{i}]", a, b) for i, (a, b) in enumerate(zip(got, want, strict=True))]
    elif isinstance(want, float) and isinstance(got, (int, float)) and type(got) is not bool:
        kind, relative = kind_of(where)
        tolerance = TOLERANCE[kind]
        rel, near = (tolerance, 1e-6) if relative else (0.0, tolerance)
        close = got == pytest.approx(want, rel=rel, abs=near, nan_ok=True)
        return None if close else f"{where}: {got!r}, not {want!r}"
    else:
        return None if got == want else f"{where}: {got!r}, not {want!r}"
    return next((m for path, a, b in items if (m := _first_mismatch(a, b, path))), None)
