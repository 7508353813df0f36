"""A failing run's signature, and the failures that are never the scenario's.

PyTorch's minifier (`torch/_dynamo/repro/after_aot.py`, `isolate_fails` with `check_str`) accepts a
candidate only when it fails with the *same* error. The lab does the same in two ways:

- `observed(ev)`: how the run failed, as a FailureSignature (the final exception's type and the
  innermost torch frame, or the signal that killed the process). A scenario that expects only an exit
  code can pin it (`expect.signature`), and a bisection or matrix records its first failing run's
  signature in its folder and holds every later run to it.
- `own_code_error(ev, script)`: the script died of its own code, not of torch: a NameError,
  UnboundLocalError, SyntaxError, IndentationError, ImportError or ModuleNotFoundError whose innermost
  frame is the scenario's script (pasted output run as code; an API an older release lacks). Such a
  failure is never `reproduced` unless the scenario's expectation names that exception.
"""

from __future__ import annotations

import re
import signal as signals
from pathlib import PurePosixPath

from lab.analyze.evidence import Evidence
from lab.analyze.tracebacks import ExceptionInfo
from lab.core.results import FailureSignature

__all__ = ["OWN_CODE_TYPES", "innermost_torch_frame", "observed", "own_code_error", "signal_name"]

OWN_CODE_TYPES = frozenset({"NameError", "UnboundLocalError", "SyntaxError", "IndentationError", "TabError",
                            "ImportError", "ModuleNotFoundError"})
# The last `torch/` folder of the path: `/opt/torch/.venv/.../site-packages/torch/_dynamo/x.py` is torch's
# `torch/_dynamo/x.py`, not `torch/.venv/...` (a venv under a folder named torch, as on a GPU host).
_TORCH_PATH = re.compile(r"^(?:.*/)?(torch/.+)$")
_LIBRARY = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen")


def signal_name(exit_code: int | None) -> str | None:
    """The signal an exit code stands for: 139 (a shell's 128+11) or -11 (Python's) -> SIGSEGV."""
    if exit_code is None:
        return None
    number = exit_code - 128 if 128 < exit_code < 160 else -exit_code if exit_code < 0 else None
    if number is None:
        return None
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _split(frame: str) -> tuple[str, str]:
    """'path:12 in fn' -> ('path', 'fn'); a SyntaxError's 'path:3' -> ('path', '')."""
    where, _, func = frame.partition(" in ")
    return where.rsplit(":", 1)[0], func


def innermost_torch_frame(exc: ExceptionInfo) -> str | None:
    """`torch/_inductor/graph.py in run_node`: the innermost frame inside the torch package (its line
    number left out: it moves with every edit of the file)."""
    for frame in reversed(exc.frames):
        path, func = _split(frame)
        if m := _TORCH_PATH.search(path):
            return m.group(1) + (f" in {func}" if func else "")
    return None


def observed(ev: Evidence) -> FailureSignature | None:
    """How the run failed; None when it did not fail (exit 0, no exception) or failed with neither an
    exception nor a signal (a plain `sys.exit(1)`: its exit code is all there is)."""
    sig = signal_name(ev.exit_code)
    if sig is not None:
        return FailureSignature(signal=sig)
    exc = ev.exception
    if exc is None or ev.exit_code == 0:
        return None
    return FailureSignature(exception=exc.name, frame=innermost_torch_frame(exc))


def own_code_error(ev: Evidence, script: str | None = None) -> ExceptionInfo | None:
    """The final exception when the script died of its own code (see the module docstring): one of
    OWN_CODE_TYPES raised in the script itself (its innermost frame is `script`, or, when the script's
    name is not known, not a library's file)."""
    exc = ev.exception
    if exc is None or exc.name not in OWN_CODE_TYPES or not exc.frames:
        return None
    path, _ = _split(exc.frames[-1])
    if script is not None:
        return exc if PurePosixPath(path).name == PurePosixPath(script).name else None
    return None if any(part in path for part in _LIBRARY) or _TORCH_PATH.search(path) else exc


def script_line(exc: ExceptionInfo) -> str:
    """'line 12' of the innermost frame, for the reason's words."""
    where, _ = _split(exc.frames[-1]) if exc.frames else ("", "")
    line = exc.frames[-1].partition(" in ")[0].rsplit(":", 1)[-1] if exc.frames else ""
    return f"{PurePosixPath(where).name}, line {line}" if line.isdigit() else PurePosixPath(where).name
