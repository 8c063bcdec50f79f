"""The prose of the reproductions' ``summary.md``: ``experiments/PAPER/templates/NAME.md``.

A template is Markdown with `Jinja <https://jinja.palletsprojects.com>`_ placeholders
(``{{ name }}``) and the prose's conditions (``{% if seeds > 1 %}``): the experiment module
computes the values (numbers, tables rendered as Markdown) and :func:`fill` renders the
template with them. A block tag on a line of its own leaves no blank line behind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import jinja2
from jinja2 import meta

from nopelab.experiments.scale_files import part_file

if TYPE_CHECKING:
    from nopelab.config import ModelConfig, TrainConfig
    from nopelab.training.run import TrainRun


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' Jinja environment: a value the template names but the call does not give
    is an error (``StrictUndefined``), and nothing is HTML-escaped (the output is Markdown)."""
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: part_file(name, "templates", ".md").read_text(encoding="utf-8")
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def fill(name: str, **values: object) -> str:
    """The template ``PAPER.NAME`` rendered with ``values``; a value it names that is not given
    raises :class:`jinja2.UndefinedError`."""
    return environment().get_template(name).render(values)


def sentence(name: str, macro: str) -> Callable[..., str]:
    """The macro ``macro`` of the template ``PAPER.NAME``: a sentence whose wording and
    conditions live in the template, called with the facts it states."""
    found: Callable[..., str] = getattr(environment().get_template(name).module, macro)
    return lambda *args: str(found(*args))


def source(name: str) -> str:
    """The text of the template ``PAPER.NAME``."""
    env = environment()
    return env.loader.get_source(env, name)[0]  # type: ignore[union-attr]


def placeholders(name: str) -> set[str]:
    """The values the template ``PAPER.NAME`` takes from its caller."""
    return meta.find_undeclared_variables(environment().parse(source(name)))


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
