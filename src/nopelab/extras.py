"""Optional parts of nopelab and the packages they need (``pip install 'nopelab[EXTRA]'``).

The default paths (random and trained native models, the papers' parts on them, sweeps on this
machine) need none of these; a command that needs a missing one stops in one line naming the
extra to install (exit status 2)."""

from __future__ import annotations

import importlib
from types import ModuleType

from nopelab.errors import UserError

EXTRAS = {  # importable module -> the extra that installs it
    "transformers": "hf",
    "gguf": "hf",
    "accelerate": "hf",
    "ray": "ray",
    "concept_erasure": "interventions",
}


def need(module: str, what: str) -> ModuleType:
    """``module``, imported; or a one-line error saying that ``what`` needs its extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS[module]
        raise UserError(
            f"{what} needs the {extra!r} extra ({module} is not installed): "
            f"pip install 'nopelab[{extra}]'"
        ) from None
