"""MkDocs hook (mkdocs.yml `hooks`): pipes inside code spans in table rows.

GitHub needs a pipe inside a table cell escaped even in code (`--mlp gelu\\|swiglu`), while
Python-Markdown's tables already skip pipes inside code spans and would show the backslash. The
pages are written for GitHub; on the site the escape is dropped inside code spans of table rows.
"""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|"):
            lines[i] = CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
    return "\n".join(lines)
