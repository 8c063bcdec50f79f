"""The ``nopelab`` entry point: exit statuses, and errors that name the flag the user typed."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import typer

from nopelab.cli.app import app
from nopelab.cli.options import COMMANDS
from nopelab.errors import INTERRUPTED, RunFailed, UserError, interrupted
from nopelab.runtime.allocator import keep_freed_memory
from nopelab.runtime.rundir import is_disk_full


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2, a failed run 1,
    an interrupt (SIGINT or SIGTERM) 130."""
    _HANDLED.clear()
    # `kill`, `timeout` and job schedulers send SIGTERM: it stops a run as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _redeliver_interrupt
    _SWALLOWED.clear()
    try:
        _run()
    except SystemExit as exc:
        if exc.code == 130 and _SWALLOWED.is_set():
            # Python remembers an interrupt that C code swallowed as unhandled and would end the
            # process by SIGINT (status -2) at exit, though nopelab handled it: leave directly
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def _run() -> None:
    try:
        keep_freed_memory()
        code = app(standalone_mode=False)  # typer turns Ctrl-C inside a command into 130
        if code == 130:
            _mark_handled()
            typer.echo(INTERRUPTED, err=True)
        if code:
            sys.exit(code)
    except UserError as exc:
        typer.echo(f"nopelab: error: {_as_typed(exc)}", err=True)
        sys.exit(2)
    except RunFailed as exc:
        typer.echo(f"nopelab: error: {exc}", err=True)
        sys.exit(1)
    except typer.Abort:
        _mark_handled()
        typer.echo("nopelab: aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors from the parser (unknown flag, bad int)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        opts = getattr(getattr(exc, "param", None), "opts", None)
        if opts and message and getattr(exc, "message", None):  # a flag's value: name the flag
            typed = [o for o in opts if _was_typed(o, sys.argv)]
            message = f"{(typed or opts)[0]}: {exc.message[0].lower()}{exc.message[1:]}"
        if message:  # empty when the parser has already printed the help instead
            typer.echo(f"nopelab: error: {message}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        _exit_interrupted()
    except Exception as exc:
        if interrupted(exc):
            _exit_interrupted()
        if not (isinstance(exc, OSError) and is_disk_full(exc)):
            raise
        where = f" while writing {exc.filename}" if exc.filename else ""
        typer.echo(f"nopelab: error: {exc.strerror}{where}; nothing half-written is kept", err=True)
        sys.exit(1)


def _exit_interrupted() -> None:
    _mark_handled()
    typer.echo(INTERRUPTED, err=True)
    sys.exit(130)


_HANDLED = threading.Event()  # an interrupt was reported: the process is on its way out
_SWALLOWED = threading.Event()  # an interrupt was raised in code called from C, and lost there


def _as_typed(exc: UserError) -> str:
    """The error, naming the flag the user typed (``--layers``) rather than the config field it
    sets (``n_layers``). The command's generated options map (section, field) to flags; a value
    that no typed flag set (a config file's) keeps the field's name."""
    from nopelab.errors import ConfigError

    argv = sys.argv[1:]
    if not isinstance(exc, ConfigError) or not argv:
        return str(exc)
    options = COMMANDS.get(argv[0], ())
    section, field = exc.section, exc.field
    if "." in field:  # "probe.layers"; "config.task" names a table, not a setting
        section, field = field.rsplit(".", 1)
        if section not in {o.group.section for o in options}:
            return str(exc)
    named = [o for o in options if o.field.name == field]
    if section is not None:
        named = [o for o in named if o.group.section == section]
    flags = [o.decl.split("/") for o in named] or [["--" + field.replace("_", "-")]]
    if len(flags) == 1:  # unambiguous: one flag (and its --no- form) sets this field
        for flag in flags[0]:
            if _was_typed(flag, argv):
                return f"{flags[0][0]}: {exc.message}"
    return str(exc)


def _was_typed(flag: str, argv: list[str]) -> bool:
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in argv)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _mark_handled() -> None:
    """The interrupt is handled: a redelivered one must not interrupt the exit that reports it."""
    _HANDLED.set()


def _redeliver() -> None:
    if not _HANDLED.is_set():
        os.kill(os.getpid(), signal.SIGINT)


def _redeliver_interrupt(unraisable: Any) -> None:
    """An interrupt raised while C code was calling back into Python (numba compiling a kernel)
    is swallowed there: deliver it again a moment later, back in ordinary Python code."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _SWALLOWED.set()
        timer = threading.Timer(0.05, _redeliver)
        timer.daemon = True  # never keeps an exiting process alive
        timer.start()
    else:
        sys.__unraisablehook__(unraisable)
