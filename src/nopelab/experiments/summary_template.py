"""The prose of the reproductions' ``summary.md``: ``experiments/templates/NAME.md``.

A template is Markdown with :class:`string.Template` placeholders (``$name`` or ``${name}``;
``$$`` is a literal dollar). The experiment module computes every value as a string (numbers
formatted, tables rendered) and :func:`fill` puts them in.
"""

from __future__ import annotations

from importlib import resources
from string import Template
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nopelab.config import ModelConfig, TrainConfig
    from nopelab.training.run import TrainRun


def template(name: str) -> Template:
    """The template ``templates/NAME.md``."""
    path = resources.files("nopelab.experiments").joinpath("templates", f"{name}.md")
    return Template(path.read_text(encoding="utf-8"))


def fill(name: str, **values: object) -> str:
    """``templates/NAME.md`` with its placeholders replaced by ``values``; a placeholder without a
    value raises ``KeyError``."""
    return template(name).substitute(values)


def shape_values(model: ModelConfig) -> dict[str, object]:
    """A model's shape, as the templates name it: ``d_model``, ``n_heads``, ``n_layers``."""
    return {"d_model": model.d_model, "n_heads": model.n_heads, "n_layers": model.n_layers}


def schedule_values(train: TrainConfig) -> dict[str, object]:
    """A language model's training, as the templates name it: ``steps``, ``batch_size``,
    ``seq_len``, ``lr``, ``warmup``."""
    return {
        "steps": train.steps,
        "batch_size": train.batch_size,
        "seq_len": train.seq_len,
        "lr": f"{train.lr:g}",
        "warmup": train.warmup,
    }


def corpus_values(run: TrainRun) -> dict[str, object]:
    """What a language model trained on, as the templates name it: ``corpus``."""
    from nopelab.training.corpus import describe

    assert run.corpus is not None  # a language model's run
    return {"corpus": describe(run.corpus.source)}
