"""Streaming parser for glibc's dynamic loader debug log, and duplicate-runtime detection.

A run started with ``LD_DEBUG=libs,files LD_DEBUG_OUTPUT=/out/ld/ld`` leaves one file per
process, ``ld.<pid>``, whose every line starts with ``<spaces><pid>:<TAB>``.  This module turns
those lines into, per pid, the shared objects the process mapped (who asked for each, and how),
the paths the loader tried for each name, and the order of "calling init:" lines.  The parser
reads line by line and keeps state proportional to the number of libraries, never to the size
of the log; junk, truncated or foreign lines are skipped, never raised on.

On top of that, ``find_duplicate_runtimes`` reports two or more distinct copies of one runtime
(two OpenMP runtimes, two CUDA runtimes, ...) initialised in one process, the classic cause of
hangs and crashes when an Inductor kernel links the system libgomp next to torch's bundled one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from lab.core.runtimes import RUNTIME_FAMILIES, RuntimeFamily

How = Literal["needed", "dlopen", "preload"]

__all__ = [
    "RUNTIME_FAMILIES",
    "DuplicateRuntime",
    "LoadedObject",
    "ProcessLoads",
    "RuntimeFamily",
    "canonical_path",
    "describe",
    "family_of",
    "find_duplicate_runtimes",
    "parse_dir",
    "parse_lines",
]


@dataclass(frozen=True, slots=True)
class LoadedObject:
    """One shared object mapped by the loader in one process."""

    path: str
    soname: str
    needed_by: str | None = None
    how: How | None = None
    initialised: bool = False


@dataclass(frozen=True, slots=True)
class ProcessLoads:
    """Everything the loader log says about one process."""

    pid: int
    objects: tuple[LoadedObject, ...] = ()
    searches: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    init_order: tuple[str, ...] = ()
    program: str | None = None

    @property
    def initialised(self) -> tuple[LoadedObject, ...]:
        """The objects whose constructors ran ("calling init:"), in order of first appearance."""
        return tuple(obj for obj in self.objects if obj.initialised)

    def find(self, basename: str) -> tuple[LoadedObject, ...]:
        """The objects whose file name (last path component) is `basename`."""
        return tuple(obj for obj in self.objects if os.path.basename(obj.path) == basename)


# --- line grammar -------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\s*(\d{1,10}):(?:\t| |$)(.*)$")
_NS = r"(?: \[\d+\])?"
_NEEDED = re.compile(rf"^file=(.+?){_NS};\s+needed by (.*?){_NS}(\s+\(relocation dependency\))?$")
_DLOPEN = re.compile(rf"^file=(.+?){_NS};\s+dynamically loaded by (.*?){_NS}$")
_LINK_MAP = re.compile(rf"^file=(.+?){_NS};\s+generating link map$")
_FIND = re.compile(rf"^find library=(.+?){_NS}; searching$")
_TRYING = re.compile(r"^trying file=(.+)$")
_INIT = re.compile(rf"^calling init: (.+?){_NS}$")
_PROGRAM = re.compile(r"^(?:initialize program|transferring control): (.+)$")


@dataclass(slots=True)
class _Obj:
    """Mutable twin of LoadedObject, private to the parser."""

    path: str
    soname: str
    needed_by: str | None
    how: How | None
    initialised: bool = False

    def freeze(self) -> LoadedObject:
        return LoadedObject(self.path, self.soname, self.needed_by, self.how, self.initialised)


@dataclass(slots=True)
class _Proc:
    """Per-pid parser state: O(number of libraries)."""

    pid: int
    objects: dict[str, _Obj] = field(default_factory=dict)
    by_norm: dict[str, str] = field(default_factory=dict)
    searches: dict[str, dict[str, None]] = field(default_factory=dict)
    pending: dict[str, tuple[str, How]] = field(default_factory=dict)
    init_order: dict[str, None] = field(default_factory=dict)
    searching: str | None = None
    last_tried: str | None = None
    program: str | None = None
    first_requester: str | None = None
    past_preloads: bool = False

    def freeze(self) -> ProcessLoads:
        searches = MappingProxyType({k: tuple(v) for k, v in self.searches.items()})
        objects = tuple(obj.freeze() for obj in self.objects.values())
        return ProcessLoads(self.pid, objects, searches, tuple(self.init_order), self.program)


def _split_prefix(line: str) -> tuple[int | None, str]:
    """(pid, content) of one log line; pid is None when the line has no ``<pid>:`` prefix."""
    match = _PREFIX.match(line)
    if match is None:
        return None, line.strip()
    return int(match.group(1)), match.group(2).strip()


def _request(proc: _Proc, name: str, requester: str, how: How) -> None:
    """Remember who asked for `name` until its link map is generated."""
    proc.pending[name] = (requester, "preload" if _is_preload(proc, name, requester, how) else how)


def _is_preload(proc: _Proc, name: str, requester: str, how: How) -> bool:
    """LD_PRELOAD entries are logged as "needed by <main program>", by path, before anything else.

    DT_NEEDED entries are sonames (no slash), so the first request that is not a path needed by
    the first requester ends the preload phase.
    """
    if proc.first_requester is None:
        proc.first_requester = requester
    candidate = how == "needed" and "/" in name and requester == proc.first_requester
    proc.past_preloads = proc.past_preloads or not candidate
    return not proc.past_preloads


def _map(proc: _Proc, name: str) -> None:
    """A "generating link map" line: the object named `name` is now mapped."""
    found = proc.last_tried if "/" not in name and proc.searching == name else None
    path = found or name
    requester, how = proc.pending.pop(name, (None, None))
    if path not in proc.objects:
        proc.objects[path] = _Obj(path, name, requester, how)
        proc.by_norm.setdefault(os.path.normpath(path), path)


def _init(proc: _Proc, path: str) -> None:
    """A "calling init:" line: the object's constructors run (a re-init after dlclose is not re-listed)."""
    if not path:
        return
    key = path if path in proc.objects else proc.by_norm.get(os.path.normpath(path))
    if key is None:
        key = path
        proc.objects[path] = _Obj(path, path, None, None)
        proc.by_norm.setdefault(os.path.normpath(path), path)
    proc.objects[key].initialised = True
    proc.init_order.setdefault(path, None)


