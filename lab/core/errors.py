"""Every error a user can cause has its own type; the CLI prints `str(err)` as one paragraph."""

from __future__ import annotations


class LabError(Exception):
    """Base class: a failure the user can act on. `hint` says how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message


class BisectError(LabError):
    """The releases given cannot be bisected (fewer than two, repeated, or a probe broke the contract)."""


class ScenarioError(LabError):
    """A scenario file is missing, malformed or invalid. Names file, line and field."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None, hint: str | None = None) -> None:
        self.file = file
        self.line = line
        self.field = field
        where = []
        if file:
            where.append(f"{file}" + (f", line {line}" if line else ""))
        if field:
            where.append(f"field `{field}`")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message, hint)


class EngineError(LabError):
    """The Docker engine is unreachable or refused an operation."""


class BuildError(LabError):
    """An image build failed; `log` holds the build output."""

    def __init__(self, message: str, log: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.log = log


class BaseImageError(LabError):
    """The base image is neither present, pullable, nor bootstrappable."""


class NoGpuRuntimeError(LabError):
    """A GPU scenario was asked to run on an engine without the NVIDIA runtime."""


class ResultError(LabError):
    """A result file (result.json, ...) is missing, is not JSON, is another kind of document, comes
    from a newer lab, or does not fit its schema. Names the file and what is wrong."""
class ConfigError(LabError):
    """A configuration file or LAB_* variable is malformed or holds a bad value. Names the file and
    line (or the variable) and the key."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 variable: str | None = None, field: str | None = None, hint: str | None = None) -> None:
        self.file, self.line, self.variable, self.field = file, line, variable, field
        if variable:
            where = f"environment variable {variable}" + (f" (key `{field}`)" if field else "")
        else:
            where = ", ".join(filter(None, [file, f"line {line}" if line else None,
                                            f"key `{field}`" if field else None]))
        super().__init__(f"{where}: {message}" if where else message, hint)


class RunLost(LabError):
    """A run that its infrastructure ended before its outcome (a scheduler's node failure, preemption,
    a cancel by someone else): an infrastructure error for that run, never a verdict. A matrix records
    it as that cell's error and goes on; a bisection skips the probe. `where` names what is left of it
    (the scheduler's log of the task)."""

    def __init__(self, message: str, where: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.where = where
