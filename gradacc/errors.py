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

    @property
    def by_field(self) -> dict[str, str]:
        """{field: sentence} for a form to show beside its widgets ("config": no single field); one entry here,
        one per bad field for a config's check (gradacc.config.ConfigErrors)."""
        return {self.field or "config": self.message}


class RunFailed(RuntimeError):
    """A fault during training (NaN loss, out of memory, ...); the run keeps what it logged."""


class RunStopped(Exception):
    """Raised inside a backend when the stop event is set; not an error."""


def one_line(error: BaseException, *, with_type: bool = True, limit: int | None = None) -> str:
    """``error`` in one line for a page, a log or the CLI: "TypeName: first line of its message".

    Only the type's name when the message is empty; only the message with ``with_type=False``; cut to
    ``limit`` characters (the last one "…") when given. Tracebacks and long library messages stay out.
    """
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else ""
    if not first:
        line = type(error).__name__
    else:
        line = f"{type(error).__name__}: {first}" if with_type else first
    return line if limit is None or len(line) <= limit else line[:limit - 1] + "…"
