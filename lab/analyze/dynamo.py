"""Dynamo diagnostics of a "diagnose" run: graph breaks, recompiles, compile time by phase, TORCH_TRACE.

The diagnose step runs the scenario's script a second time in the same image, started through
``lab/probe/lab_run.py`` with ``LAB_DIAG_DIR``, ``TORCH_LOGS=recompiles`` and ``TORCH_TRACE`` set.
The runner leaves ``explain.json`` (what ``torch._dynamo.explain`` said about each compiled
function or module on its first call), ``explain.txt`` and ``compile_times.json``; stderr holds
Dynamo's recompile log; the TORCH_TRACE folder holds structured trace files for ``tlparse``.
This module reads all of it back on the host, where torch is not installed.

Every parser here tolerates missing, truncated and foreign input: it returns ``None``, an empty
tuple or a report with a note, and never raises.

The recompile log differs across torch releases (see tests/data/dynamo/README.md): torch 2.9 and
2.13 write ``[0/1] [__recompiles] Recompiling function f in x.py:4``, then ``triggered by the
following guard failure(s):`` and one ``- 0/0: <guard failure>`` line per cache entry; 2.3 writes
the same without compile ids and names locals ``L['x']``; 2.1 writes one line per recompile, the
repr of a tuple, ``[date] torch._dynamo.convert_frame.__recompiles: [DEBUG] ('Recompiling function
f in x.py:4', "triggered by the following guard failure: <the latest failure>")``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPILE_TIMES_FORMAT",
    "EXPLAIN_FORMAT",
    "CompiledFunction",
    "Diagnostics",
    "ExplainReport",
    "GraphBreakReason",
    "PhaseTime",
    "Recompile",
    "load_diagnostics",
    "parse_compile_times",
    "parse_explain",
    "parse_recompiles",
]

EXPLAIN_FORMAT = "torch-repro-lab/explain/1"
COMPILE_TIMES_FORMAT = "torch-repro-lab/compile-times/1"
EXPLAIN_JSON = "explain.json"
COMPILE_TIMES_JSON = "compile_times.json"
MAX_TRACE_FILES = 1000
_MAX_READ = 32 * 1024 * 1024
_MAX_TUPLE = 64 * 1024         # longest torch 2.1 tuple record handed to literal_eval
_PLAIN_BREAKS = 5            # graph breaks spelled out per function in plain_words
_PLAIN_REASON = 160          # characters of a reason's first line kept in plain_words
_PLAIN_EXPLANATION = 120     # characters of its "Explanation:" line


# --- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GraphBreakReason:
    """One graph break: Dynamo's reason and where in user code it happened (innermost frame)."""

    reason: str                     # whole, may span lines (torch >= 2.7 adds Explanation/Hint lines)
    location: str | None = None     # "file:line" of the innermost user frame
    source: str | None = None       # that line of source, stripped
    function: str | None = None     # that frame's function name
    stack: tuple[str, ...] = ()     # every user frame, "file:line in name", outermost first

    @property
    def headline(self) -> str:
        """The reason's first non-empty line."""
        return _first_line(self.reason)

    @property
    def explanation(self) -> str | None:
        """The "Explanation: ..." line of torch >= 2.7 reasons, without the label."""
        for line in self.reason.splitlines():
            label, _, text = line.strip().partition(":")
            if label == "Explanation" and text.strip():
                return text.strip()
        return None


@dataclass(frozen=True, slots=True)
class CompiledFunction:
    """What explain said about one torch.compile'd function or module on its first call."""

    name: str
    kind: str                       # function | module | module.compile | method | unknown
    location: str | None            # "file:line" of the user code that was compiled
    status: str                     # explained | failed | never_called | unsupported | unknown
    graph_count: int | None = None
    graph_break_count: int | None = None
    op_count: int | None = None
    breaks: tuple[GraphBreakReason, ...] = ()
    error: str | None = None        # "Type: message" when explain itself raised
    hook_changes: tuple[str, ...] = ()   # what LAB_COMPILE_HOOK changed in the torch.compile call


@dataclass(frozen=True, slots=True)
class ExplainReport:
    """explain.json, parsed."""

    torch: str | None
    python: str | None
    functions: tuple[CompiledFunction, ...] = ()
    unsupported: tuple[str, ...] = ()   # features this torch lacks, as the runner found
    notes: tuple[str, ...] = ()         # the runner's notes, then anything odd in the file

    @property
    def explained(self) -> tuple[CompiledFunction, ...]:
        return tuple(f for f in self.functions if f.status == "explained")

    @property
    def graph_count(self) -> int:
        return sum(f.graph_count or 0 for f in self.explained)

    @property
    def graph_break_count(self) -> int:
        return sum(f.graph_break_count or 0 for f in self.explained)

    @property
    def op_count(self) -> int:
        return sum(f.op_count or 0 for f in self.explained)