def _search(proc: _Proc, name: str) -> None:
    proc.searching = name
    proc.last_tried = None
    proc.searches.setdefault(name, {})


def _try(proc: _Proc, path: str) -> None:
    if proc.searching is not None:
        proc.searches[proc.searching][path] = None
        proc.last_tried = path


def _feed(proc: _Proc, text: str) -> None:
    """Apply one line's content (pid prefix already removed) to the process state."""
    if match := _NEEDED.match(text):
        if match.group(3) is None:
            _request(proc, match.group(1), match.group(2), "needed")
    elif match := _DLOPEN.match(text):
        _request(proc, match.group(1), match.group(2), "dlopen")
    elif match := _LINK_MAP.match(text):
        _map(proc, match.group(1))
    elif match := _FIND.match(text):
        _search(proc, match.group(1))
    elif match := _TRYING.match(text):
        _try(proc, match.group(1))
    elif match := _INIT.match(text):
        _init(proc, match.group(1).strip())
    elif (match := _PROGRAM.match(text)) and proc.program is None:
        proc.program = match.group(1)


class _Parser:
    """Feeds lines to per-pid state; lines without a pid prefix go to the last pid seen."""

    def __init__(self) -> None:
        self.procs: dict[int, _Proc] = {}
        self.last_pid: int | None = None

    def feed(self, line: str, default_pid: int | None = None) -> None:
        pid, text = _split_prefix(line)
        pid = pid if pid is not None else (self.last_pid if self.last_pid is not None else default_pid)
        if pid is None or not text:
            return
        self.last_pid = pid
        proc = self.procs.get(pid)
        if proc is None:
            proc = self.procs[pid] = _Proc(pid)
        _feed(proc, text)

    def result(self) -> dict[int, ProcessLoads]:
        return {pid: self.procs[pid].freeze() for pid in sorted(self.procs)}


def _feed_lines(parser: _Parser, lines: Iterable[str], default_pid: int | None) -> None:
    """Feed `lines`, holding one back: a last line cut before its newline is dropped.

    glibc ends every debug line with a newline, so when the lines carry newlines and the last one
    has none, the process died while writing it (or the capture was cut) and it is not trusted.
    """
    held: str | None = None
    saw_newline = False
    for line in lines:
        if held is not None:
            parser.feed(held, default_pid)
        held = line if isinstance(line, str) else str(line)
        saw_newline = saw_newline or held.endswith("\n")
    if held is not None and not (saw_newline and not held.endswith("\n")):
        parser.feed(held, default_pid)


def parse_lines(lines: Iterable[str], default_pid: int | None = None) -> dict[int, ProcessLoads]:
    """Parse loader debug lines (any mix of pids) into one ProcessLoads per pid, sorted by pid.

    Lines without a ``<pid>:`` prefix belong to the last pid seen, or to `default_pid` before any.
    """
    parser = _Parser()
    _feed_lines(parser, lines, default_pid)
    return parser.result()


