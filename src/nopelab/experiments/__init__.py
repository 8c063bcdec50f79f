"""One module per reproduced paper; each part validates its settings, then runs into a folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopelab.experiments import (
    chi2023,
    chi2023_pretrained,
    chi2023_probe_study,
    haviv2022,
    haviv2022_sizes,
    kazemnejad2023,
    real_model,
    wang2024,
    zuo2025,
    zuo2025_mastery,
    zuo2025_probes,
    zuo2025_trained,
)


@dataclass(frozen=True)
class Part:
    """``settings(scale, seed, device)`` validates and resolves; ``run(settings, out)`` writes.

    A resumable part runs its models as jobs (:func:`~nopelab.sweep.runner.run_jobs`) and writes
    into ``--out`` as it goes; ``--resume`` continues it, skipping finished models.
    ``reuse_models(settings, folder)``, where given, takes models from another finished run
    (``--models``) instead of training them. ``options`` names the ``reproduce`` flags the part
    takes beyond the common ones; ``settings`` receives each one given as a keyword."""

    settings: Callable[[str, int, str], Any]
    run: Callable[[Any, Path], None]
    resumable: bool = False
    scales: tuple[str, ...] = ("smoke", "small", "paper")
    reuse_models: Callable[[Any, Path], Any] | None = None
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    parts: dict[str, Part]
    default_part: str


WITH_MEDIUM = ("smoke", "small", "medium", "paper")
TO_TARGET = ("smoke", "small")  # scales whose task models train to a target accuracy
EXPERIMENTS = {
    "chi2023": Experiment(
        {
            "random-init": Part(chi2023.settings, chi2023.run),
            "pretrained": Part(
                chi2023_pretrained.settings,
                chi2023_pretrained.run,
                resumable=True,
                scales=WITH_MEDIUM,
            ),
            "probe-study": Part(
                chi2023_probe_study.settings,
                chi2023_probe_study.run,
                resumable=True,
                options=("samples",),
            ),
        },
        "random-init",
    ),
    "zuo2025": Experiment(
        {
            "random-init": Part(zuo2025.settings, zuo2025.run, resumable=True),
            "trained": Part(
                zuo2025_trained.settings, zuo2025_trained.run, resumable=True, scales=WITH_MEDIUM
            ),
            "probes": Part(
                zuo2025_probes.settings,
                zuo2025_probes.run,
                resumable=True,
                scales=WITH_MEDIUM,
                reuse_models=zuo2025_probes.reuse_models,
            ),
            "mastery": Part(
                zuo2025_mastery.settings,
                zuo2025_mastery.run,
                resumable=True,
                scales=TO_TARGET,
            ),
        },
        "random-init",
    ),
    "haviv2022": Experiment(
        {
            "pretrained": Part(
                haviv2022.settings, haviv2022.run, resumable=True, scales=WITH_MEDIUM
            ),
            "sizes": Part(
                haviv2022_sizes.settings,
                haviv2022_sizes.run,
                resumable=True,
                scales=("smoke", "small", "medium"),
                options=("sizes",),
            ),
        },
        "pretrained",
    ),
    "kazemnejad2023": Experiment(
        {
            "tasks": Part(
                kazemnejad2023.settings,
                kazemnejad2023.run,
                resumable=True,
                scales=("smoke", "small", "medium"),
            )
        },
        "tasks",
    ),
    "wang2024": Experiment(
        {
            "lengths": Part(
                wang2024.settings,
                wang2024.run,
                resumable=True,
                scales=("smoke", "small", "medium"),
            )
        },
        "lengths",
    ),
    "real-model": Experiment(
        {"smollm2": Part(real_model.settings, real_model.run)},
        "smollm2",
    ),
}


def taking(option: str) -> list[str]:
    """The parts that take the ``reproduce`` flag ``--OPTION``, as ``PAPER --part PART``."""
    return [
        f"{paper} --part {name}"
        for paper, e in EXPERIMENTS.items()
        for name, part in e.parts.items()
        if option in part.options
    ]


def with_reuse() -> list[str]:
    """The parts that take ``--models``, as ``PAPER --part PART``."""
    return [
        f"{paper} --part {name}"
        for paper, e in EXPERIMENTS.items()
        for name, part in e.parts.items()
        if part.reuse_models is not None
    ]
