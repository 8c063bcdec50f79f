"""MkDocs hooks (mkdocs.yml `hooks`): the command reference, and pipes in table code spans.

* ``<!-- options: COMMAND -->`` on a line of its own becomes a table of the command's options,
  generated from the command line itself (and so from the config dataclasses it is built from):
  flag, meaning with choices and default, a table per help panel.
* GitHub needs a pipe inside a table cell escaped even in code (`--mlp gelu\\|swiglu`), while
  Python-Markdown's tables already skip pipes inside code spans and would show the backslash. The
  pages are written for GitHub; on the site the escape is dropped inside code spans of table rows.
"""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")
OPTIONS = re.compile(r"^<!-- options: ([\w-]+) -->$", re.MULTILINE)


def options_table(name: str) -> str:
    """Markdown tables of one command's options, by help panel, in the order help shows them."""
    import typer.main

    from nopelab.cli import app

    command = typer.main.get_command(app).commands[name]
    panels: dict[str, list[str]] = {}
    for param in command.params:
        if param.param_type_name != "option" or param.hidden:
            continue
        flags = " / ".join(f"`{flag}`" for flag in (*param.opts, *param.secondary_opts))
        text = (param.help or "").replace("\\[", "[").replace("|", "\\|")
        if param.default not in (None, False) and not text.endswith("]"):
            text += f" [{param.default}]"
        panel = getattr(param, "rich_help_panel", None) or "Options"
        panels.setdefault(panel, []).append(f"| {flags} | {text} |")
    return "\n\n".join(
        f"**{panel}**\n\n| flag | meaning [default] |\n|---|---|\n" + "\n".join(rows)
        for panel, rows in panels.items()
    )


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    markdown = OPTIONS.sub(lambda m: options_table(m.group(1)), markdown)
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|"):
            lines[i] = CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
    return "\n".join(lines)
