"""Errors gradacc shows to people: one clear sentence, never a traceback."""


class GradaccError(ValueError):
    """Bad input: what is wrong and what is allowed.

    ``field`` names the setting at fault (a ``RunConfig`` field name) so the app can show the
    message next to that widget; ``None`` when no single field is to blame.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0])


class RunFailed(RuntimeError):
    """A fault during training (NaN loss, out of memory, ...); the run keeps what it logged."""


class RunStopped(Exception):
    """Raised inside a backend when the stop event is set; not an error."""
