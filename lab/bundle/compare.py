"""Signatures of a run's failure, and the comparison of an original run with its replay."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from lab.core.results import RunResult


@dataclass(frozen=True)
class Comparison:
    """The result of `compare`: whether two runs failed the same way, and what differs."""

    same: bool
    lines: tuple[str, ...]


# --------------------------------------------------------------------------- signatures


def _exit_class(code: int | None) -> str:
    if code is None:
        return "none"
    if code == 0:
        return "success"
    if 0 < code < 128:
        return "failure"
    return "signal"


def signature(result: RunResult) -> dict[str, Any]:
    """What identifies how a run failed, so that two runs can be compared (see `compare`).

    The verdict; each duplicate runtime family with the file names of its copies (pids and folders
    ignored); the final exception's type and the first line of its message; the graph-break count
    when there is one; and the exit code's class (success, failure, signal, none).
    """
    runtimes: dict[str, set[str]] = {}
    for dup in result.evidence.duplicate_runtimes:
        runtimes.setdefault(dup.family, set()).update(os.path.basename(os.path.normpath(p)) for p in dup.paths)
    exc = result.evidence.exception
    exception = None
    if exc is not None and exc.type:
        exception = {"type": exc.type, "message": (exc.message.strip().splitlines() or [""])[0].strip()}
    sig: dict[str, Any] = {
        "verdict": result.verdict.value,
        "duplicate_runtimes": {family: sorted(names) for family, names in sorted(runtimes.items())},
        "exception": exception,
        "exit": _exit_class(result.exit_code),
    }
    if result.graph_breaks is not None:
        sig["graph_breaks"] = result.graph_breaks
    return sig


def _set(names: list[str] | None) -> str:
    return "{" + ", ".join(names) + "}" if names else "none"


def _exception_text(exc: dict[str, str] | None) -> str:
    if not exc:
        return "none"
    return f"{exc['type']}: {exc['message']}" if exc["message"] else exc["type"]


def compare(old_result: RunResult, new_result: RunResult) -> Comparison:
    """Whether a replay failed the same way as the original: one line per difference."""
    old, new = signature(old_result), signature(new_result)
    lines: list[str] = []
    if old["verdict"] != new["verdict"]:
        lines.append(f"verdict: {old['verdict']} → {new['verdict']}")
    for family in sorted(set(old["duplicate_runtimes"]) | set(new["duplicate_runtimes"])):
        before, after = old["duplicate_runtimes"].get(family), new["duplicate_runtimes"].get(family)
        if before != after:
            lines.append(f"{family} runtimes: {_set(before)} → {_set(after)}")
    if old["exception"] != new["exception"]:
        lines.append(f"exception: {_exception_text(old['exception'])} → {_exception_text(new['exception'])}")
    if old.get("graph_breaks") != new.get("graph_breaks") and "graph_breaks" in old and "graph_breaks" in new:
        lines.append(f"graph breaks: {old['graph_breaks']} → {new['graph_breaks']}")
    if old["exit"] != new["exit"]:
        lines.append(f"exit: {old['exit']} → {new['exit']}")
    if not lines:
        return Comparison(True, ("same verdict, same signature",))
    return Comparison(False, tuple(lines))
