"""Grid files: a command, base settings, the axes to vary, seeds and resources per cell.

```toml
command = "train"                    # train | analyze | probe | train+analyze
seeds = [0, 1]                       # every cell once per seed (sets train.seed / analysis.seed)

[base.task]                          # the tables of a config file
name = "copy"
[base.train]
steps = 200

[axes]                               # crossed: every combination
"model.pos_encoding" = ["none", "learned"]

[zip]                                # zipped: the i-th values together
"model.d_model" = [32, 64]
"model.n_heads" = [2, 4]

[resources]
cpus_per_cell = 1                    # Ray CPUs a cell reserves
threads_per_cell = 1                 # torch threads inside a cell
gpus_per_cell = 0
```

A grid has at most :data:`MAX_CELLS` cells, counted from the lengths of its axes before any cell
is built. Every cell is validated (built into the config dataclasses) before anything is written;
its key is a hash of its resolved settings, so the same cell always has the same folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopelab.config import (
    AnalysisConfig,
    CorpusConfig,
    ModelConfig,
    ProbeConfig,
    TrainConfig,
    check_sections,
    check_seed,
)
from nopelab.errors import ConfigError, UserError
from nopelab.training.run import data_vocab_size
from nopelab.training.task_config import TaskConfig

SECTIONS: dict[str, type] = {
    "task": TaskConfig,
    "corpus": CorpusConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "analysis": AnalysisConfig,
    "probe": ProbeConfig,
}
COMMANDS: dict[str, tuple[str, ...]] = {  # command -> the sections it takes
    "train": ("task", "corpus", "model", "train"),
    "analyze": ("model", "analysis"),
    "probe": ("model", "analysis", "probe"),
    "train+analyze": ("task", "corpus", "model", "train", "analysis"),
}
KEYS = ("command", "seeds", "base", "axes", "zip", "resources")
MAX_CELLS = 10_000  # cells in one grid: checking each takes milliseconds, running it far longer


@dataclass(frozen=True)
class Resources:
    """What one cell reserves: Ray CPUs and GPUs, and the torch threads it runs."""

    cpus_per_cell: float = 1.0
    threads_per_cell: int = 1
    gpus_per_cell: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cpus_per_cell", "gpus_per_cell", "threads_per_cell"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"resources.{name}", f"expected a number, got {value!r}")
            if not math.isfinite(value) or value < 0 or (value == 0 and name != "gpus_per_cell"):
                raise ConfigError(f"resources.{name}", f"must be > 0, got {value!r}")
        if not isinstance(self.threads_per_cell, int):
            raise ConfigError(
                "resources.threads_per_cell", f"expected an int, got {self.threads_per_cell!r}"
            )


@dataclass(frozen=True)
class Cell:
    """One point of the grid: its command, resolved settings, the values that vary, its key."""

    command: str
    settings: dict[str, dict[str, Any]]
    values: dict[str, Any]  # "section.field" (and "seed") -> this cell's value

    @property
    def key(self) -> str:
        text = json.dumps({"command": self.command, "settings": self.settings}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Grid:
    command: str
    base: dict[str, dict[str, Any]]
    axes: dict[str, list[Any]]  # crossed
    zipped: dict[str, list[Any]]
    seeds: tuple[int, ...] | None
    resources: Resources

    @property
    def size(self) -> int:
        """How many cells the grid has, from the lengths of its axes (no cell is built)."""
        zipped = len(next(iter(self.zipped.values()))) if self.zipped else 1
        crossed = math.prod(len(values) for values in self.axes.values())
        return zipped * crossed * len(self.seeds or (None,))

    def cells(self) -> list[Cell]:
        """Every cell, validated: a bad value is a one-line error naming where it came from."""
        crossed = [
            dict(zip(self.axes, combo, strict=True))
            for combo in itertools.product(*self.axes.values())
        ]
        length = len(next(iter(self.zipped.values()))) if self.zipped else 1
        zipped = [{k: v[i] for k, v in self.zipped.items()} for i in range(length)]
        cells = []
        for z, c, seed in itertools.product(zipped, crossed, self.seeds or (None,)):
            values = {**z, **c}
            settings = {section: dict(table) for section, table in self.base.items()}
            for name, value in values.items():
                section, field = name.split(".", 1)
                settings.setdefault(section, {})[field] = value
            if self.command in ("train", "train+analyze"):
                model = settings.setdefault("model", {})
                model.setdefault("vocab_size", data_vocab_size(settings))
            if seed is not None:
                values["seed"] = seed
                for section in ("train", "analysis"):
                    if section in COMMANDS[self.command]:
                        settings.setdefault(section, {})["seed"] = seed
            cells.append(Cell(self.command, settings, values))
            self._check(cells[-1])
        return cells

    def _check(self, cell: Cell) -> None:
        try:
            validate(cell)
        except ConfigError as exc:
            field = exc.field.rsplit(".", 1)[-1]
            where = next(
                (
                    f"{table}.{name}"
                    for table, names in (("axes", self.axes), ("zip", self.zipped))
                    for name in names
                    if name.split(".", 1)[1] == field
                ),
                None,
            )
            if where is None:
                where = next(
                    (f"base.{s}.{field}" for s, t in self.base.items() if field in t), exc.field
                )
            raise ConfigError(where, exc.message) from None


def validate(cell: Cell) -> None:
    """Build the cell's settings into the config dataclasses (what the cell will run)."""
    from nopelab.config import RunConfig, build, embedded_names
    from nopelab.training.run import TrainRun
    from nopelab.training.task_config import check_seq_len

    s = cell.settings
    if cell.command in ("train", "train+analyze"):
        run = TrainRun.from_dict({k: v for k, v in s.items() if k != "analysis"})
        if run.corpus is not None:  # an unknown or repeated name in a join, as train refuses it
            embedded_names(run.corpus.source, "source")
        if run.task is not None:  # as the cell would refuse it when it starts
            check_seq_len(run.task, run.train.seq_len)
        if cell.command == "train+analyze":
            analysis = build(AnalysisConfig, {"input": "data", **s.get("analysis", {})}, "analysis")
            analysis.check_model(run.model)
        return
    RunConfig.from_dict({k: v for k, v in s.items() if k in ("model", "analysis")})
    if s.get("analysis", {}).get("input") in ("data", "prompts"):
        raise ConfigError("input", "a grid's random-init models have no data; use random or tokens")
    if cell.command == "probe":
        build(ProbeConfig, s.get("probe", {}), "probe")


