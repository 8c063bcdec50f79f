"""nopelab: where transformers without positional encodings keep position.

The Python API (see :mod:`nopelab.api`): ``load`` resolves a model the way the command line
does, ``analyze`` reduces its statistics, ``summary_rows`` gives what ``summary.json`` holds.
They are imported on first use, so that ``nopelab`` itself loads without PyTorch.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Study", "analyze", "load", "summary_rows"]


def __getattr__(name: str) -> Any:
    if name in ("Study", "analyze", "load"):
        from nopelab import api

        return getattr(api, name)
    if name == "summary_rows":
        from nopelab.measure.run_files import summary_rows

        return summary_rows
    raise AttributeError(f"module 'nopelab' has no attribute {name!r}")
