"""From a command's arguments to what it works on: the model, its settings, its inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nopelab.api import Study
from nopelab.cli.options import Given
from nopelab.config import check_sections
from nopelab.errors import UserError


def hf_path(run_dir: Path | str | None) -> str | None:
    """``PATH`` of an ``hf:PATH`` argument, else ``None``."""
    return str(run_dir)[3:] if run_dir is not None and str(run_dir).startswith("hf:") else None


def inputs(*run_dirs: Path | None) -> list[Path]:
    """The folders or files a command reads (``hf:PATH`` gives ``PATH``): never an output."""
    return [Path(hf_path(r) or r) for r in run_dirs if r is not None]


def title(run_dir: Path | None) -> str:
    if run_dir is None:
        return "random-init model"
    path = hf_path(run_dir)
    return f"Hugging Face model {path}" if path else f"trained model {run_dir}"


def study(
    run_dir: Path | None,
    data: dict[str, Any],
    given: Given,
    sections: tuple[str, ...] = ("model", "analysis"),
    statistics: bool = True,
) -> Study:
    """The model to study and its validated [model]+[analysis] settings: a training run's
    checkpoint, a Hugging Face model (``hf:PATH``) or a random-init model built from the flags.

    ``data`` (from a config file) may hold the other ``sections``; they are left for the
    caller. ``statistics``: whether T x T statistics will be reduced, for the memory check.
    """
    from nopelab.api import load
    from nopelab.config import HFConfig

    check_sections(data, sections)
    settings: dict[str, Any] = {key: data[key] for key in ("model", "analysis") if key in data}
    if hf_path(run_dir) is None and given.flags("hf"):
        raise UserError(f"{given.flags('hf')[0]}: only applies to an hf:PATH model")
    if run_dir is not None and (given.flags("model") or "model" in settings):
        typed = given.flags("model")
        raise UserError(
            f"{typed[0] if typed else '--config'}: a trained or Hugging Face model fixes the "
            "model; drop the model settings"
        )
    given.lay_over(settings, "analysis")
    if run_dir is None:
        given.lay_over(settings, "model")
    hf = HFConfig(**given.section("hf"))
    return load(
        run_dir,
        model=settings.get("model"),
        analysis=settings["analysis"],
        text=hf.text,
        max_layers=hf.max_layers,
        trust_remote_code=hf.trust_remote_code,
        rope_off=hf.rope_off or None,
        statistics=statistics,
    )
