"""The command line is generated from the config dataclasses: every option's name, default and
choices must be the dataclass's, and every setting must be reachable from some command."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import typer.main

from nopelab.cli import app
from nopelab.cli.options import COMMANDS, Given, Option
from nopelab.config import (
    AnalysisConfig,
    CorpusConfig,
    HFConfig,
    InterventionConfig,
    ModelConfig,
    ProbeConfig,
    TrainConfig,
    choices_of,
)
from nopelab.errors import UserError
from nopelab.training.task_config import TaskConfig

CONFIGS = (
    ModelConfig, AnalysisConfig, HFConfig, TrainConfig, CorpusConfig, TaskConfig, ProbeConfig,
    InterventionConfig,
)  # fmt: skip


def click_command(name: str) -> Any:
    return typer.main.get_command(app).commands[name]


def rendered(value: object, option: Option) -> str:
    """A default as help should show it, rendered here independently of the generator."""
    if isinstance(value, bool):
        on, off = option.decl.split("/")
        return on if value else off
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def nothing_typed(options: tuple[Option, ...]) -> Given:
    return Given(options, dict.fromkeys((o.param for o in options), None))


def effective_default(option: Option, options: tuple[Option, ...]) -> object:
    """What the command uses when neither a flag nor a config file sets the field: built
    through the command's own path (an empty config with no flags laid over it)."""
    data: dict = {}
    nothing_typed(options).lay_over(data, option.group.section)
    built = option.group.cls(**data[option.group.section])
    return getattr(built, option.field.name)


def mismatches(command_name: str, command: Any) -> list[str]:
    """Every way the command's options differ from the config dataclasses."""
    problems = []
    params = {p.name: p for p in command.params}
    for option in COMMANDS[command_name]:
        param = params.get(option.param)
        if param is None:
            problems.append(f"{command_name}: {option.flag} is missing")
            continue
        names = [*param.opts, *param.secondary_opts]
        if names != option.decl.split("/"):
            problems.append(f"{command_name}: {option.flag} is named {names}")
        if param.default is not None:  # None: not typed, so a config file's value stands
            problems.append(f"{command_name}: {option.flag} has default {param.default!r}")
        help_text = param.help or ""
        for choice in choices_of(option.hint) or ():
            if choice not in help_text:
                problems.append(f"{command_name}: {option.flag} help lacks the choice {choice}")
        shown = option.group.shown.get(option.field.name) or option.field.metadata.get("shown")
        if shown is None or option.field.name in option.group.defaults:
            shown = rendered(effective_default(option, COMMANDS[command_name]), option)
        if not help_text.endswith(f"\\[{shown}]"):
            problems.append(f"{command_name}: {option.flag} help {help_text!r} shows no [{shown}]")
    return problems


@pytest.mark.parametrize("command_name", sorted(COMMANDS))
def test_options_match_the_config_dataclasses(command_name: str) -> None:
    assert mismatches(command_name, click_command(command_name)) == []


def test_a_mismatch_is_caught() -> None:
    """The check above can fail: a default, a choice list and a name edited by hand."""
    command = copy.deepcopy(click_command("analyze"))
    for param in command.params:
        if param.name == "layers":
            param.help = param.help.replace("[6]", "[8]")
        if param.name == "pos_encoding":
            param.help = param.help.replace("| alibi", "")
        if param.name == "samples":
            param.opts = ["--n-samples"]
    problems = mismatches("analyze", command)
    assert len(problems) == 3, problems
    assert any("--layers" in p and "[6]" in p for p in problems)
    assert any("alibi" in p for p in problems)
    assert any("--samples is named" in p for p in problems)


def test_every_setting_is_an_option_somewhere() -> None:
    """A config field with help metadata that no command exposes would be unreachable from the
    command line (the config file would be the only way)."""
    exposed = {(o.group.cls, o.field.name) for options in COMMANDS.values() for o in options}
    for cls in CONFIGS:
        for f in dataclasses.fields(cls):
            assert "help" in f.metadata, f"{cls.__name__}.{f.name} has no help"
            assert (cls, f.name) in exposed, f"{cls.__name__}.{f.name} is on no command"


@pytest.mark.parametrize(
    ("flag", "text", "value"),
    [
        ("--nope-layers", "2, 4", (2, 4)),
        ("--sites", "embed,attn_out", ("embed", "attn_out")),
        ("--features", "raw,norm+cos_last", ("raw", "norm+cos_last")),
        ("--rope-off", "all", "all"),
        ("--rope-off", "1,3", (1, 3)),
        ("--layers", 3, 3),
    ],
)
def test_typed_text_becomes_the_field_value(flag: str, text: object, value: object) -> None:
    option = next(o for options in COMMANDS.values() for o in options if o.flag == flag)
    assert option.parse(text) == value


def test_a_bad_layer_list_names_the_flag() -> None:
    option = next(o for o in COMMANDS["probe"] if o.flag == "--probe-layers")
    with pytest.raises(UserError, match=r"^--probe-layers: expected comma-separated"):
        option.parse("1,two")
