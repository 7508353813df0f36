"""Wording shared by the scenario model's validators and its YAML loader: every message is one
sentence, values are shown short and on one line, and a file is named relative to the working
directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.core.errors import ScenarioError


def show_value(value: Any, limit: int = 60) -> str:
    """A short, single-line repr of a user value for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    return " ".join(text.split())


def sentence(text: str) -> str:
    """One line, ending with a full stop."""
    text = one_line(text)
    return text if not text or text[-1] in ".?!" else text + "."


def scenario_error(message: str, *, file: str | None = None, line: int | None = None, field: str | None = None,
         hint: str | None = None) -> ScenarioError:
    """A ScenarioError whose message and hint are single sentences."""
    return ScenarioError(sentence(message), file=file, line=line, field=field,
                         hint=sentence(hint) if hint else None)


def display_path(path: Path) -> str:
    """The file name to show: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):
        return str(path)


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
