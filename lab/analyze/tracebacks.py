"""Extract Python exceptions, and Dynamo graph breaks, from a process's stderr.

The text may interleave warnings, log records and ordinary output with one or more tracebacks:
chained ones ("During handling of the above exception..." / "The above exception was the direct
cause..."), ones printed by the `traceback` module while the script goes on, the headerless
SyntaxError report, and torch.compile's Dynamo errors, whose message carries an explanation,
hints, a developer context, a "from user code:" section and a trailer.  ``extract_exceptions``
returns every exception in the order printed; ``final_exception`` the last one, which is what
Python exited with when the process died of an uncaught exception.

A message runs from the exception line until a blank-line-free boundary is seen: a new traceback,
a chain separator, a Dynamo trailer, a warning line (``file:N: SomeWarning: ...``) or a log
record (``WARNING:root:...``, glog's ``W1122 12:00:00...``).  Lines of ordinary output printed
right after a traceback from the `traceback` module would otherwise read as part of the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ExceptionInfo", "GraphBreak", "extract_exceptions", "final_exception"]


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """A Dynamo graph break (``torch._dynamo.exc.Unsupported``) taken apart."""

    reason: str
    explanation: str | None = None
    hints: tuple[str, ...] = ()
    user_code: tuple[str, ...] = ()
    details: str | None = None
    doc_url: str | None = None


@dataclass(frozen=True, slots=True)
class ExceptionInfo:
    """One exception as printed: qualified type, message, and traceback frames outermost first."""

    type: str
    message: str
    frames: tuple[str, ...] = ()
    graph_break: GraphBreak | None = None

    @property
    def headline(self) -> str:
        """`Type: first line of the message`, or just the type when there is no message."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first}" if first else self.type

    @property
    def name(self) -> str:
        """The unqualified type name, e.g. ``Unsupported`` for ``torch._dynamo.exc.Unsupported``."""
        return self.type.rpartition(".")[2]


# --- line grammar -------------------------------------------------------------------------------

_RANK = re.compile(r"^\[rank\d+\]:\s?")
_HEADER = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_CHAIN = re.compile(
    r"^\s*(During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)\s*$"
)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+)(?:, in (.+?))?\s*$')
_SYNTAX_FRAME = re.compile(r'^  File "(.*)", line (\d+)\s*$')
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:\.<locals>\.[\w.]+)?)(?::(?: (.*)|\s*))?$")
_SYNTAX_TYPES = re.compile(r"^(?:\w+\.)*\w*(?:SyntaxError|IndentationError|TabError)$")
_WARNING = re.compile(r"^\S.*:\d+: [A-Za-z_]\w*Warning: ")
_LOG = re.compile(
    r"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.<>-]*:"
    r"|[IWEFV]\d{4} \d\d:\d\d:\d\d)"
)
_TRAILER = re.compile(
    r"^(?:from user code:"
    r"|Set TORCHDYNAMO_VERBOSE=1"
    r"|Set TORCH_LOGS="
    r"|You can suppress this exception and fall back to eager"
    r"|Last frame execution written to "
    r"|Minifier script written to )"
)

_SYNTAX_SCAN = 6


def _normalise(text: str) -> list[str]:
    """Lines without CR and without torch.distributed's ``[rankN]:`` prefix."""
    return [_RANK.sub("", line.rstrip("\r")) for line in text.splitlines()]


def _ends_message(line: str) -> bool:
    return bool(
        _HEADER.match(line) or _CHAIN.match(line) or _TRAILER.match(line)
        or _WARNING.match(line) or _LOG.match(line)
    )


def _frame_text(match: re.Match[str]) -> str:
    where = f"{match.group(1)}:{match.group(2)}"
    return f"{where} in {match.group(3)}" if match.group(3) else where


def _plausible_type(match: re.Match[str]) -> bool:
    """Exception classes are CapWords; this keeps stray output words out."""
    return match.group(1).rpartition(".")[2][:1].isupper()


def _scan_frames(
    lines: list[str], i: int, limit: int
) -> tuple[list[str], int, re.Match[str] | None]:
    """Frames from line `i` to the exception line; (frames, index of that line, its match)."""
    frames: list[str] = []
    stop = min(len(lines), i + limit)
    while i < stop:
        line = lines[i]
        if frame := _FRAME.match(line):
            frames.append(_frame_text(frame))
        elif _HEADER.match(line) or _CHAIN.match(line):
            return frames, i, None
        elif line[:1] not in ("", " ", "\t") and (exc := _EXC.match(line)) and _plausible_type(exc):
            return frames, i, exc
        i += 1
    return frames, i, None


