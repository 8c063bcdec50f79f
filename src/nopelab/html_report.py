"""``nopelab report``: one self-contained HTML page for a run, a reproduction or a sweep.

The page holds the folder's ``summary.md`` (its headline numbers and tables), a sweep's results
table and failures, every figure (embedded, so the page opens offline and can be mailed), the
tables of the folder's parquet files, its settings and the versions it ran with. It shows only
files that lie inside the folder: symbolic links are left out, and the page says which.
"""

from __future__ import annotations

import base64
import html
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
import pyarrow
from markdown_it import MarkdownIt

from nopelab.errors import UserError, first_line
from nopelab.runtime.rundir import (
    RUN_MARKER,
    check_path,
    environment,
    is_disk_full,
    missing_folders,
    remove_empty,
    replace_atomically,
)

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
.note { background: #fff4d6; padding: 0.5rem 0.75rem; }
"""
SETTINGS_FILES = ("config.json", "grid.json", "reproduction.json")


class Contents:
    """The regular files of a reported folder, found without following symbolic links, so that
    nothing outside the folder reaches the page; the links met are kept to say what was left
    out. Reading a file that does not parse is a one-line error naming it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder  # as the user gave it: how errors name its files
        self.root = folder.resolve()
        self.files: list[PurePosixPath] = []
        self.links: list[PurePosixPath] = []
        for top, dirs, names in os.walk(self.root):  # never enters a linked folder
            here = PurePosixPath(Path(top).relative_to(self.root).as_posix())
            for name in [*dirs, *names]:
                try:
                    mode = os.lstat(os.path.join(top, name)).st_mode
                except FileNotFoundError:  # removed meanwhile (a sweep still running)
                    continue
                if stat.S_ISLNK(mode):
                    self.links.append(here / name)
                elif stat.S_ISREG(mode):
                    self.files.append(here / name)
        self.files.sort()
        self.links.sort()

    def has(self, name: str) -> bool:
        return PurePosixPath(name) in self.files

    def select(self, suffix: str, folder: str | None = None) -> list[PurePosixPath]:
        """The files ending in ``suffix``, in the subfolder ``folder`` ("." the top) or anywhere."""
        return [
            p
            for p in self.files
            if p.suffix == suffix and (folder is None or p.parent == PurePosixPath(folder))
        ]

    def text(self, name: PurePosixPath | str) -> str:
        try:
            return (self.root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(
                f"DIR: {self.folder / name} is not readable UTF-8 text: {exc}"
            ) from None

    def data(self, name: PurePosixPath) -> bytes:
        try:
            return (self.root / name).read_bytes()
        except OSError as exc:
            raise UserError(f"DIR: {self.folder / name} cannot be read: {exc.strerror}") from None

    def table(self, name: PurePosixPath) -> pd.DataFrame:
        try:
            return pd.read_parquet(self.root / name)
        except (OSError, ValueError, pyarrow.ArrowException) as exc:
            raise UserError(
                f"DIR: {self.folder / name} cannot be read as a parquet table: {first_line(exc)}"
            ) from None

    def json(self, name: str) -> dict[str, Any]:
        """A JSON object that nopelab wrote; anything else is a one-line error."""
        try:
            data = json.loads(self.text(name))
        except json.JSONDecodeError as exc:
            raise UserError(f"DIR: {self.folder / name} cannot be read as JSON: {exc}") from None
        if not isinstance(data, dict):
            raise UserError(f"DIR: {self.folder / name} does not hold a JSON object")
        return data


def kind(contents: Contents) -> str:
    """``sweep``, ``reproduction`` or ``run``: what the folder holds, from the files nopelab wrote."""
    if contents.has("grid.json"):
        return "sweep"
    command = contents.json(RUN_MARKER).get("command") if contents.has(RUN_MARKER) else None
    return "reproduction" if command == "reproduce" else "run"


def render(folder: Path) -> str:
    """The report page of ``folder`` as one HTML string."""
    contents = Contents(folder)
    sections = [_summary(contents), _left_out(contents)]
    if kind(contents) == "sweep":
        sections.append(_sweep(contents))
    sections += [_figures(contents), _tables(contents), _settings(contents)]
    title = html.escape(f"nopelab {kind(contents)}: {_typed(folder).name}")
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


def _typed(folder: Path) -> Path:
    """``folder`` as the user typed it, made absolute without following links."""
    return Path(os.path.abspath(folder.expanduser()))


def _summary(contents: Contents) -> str:
    if not contents.has("summary.md"):
        return f"<h1>{html.escape(_typed(contents.folder).name)}</h1>"
    return (
        MarkdownIt("commonmark", {"html": False})
        .enable("table")
        .render(contents.text("summary.md"))
    )


def _left_out(contents: Contents) -> str:
    if not contents.links:
        return ""
    links = ", ".join(f"<code>{html.escape(str(p))}</code>" for p in contents.links)
    return (
        f'<p class="note">Left out: {links}: symbolic links; the page shows only the files '
        "inside the folder.</p>"
    )


def _sweep(contents: Contents) -> str:
    parts = ["<h2>Sweep results</h2>"]
    results = contents.select(".parquet", "results")
    if results:
        frame = pd.concat([contents.table(p) for p in results], ignore_index=True)
        cells = frame["cell"].nunique() if "cell" in frame else len(results)
        parts.append(f"<p>{cells} finished cells, {len(frame)} rows.</p>")
        parts.append(_table(frame))
    else:
        parts.append("<p>No cell has finished yet.</p>")
    failed = contents.select(".txt", "failed")
    if failed:
        items = "".join(
            f"<li><code>{html.escape(p.stem)}</code>: {html.escape(contents.text(p).strip())}</li>"
            for p in failed
        )
        parts.append(f"<h3>Failed cells</h3><ul>{items}</ul>")
    return "\n".join(parts)


def _figures(contents: Contents) -> str:
    figures = [
        f'<figure><img alt="{html.escape(str(p))}" '
        f'src="data:image/png;base64,{base64.b64encode(contents.data(p)).decode()}">'
        f"<figcaption>{html.escape(str(p))}</figcaption></figure>"
        for p in contents.select(".png")
    ]
    return "<h2>Figures</h2>\n" + "\n".join(figures) if figures else ""


def _tables(contents: Contents) -> str:
    tables = [
        f"<details><summary>{html.escape(p.name)}</summary>{_table(contents.table(p))}</details>"
        for p in contents.select(".parquet", ".")
    ]
    return "<h2>Tables</h2>\n" + "\n".join(tables) if tables else ""


def _table(frame: pd.DataFrame) -> str:
    shown = frame.head(MAX_ROWS)
    note = f"<p>First {MAX_ROWS} of {len(frame)} rows.</p>" if len(frame) > MAX_ROWS else ""
    return note + shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)


def _settings(contents: Contents) -> str:
    parts = []
    for name in SETTINGS_FILES:
        if contents.has(name):
            text = json.dumps(contents.json(name), indent=2)
            parts.append(f"<h3>{name}</h3><pre>{html.escape(text)}</pre>")
    ran_with: dict[str, Any] = {}
    if contents.has(RUN_MARKER):
        ran_with["written by"] = contents.json(RUN_MARKER)
    if contents.has("config.json"):
        ran_with["environment"] = contents.json("config.json").get("environment")
    ran_with["this page"] = environment()
    text = json.dumps({k: v for k, v in ran_with.items() if v is not None}, indent=2)
    return (
        "<h2>Settings and versions</h2>\n"
        + "\n".join(parts)
        + f"<h3>versions</h3><pre>{html.escape(text)}</pre>"
    )


def default_page(folder: Path) -> Path:
    """``DIR.html`` beside ``DIR`` as the user typed it: beside a linked folder's link, not
    beside its target."""
    typed = _typed(folder)
    return typed.parent / f"{typed.name}.html"


def check_report(folder: Path, out: Path, force: bool) -> None:
    """Refuse, before any work, a folder that is no nopelab output or an ``out`` that must not be
    written."""
    if not folder.is_dir():
        raise UserError(f"DIR: {folder} is not a folder")
    if not any((folder / name).is_file() for name in (RUN_MARKER, "grid.json")):
        raise UserError(f"DIR: {folder} holds no nopelab run, reproduction or sweep")
    target, source = check_path(out), folder.resolve()
    if source in target.parents:
        raise UserError(f"--out: {out} lies inside {folder}; a run's outputs go elsewhere")
    if out.suffix != ".html":
        raise UserError(f"--out: {out}: expected a .html file")
    if out.exists():
        if not force:
            raise UserError(f"--out: {out} exists; choose another file or pass --force")
        try:
            ours = out.is_file() and f'content="{GENERATOR}"' in out.read_text(errors="replace")
        except OSError:
            ours = False
        if not ours:
            raise UserError(f"--out: {out} is not a nopelab report; --force replaces only those")
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"--out: cannot write {out}: {parent} is not writable; choose another place"
        )


def write_page(out: Path, page: str) -> None:
    """Write ``page`` to ``out`` whole or not at all, creating the missing folders (removed again
    if writing fails); a place that cannot be written is a one-line error naming --out."""
    created = missing_folders(out.parent)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(out, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    except OSError as exc:
        remove_empty(created)
        if is_disk_full(exc):
            raise
        raise UserError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        remove_empty(created)
        raise