@dataclass(frozen=True, slots=True)
class Recompile:
    """One "Recompiling function ..." record of TORCH_LOGS=recompiles."""

    function: str
    location: str                   # "file:line" of the function's first line
    reasons: tuple[str, ...]        # the guard failures, without "- " and the "0/0: " entry id
    compile_id: str | None = None   # "0/1" (frame 0, its second compile); torch >= 2.4 logs it


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """One entry of torch._dynamo.utils.compile_times(): a timed phase or function, summed."""

    name: str                       # e.g. "_compile.compile_inner", "OutputGraph.call_user_compiler"
    total_s: float
    calls: int | None = None        # how many times it ran, when the runner could tell


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """Everything the diagnose run left, parsed."""

    explain: ExplainReport | None
    recompiles: tuple[Recompile, ...] = ()
    compile_times: tuple[PhaseTime, ...] = ()
    trace_files: tuple[str, ...] = ()   # relative paths under the TORCH_TRACE folder
    notes: tuple[str, ...] = ()

    @property
    def graph_break_count(self) -> int | None:
        """Graph breaks over every compiled function that explain could explain; None if none."""
        if self.explain is None or not self.explain.explained:
            return None
        return self.explain.graph_break_count

    def to_json(self) -> dict:
        ex = self.explain
        return {
            "explain": None if ex is None else {
                "torch": ex.torch,
                "python": ex.python,
                "graph_count": ex.graph_count,
                "graph_break_count": ex.graph_break_count,
                "op_count": ex.op_count,
                "functions": [_function_json(f) for f in ex.functions],
                "unsupported": list(ex.unsupported),
                "notes": list(ex.notes),
            },
            "recompiles": [{"function": r.function, "location": r.location, "compile_id": r.compile_id,
                            "reasons": list(r.reasons)} for r in self.recompiles],
            "compile_times": [{"name": p.name, "total_s": p.total_s, "calls": p.calls}
                              for p in self.compile_times],
            "trace_files": list(self.trace_files),
            "notes": list(self.notes),
        }

    def plain_words(self) -> list[str]:
        """Short sentences for report.md."""
        lines: list[str] = []
        if self.explain is not None:
            lines.extend(_function_words(f) for f in self.explain.functions)
        lines.extend(_recompile_words(r) for r in self.recompiles)
        if self.compile_times:
            lines.append(_compile_time_words(self.compile_times))
        if self.trace_files:
            n = len(self.trace_files)
            lines.append(f"TORCH_TRACE wrote {plural(n, 'file')} (open with tlparse): "
                         + ", ".join(f"`{p}`" for p in self.trace_files[:3]) + (", ..." if n > 3 else ""))
        lines.extend(self.notes)
        return lines


# --- explain.json -------------------------------------------------------------------------------


def parse_explain(path: Path) -> ExplainReport | None:
    """explain.json as written by lab_run.py; None when it is missing or not a JSON object."""
    doc = _read_json(path)
    if not isinstance(doc, dict):
        return None
    notes = list(_strings(doc.get("notes")))
    fmt = doc.get("format")
    if fmt != EXPLAIN_FORMAT:
        notes.append(f"{path.name}: unexpected format {_show(fmt)} (expected {EXPLAIN_FORMAT!r}); read anyway")
    records = doc.get("records")
    if records is not None and not isinstance(records, list):
        notes.append(f"{path.name}: `records` is not a list; ignored")
        records = None
    functions = []
    for i, raw in enumerate(records or []):
        if isinstance(raw, dict):
            functions.append(_function(raw))
        else:
            notes.append(f"{path.name}: record {i} is not an object; skipped")
    return ExplainReport(
        torch=_str(doc.get("torch")),
        python=_str(doc.get("python")),
        functions=tuple(functions),
        unsupported=tuple(_strings(doc.get("unsupported"))),
        notes=tuple(notes),
    )


