"""nopelab: where transformers without positional encodings keep position.

The Python API (see :mod:`nopelab.api`): ``load`` resolves a model the way the command line
does, ``analyze`` reduces its statistics, ``summary_rows`` gives what ``summary.json`` holds.
They are imported on first use, so that ``nopelab`` itself loads without PyTorch.

Importing ``nopelab`` sets ``OMP_WAIT_POLICY=passive`` unless the variable is set: OpenMP
threads (PyTorch's, numba's) then sleep while they wait for work instead of spinning, which
on a CPU shared with other processes is the difference between a steady run and one many times
slower (docs/performance.md, "On a shared machine"). The OpenMP runtime reads it once, when it
loads: import ``nopelab`` before ``torch`` for it to take effect in this process; the processes
it starts inherit it.
"""

import os
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

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
