"""``nopelab report DIR``: one self-contained HTML page for a run, reproduction or sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nopelab.cli.app import OUTPUT, app


@app.command()
def report(
    folder: Annotated[
        Path, typer.Argument(help="A run directory, a reproduction folder or a sweep folder")
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="The page to write \\[DIR.html, beside DIR]", rich_help_panel=OUTPUT),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Replace an existing report", rich_help_panel=OUTPUT)
    ] = False,
) -> None:
    """Write one HTML page (headline numbers, tables, every figure, settings, versions) that
    opens offline in a browser."""
    from nopelab.html_report import check_report, render
    from nopelab.runtime.rundir import replace_atomically

    out = out or folder.resolve().parent / f"{folder.resolve().name}.html"
    check_report(folder, out, force)
    page = render(folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(out, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    typer.echo(f"wrote {out}")
