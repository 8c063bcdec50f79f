"""``python -m nopelab``, and the light entry point of the ``nopelab`` command.

Importing the commands takes a second or more (PyTorch); an interrupt in that time is one line
and status 130 like any other, so the handlers are set before anything heavy is imported (the
package itself sets the OpenMP wait policy that PyTorch reads when it loads).
"""

import os
import signal
import sys

from nopelab.errors import INTERRUPTED


def main() -> None:
    """Run the ``nopelab`` command line; Ctrl-C or SIGTERM while it starts exits 130 quietly,
    and the process ends as soon as the command has."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it as Ctrl-C does
    try:
        from nopelab.cli import main as run  # the package registers every command
    except KeyboardInterrupt:
        # nothing was written yet; a module cut off mid-import must not run its exit handlers
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(INTERRUPTED, file=sys.stderr, flush=True)
        os._exit(130)
    try:
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    # Every file is closed and every worker stopped by now. Tearing the interpreter down (its
    # modules, PyTorch's and numba's thread pools) takes a second or two that nobody waits for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
