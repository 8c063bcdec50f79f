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
    from nopelab.html_report import check_report, default_page, render, write_page

    out = out or default_page(folder)
    check_report(folder, out, force)
    write_page(out, render(folder))
    typer.echo(f"wrote {out}")