def _message_lines(lines: list[str], i: int) -> tuple[list[str], int]:
    """Continuation lines of a message from line `i`; (lines, index after them)."""
    body: list[str] = []
    while i < len(lines) and not _ends_message(lines[i]):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    return body, i


def _is_source(line: str) -> bool:
    """An indented line of source code, not a caret line (``^^^`` / ``~~^~~``)."""
    text = line.strip()
    return line.startswith("    ") and bool(text) and bool(set(text) - set("^~ "))


def _user_code(lines: list[str], i: int) -> tuple[tuple[str, ...], int]:
    """The Dynamo trailer from line `i`: its "from user code:" frames, and the index after it.

    Each frame is ``File "path", line N, in func`` plus, on a second line, its source line.
    """
    frames: list[str] = []
    expect_source = False
    while i < len(lines):
        line = lines[i]
        if _FRAME.match(line):
            frames.append(line.strip())
            expect_source = True
        elif expect_source and _is_source(line):
            frames[-1] += "\n    " + line.strip()
            expect_source = False
        elif line.strip() and not line.startswith((" ", "\t")) and not _TRAILER.match(line):
            break
        elif line.strip():
            expect_source = False
        i += 1
    return tuple(frames), i


def _parse_one(lines: list[str], i: int, syntax_only: bool) -> tuple[ExceptionInfo | None, int]:
    """One traceback whose frames start at line `i`; (exception or None, index after it)."""
    frames, i, exc = _scan_frames(lines, i, _SYNTAX_SCAN if syntax_only else len(lines))
    if exc is None or (syntax_only and not _SYNTAX_TYPES.match(exc.group(1))):
        return None, i
    body, i = _message_lines(lines, i + 1)
    message = "\n".join([exc.group(2) or "", *body]).rstrip()
    user_code: tuple[str, ...] = ()
    if i < len(lines) and _TRAILER.match(lines[i]):
        user_code, i = _user_code(lines, i)
    kind = exc.group(1)
    return ExceptionInfo(kind, message, tuple(frames), _graph_break(kind, message, user_code)), i


def extract_exceptions(text: str) -> list[ExceptionInfo]:
    """Every exception printed in `text`, in order; chained exceptions are separate entries."""
    lines = _normalise(text)
    found: list[ExceptionInfo] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _HEADER.match(line):
            info, i = _parse_one(lines, i + 1, syntax_only=False)
        elif _SYNTAX_FRAME.match(line):
            info, nxt = _parse_one(lines, i, syntax_only=True)
            i = nxt if info else i + 1
        else:
            info, i = None, i + 1
        if info is not None:
            found.append(info)
    return found


def final_exception(text: str) -> ExceptionInfo | None:
    """The last exception printed in `text` (what Python exits with), or None."""
    found = extract_exceptions(text)
    return found[-1] if found else None


# --- Dynamo graph breaks ------------------------------------------------------------------------

_SECTION = re.compile(
    r"^  (Explanation|Hint|Developer debug context|Higher Order Operator): ?(.*)$"
)
_DOC = re.compile(r"^\s*For more details about this graph break, please visit: (\S+)")


def _is_graph_break(kind: str, message: str) -> bool:
    return kind.rpartition(".")[2] == "Unsupported" or "\n  Explanation: " in message


def _dedent(line: str, width: int = 4) -> str:
    stripped = line.lstrip(" ")
    return line[min(width, len(line) - len(stripped)):]


def _sections(lines: list[str]) -> tuple[list[tuple[str, list[str]]], str | None]:
    """The (name, lines) sections of a structured Dynamo message, and its documentation link."""
    sections: list[tuple[str, list[str]]] = []
    doc: str | None = None
    for line in lines:
        if match := _SECTION.match(line):
            sections.append((match.group(1), [match.group(2)]))
        elif match := _DOC.match(line):
            doc = match.group(1)
            sections.append(("", []))
        elif sections:
            sections[-1][1].append(_dedent(line))
    return sections, doc


def _joined(parts: list[str]) -> str:
    return "\n".join(parts).strip()


def _graph_break(kind: str, message: str, user_code: tuple[str, ...]) -> GraphBreak | None:
    if not _is_graph_break(kind, message):
        return None
    lines = message.split("\n")
    sections, doc = _sections(lines[1:])
    explanation = next((_joined(body) for name, body in sections if name == "Explanation"), None)
    details = next((_joined(body) for name, body in sections if name == "Developer debug context"), None)
    hints = tuple(_joined(body) for name, body in sections if name == "Hint")
    return GraphBreak(lines[0].strip(), explanation or None, hints, user_code, details or None, doc)
