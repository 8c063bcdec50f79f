"""The reproduced papers, their parts and the scales each part has: one registry, read without
importing PyTorch (``nopelab reproduce --help`` is generated from it).

Each paper is a package of this one (``chi2023/``, ``zuo2025/``, …) and each of its parts a module
there with ``settings(scale, seed, device, **options)``, which validates and resolves, and
``run(settings, out)``, which writes. Beside the modules, the paper's package holds the parts' scale
files (``scales/PART.toml``, one table per scale), their summary templates (``templates/``), the
paper's published numbers (``published.toml``) and the figures only it draws (``figures.py``).
Adding a part is one module, one scale file, one template and one entry here.
"""

from __future__ import annotations

import functools
import importlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nopelab.experiments.scale_files import part_file


@functools.cache
def scale_tables(part: str) -> dict[str, dict[str, Any]]:
    """The tables of the part ``PAPER.PART``'s scale file, ``PAPER/scales/PART.toml``, in order."""
    return tomllib.loads(part_file(part, "scales", ".toml").read_text())


@dataclass(frozen=True)
class Part:
    """One part of a reproduction.

    ``module``: the module under ``nopelab.experiments`` that runs it, ``PAPER.PART``; ``about``:
    a few words for ``--help``; ``scale_file``: the part whose scale file it reads (``module``
    unless given);
    ``only_scales``: a subset of that file's tables, where the part runs at fewer scales.
    A ``resumable`` part runs its models as jobs (:func:`~nopelab.runtime.jobs.run_jobs`) and
    writes into ``--out`` as it goes; ``--resume`` continues it, skipping finished models.
    ``options`` names the ``reproduce`` flags the part takes beyond the common ones (``settings``
    receives each one given as a keyword); ``reuses_models``: the module's
    ``reuse_models(settings, folder)`` takes models from another finished run (``--models``);
    ``probe_seeds``: its scales' ``seeds`` count probe repeats, not models (:meth:`seed_count`)."""

    module: str
    about: str = ""
    resumable: bool = False
    scale_file: str = ""
    only_scales: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    reuses_models: bool = False
    probe_seeds: bool = False  # its scales' ``seeds`` are probe repeats, not model seeds

    def scale_table(self, scale: str) -> dict[str, Any]:
        """The settings of one of its scales, as its scale file holds them."""
        return scale_tables(self.scale_file or self.module)[scale]

    @property
    def scales(self) -> tuple[str, ...]:
        """The scales this part runs at, in its scale file's order."""
        tables = scale_tables(self.scale_file or self.module)
        return tuple(s for s in tables if not self.only_scales or s in self.only_scales)

    def seed_count(self, scale: str) -> int:
        """How many model seeds a run at ``scale`` uses: ``--seed``, ``--seed`` + 1, … (its
        scale's ``seeds``, or the module's ``SEEDS``, else one; parts whose ``seeds`` count
        probe repeats, ``probe_seeds``, train one)."""
        if self.probe_seeds:
            return 1
        table = self.scale_table(scale)
        return int(table.get("seeds", getattr(self.code(), "SEEDS", 1)))

    def code(self) -> ModuleType:
        """The part's module (imports PyTorch)."""
        return importlib.import_module(f"{__name__}.{self.module}")

    @property
    def settings(self) -> Callable[..., Any]:
        return self.code().settings

    @property
    def run(self) -> Callable[[Any, Path], None]:
        return self.code().run

    @property
    def reuse_models(self) -> Callable[[Any, Path], Any] | None:
        return self.code().reuse_models if self.reuses_models else None


@dataclass(frozen=True)
class Experiment:
    parts: dict[str, Part]
    default_part: str


EXPERIMENTS = {
    "chi2023": Experiment(
        {
            "random-init": Part("chi2023.random_init"),
            "pretrained": Part("chi2023.pretrained", resumable=True, options=("corpus",)),
            "probe-study": Part(
                "chi2023.probe_study",
                "probes of the random model over inputs, sites, probes and training sequences",
                resumable=True,
                options=("samples",),
                probe_seeds=True,
            ),
        },
        "random-init",
    ),
    "zuo2025": Experiment(
        {
            "random-init": Part("zuo2025.random_init", resumable=True),
            "trained": Part("zuo2025.trained", resumable=True, options=("layout", "encodings")),
            "probes": Part(
                "zuo2025.probes", resumable=True, reuses_models=True, options=("layout",)
            ),
            "mastery": Part(
                "zuo2025.mastery",
                "the trained part's models at three seeds, steps to mastery",
                resumable=True,
                scale_file="zuo2025.trained",
                only_scales=("smoke", "small"),  # the scales whose models train to a target
                options=("layout",),
            ),
        },
        "random-init",
    ),
    "haviv2022": Experiment(
        {
            "pretrained": Part("haviv2022.pretrained", resumable=True, options=("corpus",)),
            "sizes": Part(
                "haviv2022.sizes",
                "five encodings at three sizes, the gap to NoPE",
                resumable=True,
                options=("sizes", "corpus", "tokenizer"),
            ),
            "mask": Part(
                "haviv2022.mask",
                "causal and masked LMs, NoPE and learned: the mask as the source of position",
                resumable=True,
                options=("corpus",),
            ),
        },
        "pretrained",
    ),
    "kazemnejad2023": Experiment(
        {
            "tasks": Part(
                "kazemnejad2023.tasks",
                "six encodings on tasks, accuracy at every length to 3x the trained ones",
                resumable=True,
            )
        },
        "tasks",
    ),
    "wang2024": Experiment(
        {
            "lengths": Part(
                "wang2024.lengths",
                "NoPE and RoPE past the training length, the logit-scale fixes",
                resumable=True,
                options=("corpus",),
            )
        },
        "lengths",
    ),
    "real-model": Experiment({"smollm2": Part("real_model.smollm2", probe_seeds=True)}, "smollm2"),
}


def parts() -> list[tuple[str, str, Part]]:
    """Every part as ``(paper, part name, part)``."""
    return [
        (paper, name, part) for paper, e in EXPERIMENTS.items() for name, part in e.parts.items()
    ]


def named(found: list[tuple[str, str, Part]]) -> list[str]:
    """Parts as a user types them: ``PAPER --part PART``."""
    return [f"{paper} --part {name}" for paper, name, _ in found]


def taking(option: str) -> list[str]:
    """The parts that take the ``reproduce`` flag ``--OPTION``."""
    return named([p for p in parts() if option in p[2].options])


def with_reuse() -> list[str]:
    """The parts that take ``--models``."""
    return named([p for p in parts() if p[2].reuses_models])


def resumable() -> list[str]:
    """The parts that ``--resume`` continues."""
    return named([p for p in parts() if p[2].resumable])
