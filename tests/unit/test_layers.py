"""The packages form layers: a module imports only from lower layers (or its own package), also
through imports inside functions, so that no package needs one above it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "nopelab"
LAYERS = [  # lowest first
    {"__version__", "errors"},
    {"encodings", "extras", "tables"},
    {"config"},
    {"runtime"},
    {"limits"},
    {"models"},
    {"plots"},
    {"training"},
    {"measure"},
    {"hf"},
    {"probing"},
    {"experiments"},
    {"api"},  # also `import nopelab` (its load, analyze and summary_rows)
    {"sweep"},
    {"html_report"},
    {"cli"},
    {"__main__", "nopelab"},
]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}


def _part(module: str, name: str | None = None) -> str:
    """The top-level part of nopelab that ``module`` (or ``from module import name``) is."""
    parts = module.split(".")
    if len(parts) > 1:
        return parts[1]
    return name if name in RANK else "api"


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, inside functions too, but not under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def upward_imports() -> set[tuple[str, str]]:
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        source = parts[0] if len(parts) > 1 else ("nopelab" if parts[0] == "__init__" else parts[0])
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if not (node.module or "").startswith("nopelab") or node.level:
                    continue
                targets = [_part(node.module or "", a.name) for a in node.names]
            else:
                targets = [_part(a.name) for a in node.names if a.name.startswith("nopelab")]
            for target in targets:
                if target != source and RANK[target] >= RANK[source]:
                    edges.add((source, target))
    return edges


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    parts = {p for p in parts if not p.startswith(("_", ".")) or p == "__main__"}
    parts -= {"data"}  # the embedded corpora
    assert parts <= set(RANK), parts - set(RANK)


def test_no_module_imports_from_a_higher_layer() -> None:
    assert upward_imports() == set()
