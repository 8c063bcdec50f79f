"""``nopelab reproduce`` reads its papers, parts and scales from the experiments' registry."""

from __future__ import annotations

import dataclasses
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
    file = f"{part.scale_file or part.module}.toml"
    tables = tomllib.loads(
        resources.files("nopelab.experiments").joinpath("scales", file).read_text()
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
    language_models += ["haviv2022 --part sizes", "wang2024 --part lengths"]
    assert taking("corpus") == language_models
    assert "chi2023 --part pretrained" in resumable()
    assert "real-model --part smollm2" not in resumable()
    assert "zuo2025 --part probes" in _help("models")


@pytest.mark.parametrize("paper, name", [p.split(" --part ") for p in taking("corpus")])
def test_every_language_model_of_a_part_trains_on_its_corpus(paper: str, name: str) -> None:
    part = EXPERIMENTS[paper].parts[name]
    runs = part.settings("smoke", 0, "cpu", corpus="sotu+default")
    listed = getattr(runs, "runs", None) or {m.key: m.run for m in runs.models}
    assert listed and {run.corpus.source for run in listed.values()} == {"sotu+default"}
    default = part.settings("smoke", 0, "cpu")
    listed = getattr(default, "runs", None) or {m.key: m.run for m in default.models}
    assert {run.corpus.source for run in listed.values()} == {"default"}


def _runs(settings: object) -> dict:
    return getattr(settings, "runs", None) or {m.key: m.run for m in settings.models}  # type: ignore[attr-defined]


@pytest.mark.parametrize("paper, name", [p.split(" --part ") for p in taking("corpus")])
def test_every_language_model_scale_trains_within_four_epochs_of_its_corpus(
    paper: str, name: str
) -> None:
    """The recipe's bounds at every CPU scale: at most ~4 epochs of the corpus's training split
    (its own corpus where a scale names one), and 20 tokens per parameter of the size's NoPE
    model (19.9 at the 5 M-token floor of 1221 steps: "20 per parameter" in whole steps; every
    encoding of a size sees the same tokens, so a learned table's rows lower its own count)."""
    from nopelab.models.transformer import build_model
    from nopelab.training.corpus import load_text, split_text

    part = EXPERIMENTS[paper].parts[name]
    for scale in ("small", "medium", "large"):
        if scale not in part.scales:
            continue
        for run in _runs(part.settings(scale, 0, "cpu")).values():
            tokens = run.train.steps * run.train.batch_size * run.train.seq_len
            train_bytes = len(split_text(load_text(run.corpus.source))[0].encode())
            assert tokens <= 4 * train_bytes, (scale, run.corpus.source, tokens / train_bytes)
            body = dataclasses.replace(run.model, pos_encoding="none")
            parameters = sum(p.numel() for p in build_model(body, 0).parameters())
            assert tokens >= 19.8 * parameters, (scale, tokens / parameters)


@pytest.mark.parametrize("paper, name", [p.split(" --part ") for p in taking("corpus")])
def test_a_scale_names_its_own_corpus_and_corpus_overrides_it(paper: str, name: str) -> None:
    part = EXPERIMENTS[paper].parts[name]
    if "large" not in part.scales:
        return
    sources = {run.corpus.source for run in _runs(part.settings("large", 0, "cpu")).values()}
    assert sources == {"sotu+default"}
    given = part.settings("large", 0, "cpu", corpus="sotu")
    assert {run.corpus.source for run in _runs(given).values()} == {"sotu"}
