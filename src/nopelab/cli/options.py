"""Command-line options generated from the config dataclasses.

A :class:`Group` puts one config section's fields on a command; :func:`with_options` adds
the groups' options to the command's signature (typer reads it) and hands the command a
:class:`Given` holding what the user typed, under config field names. Names, choices,
defaults and help all come from the dataclass fields (:func:`nopelab.config.setting`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import typer

from nopelab.config import choices_of, without_none
from nopelab.errors import UserError


@dataclass(frozen=True)
class Group:
    """One config section's fields as options of one command.

    ``only``/``exclude``: which fields; ``defaults``: values this command uses where neither a
    flag nor the config file sets them; ``shown``: how help shows a default the command decides
    at run time.
    """

    section: str
    cls: type
    panel: str
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)

    def options(self) -> list[Option]:
        hints = get_type_hints(self.cls)
        return [
            Option(self, f, hints[f.name])
            for f in dataclasses.fields(self.cls)
            if (self.only is None or f.name in self.only) and f.name not in self.exclude
        ]


@dataclass(frozen=True)
class Option:
    """One generated option: a config field, its type, and how it looks on the command line."""

    group: Group
    field: dataclasses.Field
    hint: Any

    @property
    def decl(self) -> str:
        """``--layers``, or ``--bias/--no-bias`` for a bool."""
        flag = self.field.metadata.get("flag") or "--" + self.field.name.replace("_", "-")
        if self.hint is bool and "/" not in flag:
            flag = f"{flag}/--no-{flag[2:]}"
        return flag

    @property
    def flag(self) -> str:
        """The option's (first) name, as errors quote it."""
        return self.decl.split("/")[0]

    @property
    def param(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def default(self) -> Any:
        return self.group.defaults.get(self.field.name, self.field.default)

    def shown_default(self) -> str:
        """The default as help shows it."""
        name = self.field.name
        shown = self.group.shown.get(name) or self.field.metadata.get("shown")
        if shown is not None and name not in self.group.defaults:
            return shown
        value = self.default
        if isinstance(value, bool):
            on, _, off = self.decl.partition("/")
            return on if value else off
        if isinstance(value, tuple):
            return ",".join(map(str, value))
        return f"{value:g}" if isinstance(value, float) else str(value)

    def help(self) -> str:
        """Help text: the field's sentence, its choices, its default (rich markup escaped)."""
        text = self.field.metadata["help"]
        choices = choices_of(self.hint)
        if choices is not None:
            text += ": " + " | ".join(choices)
        return f"{text} \\[{self.shown_default()}]"

    def parameter(self) -> inspect.Parameter:
        """The typer parameter: ``None`` when not given, so a config file's value stands."""
        base, _ = without_none(self.hint)
        kind = base if base in (int, float, bool) else str
        option = typer.Option(self.decl, help=self.help(), rich_help_panel=self.group.panel)
        return inspect.Parameter(
            self.param,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[kind | None, option],
        )

    def parse(self, value: Any) -> Any:
        """The typed value as the config field takes it (``"2,4"`` → ``(2, 4)``)."""
        base, _ = without_none(self.hint)
        if value is None or not isinstance(value, str):
            return value
        alternatives = get_args(base) if get_origin(base) is not tuple else (base,)
        if value == "all" and any(choices_of(a) == ("all",) for a in alternatives):
            return value  # a layer list that also takes "all"
        if not any(get_origin(a) is tuple for a in (base, *alternatives)):
            return value
        items = [part for part in value.replace(" ", "").split(",") if part]
        if choices_of(base) is not None or get_args(base)[:1] == (str,):
            return tuple(items)
        try:
            return tuple(int(item) for item in items)
        except ValueError:
            raise UserError(
                f"{self.flag}: expected comma-separated whole numbers like 2,4, got {value!r}"
            ) from None


@dataclass(frozen=True)
class Given:
    """What the user typed for a command's generated options, by config section and field."""

    options: tuple[Option, ...]
    values: dict[str, Any]  # parameter name -> raw value (None: not typed)

    def section(self, name: str) -> dict[str, Any]:
        """The typed settings of one section, parsed, under their field names."""
        return {
            o.field.name: o.parse(self.values[o.param])
            for o in self.options
            if o.group.section == name and self.values[o.param] is not None
        }

    def flags(self, section: str) -> list[str]:
        """The flags typed for one section, as the user wrote them."""
        typed = [o for o in self.options if o.group.section == section]
        return [
            o.decl.split("/")[-1] if self.values[o.param] is False else o.flag
            for o in typed
            if self.values[o.param] is not None
        ]

    def lay_over(self, data: dict[str, Any], section: str) -> None:
        """Lay the typed settings over ``data[section]`` (from a config file), then the
        command's own defaults under what neither set."""
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise UserError(f"--config: [{section}] must be a table of settings")
        table.update(self.section(section))
        for option in self.options:
            if option.group.section == section and option.field.name in option.group.defaults:
                table.setdefault(option.field.name, option.group.defaults[option.field.name])


COMMANDS: dict[str, tuple[Option, ...]] = {}  # command name -> its generated options


def with_options(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the groups' options to a command; the command receives them as ``given: Given``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        options = tuple(option for group in groups for option in group.options())
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(func, eval_str=True).parameters.values()
            if p.name != "given"
        ]
        names = [p.name for p in own] + [o.param for o in options]
        if len(set(names)) != len(names):  # a programming error: two options, one name
            raise TypeError(f"{func.__name__}: duplicate option names {sorted(names)}")

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = {o.param: kwargs.pop(o.param) for o in options}
            return func(**kwargs, given=Given(options, values))

        generated = [option.parameter() for option in options]
        command.__signature__ = inspect.Signature(generated + own)  # type: ignore[attr-defined]
        COMMANDS[func.__name__.replace("_", "-")] = options
        return command

    return decorate
