"""``nopelab report``: one self-contained HTML page for a run, a reproduction or a sweep.

The page holds the folder's ``summary.md`` (its headline numbers and tables), a sweep's results
table and failures, every figure (embedded, so the page opens offline and can be mailed), the
tables of the folder's parquet files, its settings and the versions it ran with.
"""

from __future__ import annotations

import base64
import html
import json
import platform
from pathlib import Path
from typing import Any

import pandas as pd
from markdown_it import MarkdownIt

from nopelab.errors import UserError
from nopelab.runtime.rundir import RUN_MARKER

GENERATOR = "nopelab report"  # in every page's <meta name="generator">: what --force may replace
MAX_ROWS = 500  # rows shown per table (the parquet file holds them all)
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f3f3f3; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85rem; color: #555; }
pre { background: #f7f7f7; padding: 0.75rem; overflow-x: auto; font-size: 0.8rem; }
details { margin: 0.5rem 0; } summary { cursor: pointer; font-weight: 600; }
"""
SETTINGS_FILES = ("config.json", "grid.json", "reproduction.json")


def kind(folder: Path) -> str:
    """``sweep``, ``reproduction`` or ``run``: what the folder holds, from the files nopelab wrote."""
    if (folder / "grid.json").is_file():
        return "sweep"
    marker = folder / RUN_MARKER
    command = _json(marker).get("command") if marker.is_file() else None
    return "reproduction" if command == "reproduce" else "run"


def render(folder: Path) -> str:
    """The report page of ``folder`` as one HTML string."""
    sections = [_summary(folder)]
    if kind(folder) == "sweep":
        sections.append(_sweep(folder))
    sections += [_figures(folder), _tables(folder), _settings(folder)]
    title = html.escape(f"nopelab {kind(folder)}: {folder.name}")
    body = "\n".join(s for s in sections if s)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="{GENERATOR}">
<title>{title}</title>
<style>{STYLE}</style>
</head>
<body>
<p><em>{title}</em></p>
{body}
</body>
</html>
"""


def _summary(folder: Path) -> str:
    path = folder / "summary.md"
    if not path.is_file():
        return f"<h1>{html.escape(folder.name)}</h1>"
    return (
        MarkdownIt("commonmark", {"html": False})
        .enable("table")
        .render(path.read_text(encoding="utf-8"))
    )


def _sweep(folder: Path) -> str:
    parts = ["<h2>Sweep results</h2>"]
    results = folder / "results"
    if any(results.glob("*.parquet")):
        frame = pd.read_parquet(results)
        parts.append(f"<p>{frame['cell'].nunique()} finished cells, {len(frame)} rows.</p>")
        parts.append(_table(frame))
    else:
        parts.append("<p>No cell has finished yet.</p>")
    failed = sorted((folder / "failed").glob("*.txt"))
    if failed:
        items = "".join(
            f"<li><code>{html.escape(p.stem)}</code>: {html.escape(p.read_text(encoding='utf-8').strip())}</li>"
            for p in failed
        )
        parts.append(f"<h3>Failed cells</h3><ul>{items}</ul>")
    return "\n".join(parts)


def _figures(folder: Path) -> str:
    images = sorted(folder.rglob("*.png"))
    if not images:
        return ""
    figures = [
        f'<figure><img alt="{html.escape(str(p.relative_to(folder)))}" '
        f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        f"<figcaption>{html.escape(str(p.relative_to(folder)))}</figcaption></figure>"
        for p in images
    ]
    return "<h2>Figures</h2>\n" + "\n".join(figures)


def _tables(folder: Path) -> str:
    tables = [
        f"<details><summary>{html.escape(p.name)}</summary>{_table(pd.read_parquet(p))}</details>"
        for p in sorted(folder.glob("*.parquet"))
    ]
    return "<h2>Tables</h2>\n" + "\n".join(tables) if tables else ""


def _table(frame: pd.DataFrame) -> str:
    shown = frame.head(MAX_ROWS)
    note = f"<p>First {MAX_ROWS} of {len(frame)} rows.</p>" if len(frame) > MAX_ROWS else ""
    return note + shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)


def _settings(folder: Path) -> str:
    parts = []
    for name in SETTINGS_FILES:
        path = folder / name
        if path.is_file():
            text = json.dumps(_json(path), indent=2)
            parts.append(f"<h3>{name}</h3><pre>{html.escape(text)}</pre>")
    ran_with = {}
    if (folder / RUN_MARKER).is_file():
        ran_with["written by"] = _json(folder / RUN_MARKER)
    if (folder / "config.json").is_file():
        ran_with["environment"] = _json(folder / "config.json").get("environment")
    ran_with["this page"] = _versions()
    text = json.dumps({k: v for k, v in ran_with.items() if v is not None}, indent=2)
    return (
        "<h2>Settings and versions</h2>\n"
        + "\n".join(parts)
        + f"<h3>versions</h3><pre>{html.escape(text)}</pre>"
    )


def _versions() -> dict[str, Any]:
    import torch

    from nopelab import __version__

    return {"nopelab": __version__, "torch": torch.__version__, "python": platform.python_version()}


def _json(path: Path) -> dict[str, Any]:
    """A JSON object that nopelab wrote; anything else is a one-line error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"DIR: {path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"DIR: {path} does not hold a JSON object")
    return data


def check_report(folder: Path, out: Path, force: bool) -> None:
    """Refuse, before any work, a folder that is no nopelab output or an ``out`` that must not be
    written."""
    if not folder.is_dir():
        raise UserError(f"DIR: {folder} is not a folder")
    if not any((folder / name).is_file() for name in (RUN_MARKER, "grid.json")):
        raise UserError(f"DIR: {folder} holds no nopelab run, reproduction or sweep")
    target, source = out.expanduser().resolve(), folder.expanduser().resolve()
    if source in target.parents:
        raise UserError(f"--out: {out} lies inside {folder}; a run's outputs go elsewhere")
    if out.suffix != ".html":
        raise UserError(f"--out: {out}: expected a .html file")
    if out.exists():
        if not force:
            raise UserError(f"--out: {out} exists; choose another file or pass --force")
        if not out.is_file() or f'content="{GENERATOR}"' not in out.read_text(errors="replace"):
            raise UserError(f"--out: {out} is not a nopelab report; --force replaces only those")