def _function(raw: Mapping[str, Any]) -> CompiledFunction:
    error = raw.get("error")
    if isinstance(error, dict):
        kind, message = _str(error.get("type")) or "Error", _str(error.get("message")) or ""
        error_text: str | None = f"{kind}: {message}" if message else kind
    else:
        error_text = _str(error)
    breaks = raw.get("breaks")
    parsed = tuple(_break(b) for b in breaks if isinstance(b, dict)) if isinstance(breaks, list) else ()
    logged = _logged_breaks(raw)
    return CompiledFunction(
        name=_str(raw.get("name")) or "<unnamed>",
        kind=_str(raw.get("kind")) or "unknown",
        location=_location(raw.get("file"), raw.get("line")),
        status=_str(raw.get("status")) or "unknown",
        graph_count=_int(raw.get("graph_count")),
        graph_break_count=_break_count(raw, logged),
        op_count=_int(raw.get("op_count")),
        breaks=parsed or tuple(GraphBreakReason(reason=reason) for reason, _ in logged),
        error=error_text,
        hook_changes=tuple(_strings(raw.get("hook_changes"))),
    )


def _break_count(raw: Mapping[str, Any], logged: Sequence[tuple[str, int]] = ()) -> int | None:
    """explain counts breaks as graphs - 1, so a function that compiled no graph (Dynamo skipped
    or disabled it) reports -1. A break in a frame that made no graph is not in that count: a
    frame Dynamo skipped for a break inside a loop, or one with no op before its break. When
    explain counts none, the breaks Dynamo logged during explain's run count (lab_run's
    `logged_breaks`, from torch._dynamo.utils.counters); otherwise explain's count stands."""
    count = _int(raw.get("graph_break_count"))
    if count is None:
        return None
    return max(count, 0) or sum(n for _, n in logged)


def _logged_breaks(raw: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """lab_run's `logged_breaks` ([{reason, count}]) as (reason, count) pairs; odd entries dropped."""
    items = raw.get("logged_breaks")
    if not isinstance(items, list):
        return ()
    pairs = ((_str(i.get("reason")), _int(i.get("count"))) for i in items if isinstance(i, dict))
    return tuple((reason, count) for reason, count in pairs if reason and count and count > 0)


def _break(raw: Mapping[str, Any]) -> GraphBreakReason:
    stack = raw.get("user_stack")
    frames = [f for f in stack if isinstance(f, dict)] if isinstance(stack, list) else []
    inner = frames[-1] if frames else {}
    return GraphBreakReason(
        reason=_str(raw.get("reason")) or "",
        location=_location(inner.get("file"), inner.get("line")),
        source=_str(inner.get("source")),
        function=_str(inner.get("name")),
        stack=tuple(_frame_text(f) for f in frames),
    )


def _frame_text(frame: Mapping[str, Any]) -> str:
    where = _location(frame.get("file"), frame.get("line")) or "?"
    name = _str(frame.get("name"))
    return f"{where} in {name}" if name else where


# --- TORCH_LOGS=recompiles ----------------------------------------------------------------------

# Log prefixes, removed before the content is read:
#   glog style (torch >= 2.2):  V1122 12:40:29.338000 7091 torch/_dynamo/guards.py:5396] [0/1] [__recompiles]
#   logging style (torch 2.1):  [2023-10-04 12:00:00,123] torch._dynamo.guards.__recompiles: [DEBUG]
_RANK = re.compile(r"^\[rank\d+\]:\s?")
_GLOG = re.compile(r"^[VDIWEFC]\d{4} \d\d:\d\d:\d\d(?:\.\d+)? +\d+ [^\]]*\] ")
_PYLOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\] [\w.<>]+: \[\w+\] ")
_TAGS = re.compile(r"^(?:\[(?:\d+/\d+(?:_\d+)?|__\w+)\] )+")
_COMPILE_ID = re.compile(r"\[(\d+/\d+(?:_\d+)?)\]")
_RECOMPILING = re.compile(r"Recompiling function (?P<fn>\S+) in (?P<file>.*?):(?P<line>\d+)\s*(?P<rest>.*)$")
_TRIGGERED = re.compile(r"^\s*triggered by the following guard failures?(?:\(s\))?\s*:?\s*(?P<rest>.*)$")
_ITEM = re.compile(r"^(?P<indent>\s*)- (?P<text>.*)$")
_ENTRY_ID = re.compile(r"^\d+/\d+(?:_\d+)?: ")


def parse_recompiles(stderr_text: str) -> tuple[Recompile, ...]:
    """Every recompile logged by TORCH_LOGS=recompiles (or recompiles_verbose), in order."""
    if not isinstance(stderr_text, str):
        return ()
    out: list[Recompile] = []
    current: dict | None = None
    for content, compile_id in _log_lines(stderr_text):
        match = _RECOMPILING.search(content)
        if match:
            if current:
                out.append(_recompile(current))
            current = {"fn": match["fn"], "where": f"{match['file']}:{match['line']}", "id": compile_id,
                       "reasons": [], "indent": None}
            _continue_recompile(current, match["rest"])
        elif current is not None and not _continue_recompile(current, content):
            out.append(_recompile(current))
            current = None
    if current:
        out.append(_recompile(current))
    return tuple(out)


