"""The ``nopelab`` command line: one module per command, options generated from the config
dataclasses (:mod:`nopelab.cli.options`)."""

from nopelab.cli import (  # noqa: F401  (importing a command module registers the command)
    analyze,
    compare_signals,
    evaluate,
    export,
    headscale,
    intervene,
    probe,
    report,
    reproduce,
    sweep,
    train,
)
from nopelab.cli.app import app
from nopelab.cli.main import _redeliver_interrupt, main

__all__ = ["_redeliver_interrupt", "app", "main"]
