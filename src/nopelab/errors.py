"""User-facing errors: one line, naming the field and what is allowed."""

INTERRUPTED = "nopelab: interrupted; nothing was written"


class UserError(Exception):
    """Bad input from the user. The CLI prints it on one line and exits with status 2."""


class ConfigError(UserError):
    """An invalid configuration value: ``field`` names it; ``section`` (``model``, ``train``…),
    when known, is the settings table it belongs to, so the CLI can name the flag that set it."""

    def __init__(self, field: str, message: str, section: str | None = None):
        self.field, self.message, self.section = field, message, section
        super().__init__(f"{field}: {message}")

    def __reduce__(self) -> tuple:  # picklable, so it can come back from a worker process
        return type(self), (self.field, self.message, self.section)


class RunFailed(Exception):
    """A run that started but could not finish (a diverged loss, non-finite activations).
    The CLI prints it on one line and exits with status 1."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def interrupted(exc: BaseException) -> bool:
    """Whether an error stems from an interrupt: Python wraps a KeyboardInterrupt raised while a
    class is created (a module being imported) in a RuntimeError."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