def _log_lines(text: str) -> Iterable[tuple[str, str | None]]:
    """(content, compile id) per line, with torch 2.1's one-line tuple records spread out."""
    for raw in text.splitlines():
        content, compile_id = _strip_log_prefix(raw)
        parts = _tuple_record(content)
        if parts is None:
            yield content, compile_id
        else:
            for part in parts:
                for line in part.splitlines():
                    yield line, compile_id


def _tuple_record(content: str) -> tuple[str, ...] | None:
    """torch 2.1 logs ``('Recompiling function f in x.py:4', "triggered by ...")``: a tuple's repr."""
    if not content.startswith("(") or "Recompiling function" not in content or len(content) > _MAX_TUPLE:
        return None
    try:
        value = ast.literal_eval(content)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _strip_log_prefix(line: str) -> tuple[str, str | None]:
    """(the line without torch's log prefix, the compile id the prefix named)."""
    line = _RANK.sub("", line.rstrip("\r\n"))
    head = _GLOG.match(line) or _PYLOG.match(line)
    if head is None:
        return line, None
    line = line[head.end():]
    tags = _TAGS.match(line)
    compile_id = None
    if tags:
        found = _COMPILE_ID.search(tags.group(0))
        compile_id = found.group(1) if found else None
        line = line[tags.end():]
    return line, compile_id


def _continue_recompile(current: dict, content: str) -> bool:
    """Fold one line into the recompile being read; False when the line ends it."""
    if not content.strip():
        return False
    triggered = _TRIGGERED.match(content)
    if triggered:
        rest = triggered["rest"].strip()
        if rest:
            current["reasons"].append(_ENTRY_ID.sub("", rest.removeprefix("- ")))
        return True
    item = _ITEM.match(content)
    if item and (current["indent"] is None or len(item["indent"]) <= current["indent"]):
        current["indent"] = len(item["indent"])
        current["reasons"].append(_ENTRY_ID.sub("", item["text"].strip()))
        return True
    indent = len(content) - len(content.lstrip())
    if current["reasons"] and current["indent"] is not None and indent > current["indent"]:
        current["reasons"][-1] += "\n" + content.strip()     # a guard failure spanning lines
        return True
    return False


def _recompile(current: dict) -> Recompile:
    return Recompile(function=current["fn"], location=current["where"], reasons=tuple(current["reasons"]),
                     compile_id=current["id"])


# --- compile_times.json -------------------------------------------------------------------------


def parse_compile_times(path: Path) -> tuple[PhaseTime, ...]:
    """compile_times.json as written by lab_run.py; () when missing, unavailable or malformed."""
    return _compile_times(_read_json(path))[0]


def _compile_times(doc: object) -> tuple[tuple[PhaseTime, ...], str | None]:
    if not isinstance(doc, dict):
        return (), None
    phases = doc.get("phases")
    out = []
    for raw in phases if isinstance(phases, list) else []:
        if not isinstance(raw, dict):
            continue
        name, total = _str(raw.get("name")), _float(raw.get("total_s"))
        if name is not None and total is not None:
            out.append(PhaseTime(name=name, total_s=total, calls=_int(raw.get("calls"))))
    return tuple(out), _str(doc.get("note"))


# --- the combined record ------------------------------------------------------------------------


def load_diagnostics(diag_dir: Path, trace_dir: Path, stderr_text: str) -> Diagnostics:
    """Read what the diagnose run left in `diag_dir` and `trace_dir`, and its stderr."""
    diag_dir, trace_dir = Path(diag_dir), Path(trace_dir)
    notes: list[str] = []
    explain = parse_explain(diag_dir / EXPLAIN_JSON)
    if explain is None:
        notes.append(f"no readable {EXPLAIN_JSON}: the diagnose run left no explanation "
                     "(it died before exit, or did not start through lab_run.py)")
    times, times_note = _compile_times(_read_json(diag_dir / COMPILE_TIMES_JSON))
    if times_note and not times:
        notes.append(f"compile times: {times_note}")
    trace_files = _trace_files(trace_dir)
    if not trace_files:
        notes.append(_no_trace_note(explain))
    return Diagnostics(explain=explain, recompiles=parse_recompiles(stderr_text), compile_times=times,
                       trace_files=trace_files, notes=tuple(notes))


