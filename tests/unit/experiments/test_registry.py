"""``nopelab reproduce`` reads its papers, parts and scales from the experiments' registry."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import tomllib
from importlib import resources

import pytest

from nopelab.cli.reproduce import SCALES, reproduce
from nopelab.experiments import EXPERIMENTS, parts, resumable, taking, with_reuse


def _help(name: str) -> str:
    parameter = inspect.signature(reproduce, eval_str=True).parameters[name]
    return parameter.annotation.__metadata__[0].help


def test_the_help_names_every_paper_part_and_scale() -> None:
    papers, part_help, scales = _help("paper"), _help("part"), _help("scale")
    for paper, experiment in EXPERIMENTS.items():
        assert paper in papers
        for name, part in experiment.parts.items():
            assert f"{paper}: " in part_help and name in part_help.split(f"{paper}: ")[1]
            assert all(scale in scales for scale in part.scales)
    for paper, name, part in parts():  # --resume's help names the parts that do not resume
        assert (f"{paper} --part {name}" in _help("resume")) != part.resumable


@pytest.mark.parametrize("paper, name, part", parts(), ids=lambda p: getattr(p, "module", p))
def test_a_part_has_the_scales_of_its_file_and_the_functions_it_names(
    paper: str, name: str, part: object
) -> None:
    from nopelab.experiments import Part

    assert isinstance(part, Part)
    paper_package, _, file = (part.scale_file or part.module).partition(".")
    tables = tomllib.loads(
        resources.files(f"nopelab.experiments.{paper_package}")
        .joinpath("scales", f"{file}.toml")
        .read_text()
    )
    assert set(part.only_scales) <= set(tables), "only_scales names a table the file lacks"
    assert part.scales and set(part.scales) <= set(SCALES), "a scale --help does not describe"
    assert callable(part.settings) and callable(part.run)
    assert (part.reuse_models is not None) == part.reuses_models
    assert set(part.options) <= set(inspect.signature(part.settings).parameters)


def test_the_flags_name_the_parts_that_take_them() -> None:
    assert with_reuse() == ["zuo2025 --part probes"]
    assert taking("samples") == ["chi2023 --part probe-study"]
    assert taking("sizes") == ["haviv2022 --part sizes"]
    language_models = ["chi2023 --part pretrained", "haviv2022 --part pretrained"]
    language_models += [
        "haviv2022 --part sizes",
        "haviv2022 --part mask",
        "wang2024 --part lengths",
    ]
    assert taking("corpus") == language_models
    assert "chi2023 --part pretrained" in resumable()
    assert "real-model --part smollm2" not in resumable()
    assert "zuo2025 --part probes" in _help("models")


def _runs(settings: object) -> dict:
    return getattr(settings, "runs", None) or {m.key: m.run for m in settings.models}  # type: ignore[attr-defined]


LM_SCALES = [
    (paper, name, scale)
    for paper, name, part in parts()
    if "corpus" in part.options
    for scale in part.scales
    if scale != "paper"
]


@functools.cache
def _training_bytes(source: str, val_fraction: float) -> int:
    from nopelab.training.corpus import load_text, split_text

    return len(split_text(load_text(source), val_fraction)[0].encode())


@pytest.mark.parametrize("paper, name, scale", [s for s in LM_SCALES if s[2] != "smoke"])
def test_every_language_model_scale_keeps_the_recipes_bounds(
    paper: str, name: str, scale: str
) -> None:
    """At every CPU scale: at most 4 epochs of the corpus's training split (its own corpus where
    a scale names one), and 20 tokens per parameter of the size's NoPE model (19.9 at the 5
    M-token floor of 1221 steps: "20 per parameter" in whole steps; every encoding of a size
    sees the same tokens, so a learned table's rows lower its own count)."""
    from nopelab.models.transformer import build_model

    for run in _runs(EXPERIMENTS[paper].parts[name].settings(scale, 0, "cpu")).values():
        tokens = run.train.steps * run.train.batch_size * run.train.seq_len
        train_bytes = _training_bytes(run.corpus.source, run.corpus.val_fraction)
        assert tokens <= 4 * train_bytes, (run.corpus.source, tokens / train_bytes)
        body = dataclasses.replace(run.model, pos_encoding="none")
        parameters = sum(p.numel() for p in build_model(body, 0).parameters())
        assert tokens >= 19.8 * parameters, tokens / parameters


@pytest.mark.parametrize("paper, name, scale", LM_SCALES)
def test_a_scale_trains_on_its_own_corpus_unless_corpus_names_one(
    paper: str, name: str, scale: str
) -> None:
    part = EXPERIMENTS[paper].parts[name]
    own = part.scale_table(scale).get("corpus", "default")
    assert {run.corpus.source for run in _runs(part.settings(scale, 0, "cpu")).values()} == {own}
    given = part.settings(scale, 0, "cpu", corpus="sotu")
    assert {run.corpus.source for run in _runs(given).values()} == {"sotu"}


def test_seed_count_is_the_model_seeds_of_a_scale() -> None:
    from nopelab.experiments import EXPERIMENTS

    assert EXPERIMENTS["wang2024"].parts["lengths"].seed_count("small") == 3
    assert EXPERIMENTS["zuo2025"].parts["mastery"].seed_count("small") == 3  # the module's SEEDS
    assert EXPERIMENTS["chi2023"].parts["random-init"].seed_count("small") == 1
    # probe repeats, not models: any --seed up to the largest is accepted
    assert EXPERIMENTS["chi2023"].parts["probe-study"].seed_count("paper") == 1
    assert EXPERIMENTS["real-model"].parts["smollm2"].seed_count("small") == 1