_FILE_PID = re.compile(r"\.(\d+)$")


def _files(folder: Path) -> Iterator[Path]:
    """Regular files of `folder`, ld.<pid> ones in pid order first, then the rest by name."""
    files = [p for p in folder.iterdir() if p.is_file()]

    def key(p: Path) -> tuple[int, int, str]:
        match = _FILE_PID.search(p.name)
        return (0, int(match.group(1)), p.name) if match else (1, 0, p.name)

    return iter(sorted(files, key=key))


def parse_dir(path: str | os.PathLike[str]) -> dict[int, ProcessLoads]:
    """Parse every file of an ``LD_DEBUG_OUTPUT`` folder, streaming, one file at a time.

    The pid in each line's prefix is authoritative; the ``.<pid>`` file suffix only serves lines
    that have no prefix.  Undecodable bytes are replaced, never raised on.
    """
    parser = _Parser()
    for file in _files(Path(path)):
        match = _FILE_PID.search(file.name)
        default = int(match.group(1)) if match else None
        parser.last_pid = None
        with file.open(encoding="utf-8", errors="replace", newline=None) as handle:
            _feed_lines(parser, handle, default)
    return parser.result()


# --- runtime families ---------------------------------------------------------------------------




def family_of(path: str) -> str | None:
    """The RUNTIME_FAMILIES key whose pattern matches the basename of `path`, if any."""
    base = os.path.basename(path)
    return next((name for name, fam in RUNTIME_FAMILIES.items() if fam.pattern.match(base)), None)


@dataclass(frozen=True, slots=True)
class DuplicateRuntime:
    """Two or more distinct files of one runtime family initialised in one process."""

    family: str
    label: str
    pid: int
    objects: tuple[LoadedObject, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        """The files, normalised (`torch/lib/../../torch.libs/x` -> `torch.libs/x`)."""
        return tuple(os.path.normpath(obj.path) for obj in self.objects)


_USR_MERGED = ("/usr/lib/", "/usr/lib32/", "/usr/lib64/", "/usr/libx32/", "/usr/bin/", "/usr/sbin/")


def canonical_path(path: str) -> str:
    """One spelling per file: normalised, resolved when it exists here, ``/usr/lib`` -> ``/lib``.

    Paths usually come from inside a container and do not exist on this host; then only the
    merged-/usr aliases (``/lib`` is ``/usr/lib`` on Debian and Ubuntu) are folded.
    """
    norm = os.path.normpath(path)
    try:
        if os.path.exists(norm):
            norm = os.path.realpath(norm)
    except (OSError, ValueError):
        pass
    for prefix in _USR_MERGED:
        if norm.startswith(prefix):
            return norm[len("/usr"):]
    return norm


def _duplicates_in(proc: ProcessLoads) -> list[DuplicateRuntime]:
    groups: dict[str, dict[str, LoadedObject]] = {}
    for obj in proc.initialised:
        name = family_of(obj.path)
        if name is not None:
            groups.setdefault(name, {}).setdefault(canonical_path(obj.path), obj)
    return [
        DuplicateRuntime(name, RUNTIME_FAMILIES[name].label, proc.pid, tuple(found.values()))
        for name, found in sorted(groups.items())
        if len(found) > 1
    ]


def find_duplicate_runtimes(procs: Mapping[int, ProcessLoads]) -> list[DuplicateRuntime]:
    """Every family with two or more distinct files initialised in one pid, sorted by (pid, family)."""
    found = [dup for pid in sorted(procs) for dup in _duplicates_in(procs[pid])]
    return sorted(found, key=lambda dup: (dup.pid, dup.family))


_COUNTS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _requester(obj: LoadedObject) -> str:
    if obj.how == "preload":
        return "preloaded with LD_PRELOAD"
    if obj.needed_by is None:
        return "requester unknown"
    who = obj.needed_by
    name = f"the Inductor kernel {who}" if "torchinductor_" in who else os.path.basename(who) or who
    return f"loaded with dlopen by {name}" if obj.how == "dlopen" else f"needed by {name}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def describe(dup: DuplicateRuntime) -> str:
    """Plain words for a report: how many copies, in which pid, and who pulled each one in."""
    count = _COUNTS[len(dup.objects)] if len(dup.objects) < len(_COUNTS) else str(len(dup.objects))
    parts = [f"{path} ({_requester(obj)})" for path, obj in zip(dup.paths, dup.objects, strict=True)]
    return f"{count} {dup.label} runtimes in pid {dup.pid}: {_join(parts)}"