def _trace_files(trace_dir: Path) -> tuple[str, ...]:
    try:
        if not trace_dir.is_dir():
            return ()
        found = sorted(p.relative_to(trace_dir).as_posix() for p in trace_dir.rglob("*") if p.is_file())
    except OSError:
        return ()
    return tuple(found[:MAX_TRACE_FILES])


def _no_trace_note(explain: ExplainReport | None) -> str:
    torch = f"torch {explain.torch}" if explain is not None and explain.torch else "this torch"
    if explain is not None and any(u.startswith("TORCH_TRACE") for u in explain.unsupported):
        return f"TORCH_TRACE produced nothing: {torch} predates structured trace logging"
    if explain is not None and not explain.functions:
        return f"TORCH_TRACE produced nothing: nothing was compiled ({torch})"
    return f"TORCH_TRACE produced nothing ({torch})"


# --- plain words --------------------------------------------------------------------------------


def _function_words(f: CompiledFunction) -> str:
    what = f.name + (f" ({_short_location(f.location)})" if f.location else "")
    if f.status == "never_called":
        return f"{what} was compiled but never called"
    if f.status == "failed":
        return f"explain failed for {what}: {_first_line(f.error or 'no error recorded')}"
    if f.status != "explained":
        return f"{what}: not explained ({f.status})"
    graphs = plural(f.graph_count, "graph")
    n = f.graph_break_count if f.graph_break_count is not None else len(f.breaks)
    if not n:
        return f"no graph breaks in {f.name} ({graphs})"
    items = [f"{i}. {_break_words(b)}" for i, b in enumerate(f.breaks[:_PLAIN_BREAKS], 1)]
    if len(f.breaks) > _PLAIN_BREAKS:
        items.append(f"... and {len(f.breaks) - _PLAIN_BREAKS} more")
    head = f"{plural(n, 'graph break')} in {f.name} ({graphs})"
    return head + (": " + "; ".join(items) if items else "")


def _break_words(b: GraphBreakReason) -> str:
    text = _clip(b.headline or "no reason given")
    if b.explanation:
        text += f" ({_clip(b.explanation, _PLAIN_EXPLANATION)})"
    if b.location:
        text += f" at {_short_location(b.location)}"
    if b.source:
        text += f" `{b.source}`"
    return text


def _recompile_words(r: Recompile) -> str:
    """One guard failure is logged per cached entry, often the same text: say each text once."""
    counts: dict[str, int] = {}
    for reason in r.reasons:
        text = _clip(_first_line(reason))
        counts[text] = counts.get(text, 0) + 1
    items = [text + (f" ({n} cache entries)" if n > 1 else "") for text, n in counts.items()]
    why = "; ".join(items[:3]) or "no guard failure logged"
    if len(items) > 3:
        why += f"; ... ({len(r.reasons)} guard failures)"
    return f"recompiled {r.function} ({_short_location(r.location)}): {why}"


def _compile_time_words(phases: tuple[PhaseTime, ...]) -> str:
    top = sorted(phases, key=lambda p: p.total_s, reverse=True)[:3]
    return "compile time by phase: " + ", ".join(
        f"{p.name} {p.total_s:.3f} s" + (f" ({plural(p.calls, 'call')})" if p.calls else "") for p in top)


def _function_json(f: CompiledFunction) -> dict:
    return {
        "name": f.name, "kind": f.kind, "location": f.location, "status": f.status,
        "graph_count": f.graph_count, "graph_break_count": f.graph_break_count, "op_count": f.op_count,
        "breaks": [{"reason": b.reason, "location": b.location, "source": b.source, "function": b.function,
                    "stack": list(b.stack)} for b in f.breaks],
        "error": f.error, "hook_changes": list(f.hook_changes),
    }


# --- small helpers ------------------------------------------------------------------------------


def _read_json(path: Path) -> object:
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(_MAX_READ + 1)
        if len(data) > _MAX_READ:
            return None
        return json.loads(data.decode("utf-8", "replace"))
    except (OSError, ValueError, RecursionError, TypeError):
        return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: object) -> Iterable[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _location(file: object, line: object) -> str | None:
    file_s = _str(file)
    if not file_s:
        return None
    n = _int(line)
    return f"{file_s}:{n}" if n is not None else file_s


def _short_location(location: str) -> str:
    """'/s/toy.py:7' -> 'toy.py:7': the folder is in the full record."""
    return location.rsplit("/", 1)[-1]


def plural(n: int | None, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _clip(text: str, limit: int = _PLAIN_REASON) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
