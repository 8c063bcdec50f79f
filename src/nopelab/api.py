"""The Python API: the model a command studies, resolved the way the command line resolves it.

>>> import nopelab
>>> study = nopelab.load(model={"n_layers": 2}, analysis={"seq_len": 64, "samples": 8})
>>> rows = nopelab.summary_rows(nopelab.analyze(study, progress=False))
>>> round(rows[0]["adjacency_mean"], 2)  # the embedding of random vectors: chance
0.5
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nopelab.config import RunConfig
from nopelab.errors import ConfigError, UserError

if TYPE_CHECKING:
    from nopelab.hf.load import HFRun, TextWindows
    from nopelab.hf.sites import HFModel
    from nopelab.measure.capture import CaptureResult
    from nopelab.models.transformer import Transformer
    from nopelab.training.sources import Source


@dataclass(frozen=True)
class Study:
    """A model to study and its resolved settings.

    ``config``: the model and analysis settings (an ``HFRun`` for a Hugging Face model);
    ``source``: the data the analysis reads when its input is ``data`` or ``prompts``.
    """

    config: RunConfig | HFRun
    model: Transformer | HFModel
    source: Source | TextWindows | None = None


def load(
    target: str | Path | None = None,
    *,
    model: dict[str, Any] | None = None,
    analysis: dict[str, Any] | None = None,
    text: str = "default",
    max_layers: int | None = None,
    trust_remote_code: bool = False,
    rope_off: tuple[int, ...] | str | None = None,
    statistics: bool = True,
) -> Study:
    """Resolve ``target`` into a model and validated settings.

    ``target``: ``None`` for a randomly initialised model built from ``model`` settings, a
    training run directory (its trained checkpoint; default input: its held-out data), or
    ``"hf:PATH"`` for a Hugging Face model folder or ``.gguf`` file (default input: text).
    ``analysis``: :class:`~nopelab.config.AnalysisConfig` fields. The Hugging Face options
    (``text``, ``max_layers``, ``trust_remote_code``, ``rope_off``) apply to ``hf:`` only.
    ``statistics``: whether T x T statistics will be reduced, for the memory check (before a
    random-init model is built; after a training run's checkpoint is read).
    """
    from nopelab.limits import check_analysis
    from nopelab.models.transformer import build_model

    analysis = dict(analysis or {})
    if target is not None:
        analysis.setdefault("input", "data")
        if model:
            raise UserError("model: a trained or Hugging Face model fixes the model settings")
    if target is not None and str(target).startswith("hf:"):
        from nopelab.config import AnalysisConfig, build
        from nopelab.hf.load import load_run

        record, hf_model, text_source = load_run(
            str(target)[3:],
            build(AnalysisConfig, analysis, "config.analysis"),
            text=text,
            max_layers=max_layers,
            trust_remote_code=trust_remote_code,
            rope_off=rope_off,
            statistics=statistics,
        )
        return Study(record, hf_model, text_source)
    if target is not None:
        from nopelab.training.trained import load_trained, make_source

        run, trained = load_trained(Path(target))
        config = RunConfig.from_dict({"model": dataclasses.asdict(run.model), "analysis": analysis})
        check_analysis(config.model, config.analysis, statistics)
        reads_data = config.analysis.input in ("data", "prompts")
        return Study(config, trained, make_source(run, Path(target)) if reads_data else None)
    config = RunConfig.from_dict({"model": model or {}, "analysis": analysis})
    if config.analysis.input in ("data", "prompts"):
        raise ConfigError(
            "input", f"{config.analysis.input} needs a training run directory; use random or tokens"
        )
    check_analysis(config.model, config.analysis, statistics)
    return Study(config, build_model(config.model, config.analysis.seed))


def analyze(study: Study, progress: bool = True) -> CaptureResult:
    """Run the study's analysis: statistics reduced on the fly at every requested site."""
    from nopelab.measure.analysis import analyze_model

    return analyze_model(study.model, study.config.analysis, progress=progress, source=study.source)