def _table(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(name, f"expected a table, got {value!r}")
    return value


def _axes(data: dict[str, Any], name: str, sections: tuple[str, ...]) -> dict[str, list[Any]]:
    axes = _table(data, name)
    for key, values in axes.items():
        section, _, field = key.partition(".")
        if section not in sections or field not in _fields(section):
            allowed = ", ".join(f"{s}.FIELD" for s in sections)
            raise ConfigError(f"{name}.{key}", f"unknown setting; allowed: {allowed}")
        if not isinstance(values, list):
            raise ConfigError(f"{name}.{key}", f"expected a list of values, got {values!r}")
        if not values:
            raise ConfigError(f"{name}.{key}", "empty axis: give at least one value")
    return axes


def _fields(section: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(SECTIONS[section]))


def read_grid(path: Path) -> Grid:
    """Read and check a grid file (TOML); any problem is a one-line error naming the field."""
    if not path.is_file():
        raise UserError(f"GRID: {path}: no such file")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"GRID: {path}: not valid TOML: {exc}") from None
    return parse_grid(data, name=f"GRID: {path}")


def parse_grid(data: dict[str, Any], name: str = "grid") -> Grid:
    """Check a grid's tables and build every cell; errors name the field, or ``name`` (how the
    user gave the grid) for a grid of more than :data:`MAX_CELLS` cells."""
    for key in data:
        if key not in KEYS:
            raise ConfigError(key, f"unknown key; allowed: {', '.join(KEYS)}")
    command = data.get("command")
    if command not in COMMANDS:
        raise ConfigError("command", f"unknown value {command!r}; allowed: {', '.join(COMMANDS)}")
    sections = COMMANDS[command]
    base = _table(data, "base")
    check_sections(base, sections, "base")
    for section, table in base.items():
        if not isinstance(table, dict):
            raise ConfigError(f"base.{section}", f"expected a table, got {table!r}")
    axes, zipped = _axes(data, "axes", sections), _axes(data, "zip", sections)
    if set(axes) & set(zipped):
        raise ConfigError("zip", f"{sorted(set(axes) & set(zipped))[0]} is also in [axes]")
    if len({len(v) for v in zipped.values()}) > 1:
        raise ConfigError("zip", "every zipped axis needs the same number of values")
    seeds = data.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, list) or not seeds:
            raise ConfigError("seeds", f"expected a non-empty list of ints, got {seeds!r}")
        for seed in seeds:
            check_seed("seeds", seed)
    resources = _table(data, "resources")
    names = [f.name for f in dataclasses.fields(Resources)]
    for key in resources:
        if key not in names:
            raise ConfigError(f"resources.{key}", f"unknown key; allowed: {', '.join(names)}")
    grid = Grid(
        command=command,
        base=base,
        axes=axes,
        zipped=zipped,
        seeds=tuple(seeds) if seeds is not None else None,
        resources=Resources(**resources),
    )
    if grid.size > MAX_CELLS:
        raise UserError(
            f"{name}: {grid.size:,} cells; a sweep takes at most {MAX_CELLS:,}: split the grid"
        )
    keys = [cell.key for cell in grid.cells()]  # validates every cell
    if len(set(keys)) != len(keys):
        raise ConfigError("axes", "two cells have the same settings; remove the repeated value")
    return grid
