"""RawRun -> Evidence: what the loader log, the output streams and the exit status show."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab.analyze.loader import (
    RUNTIME_FAMILIES,
    DuplicateRuntime,
    describe,
    family_of,
    find_duplicate_runtimes,
    parse_dir,
)
from lab.analyze.tracebacks import ExceptionInfo, extract_exceptions
from lab.core.records import (
    EMULATOR_CRASH,
    STOPPED_OUT_FULL,
    OutputCopy,
    RawRun,
    RunLimits,
    StreamCapture,
    format_bytes,
)
from lab.core.results import (
    CaptureDetail,
    DuplicateRuntimeDetail,
    DuplicateRuntimeRef,
    EvidenceRecord,
    ExceptionDetail,
    ExceptionRef,
    GraphBreakDetail,
    Judgement,
    LimitsDetail,
    OutputCopyDetail,
    RunEvidence,
    SingleRuntime,
    StreamCaptureDetail,
)
from lab.core.runtimes import CUDA_FAMILIES

_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Evidence:
    exit_code: int | None
    timed_out: bool
    oom_killed: bool
    duration_s: float
    emulated: bool
    processes: int                       # processes that wrote a loader log
    duplicate_runtimes: tuple[DuplicateRuntime, ...]
    exceptions: tuple[ExceptionInfo, ...]  # every traceback in stderr, in order
    emulator_crash: str | None           # the QEMU line, when the emulator itself crashed
    single_runtimes: tuple[tuple[str, str, int], ...] = ()  # (family, the one file, processes) w/o duplicates
    limits: RunLimits | None = None      # how the container was confined
    stopped_for: str | None = None       # why the lab stopped the container early
    streams: tuple[StreamCapture, ...] = ()  # how much of stdout and stderr was kept
    outputs: OutputCopy | None = None    # what came out of /out, and what did not
    unit: str = "container"              # what ran the script: "container", or "sandbox" (the local engine)

    @property
    def memory_limit(self) -> str | None:
        return format_bytes(self.limits.memory_bytes) if self.limits and self.limits.memory_bytes else None

    @property
    def oom_words(self) -> str:
        """'killed: out of memory (limit 8 GiB)'."""
        limit = self.memory_limit
        return "killed: out of memory" + (f" (limit {limit})" if limit else "")

    @property
    def out_full_words(self) -> str:
        """'killed: /out grew past its cap (1 GiB)'."""
        cap = f" ({format_bytes(self.limits.output_bytes)})" if self.limits else ""
        return f"killed: /out grew past its cap{cap}"

    @property
    def exception(self) -> ExceptionInfo | None:
        """The final exception: the one the process exited with."""
        return self.exceptions[-1] if self.exceptions else None

    def plain_words(self) -> list[str]:
        """Evidence sentences for report.md."""
        lines = [describe(d) for d in self.duplicate_runtimes]
        for family, path, count in self.single_runtimes:
            if family in ("libgomp", "libiomp5", "libomp"):  # the families a reader looks for first
                label = RUNTIME_FAMILIES[family].label
                lines.append(f"one {label} runtime in every process that loaded one: {path} "
                             f"({count} process{'es' if count != 1 else ''})")
        cuda = [path for family, path, _ in self.single_runtimes if family in CUDA_FAMILIES]
        if cuda:
            lines.append("CUDA libraries loaded, one copy of each: " + ", ".join(cuda))
        if self.exception:
            lines.append(f"the script raised `{self.exception.headline}`")
            gb = self.exception.graph_break
            if gb and gb.explanation:
                lines.append(f"Dynamo's explanation: {gb.explanation}")
            if gb and gb.user_code:
                lines.append("in user code: " + _user_frame(gb.user_code[-1]))
        if self.emulator_crash:
            lines.append(f"the emulator crashed: `{self.emulator_crash}`"
                         + (f"; the lab stopped the {self.unit}" if self.stopped_for else ""))
        if self.oom_killed:
            lines.append(f"the {self.unit} was {self.oom_words}")
        if self.stopped_for == STOPPED_OUT_FULL:
            lines.append(f"the {self.unit} was {self.out_full_words}")
        lines += [words for s in self.streams if (words := s.plain_words())]
        if self.outputs is not None:
            lines += self.outputs.plain_words()
        if self.timed_out:
            lines.append(f"the run was killed after {self.duration_s:.0f} s (timeout)")
        elif self.exit_code is not None:
            lines.append(f"exit code {self.exit_code}")
        return lines

    def capture(self) -> CaptureDetail:
        """What was kept of the outputs: each stream's cut, and what was copied out of /out."""
        streams = {s.name: StreamCaptureDetail.model_validate(s.to_json()) for s in self.streams}
        out = None if self.outputs is None else OutputCopyDetail.model_validate(self.outputs.to_json())
        return CaptureDetail(**streams, out=out)

    def summary(self) -> RunEvidence:
        """The evidence block of result.json (and `lab run --json`)."""
        exc = self.exception
        return RunEvidence(
            duplicate_runtimes=tuple(DuplicateRuntimeRef(family=d.family, pid=d.pid, paths=d.paths)
                                     for d in self.duplicate_runtimes),
            exception=None if exc is None else ExceptionRef(type=exc.type, message=exc.message))

    def record(self, judgement: Judgement) -> EvidenceRecord:
        """evidence.json: everything found, and the judge's checks."""
        exc = self.exception
        lim = self.limits
        return EvidenceRecord(
            exit_code=self.exit_code, timed_out=self.timed_out, oom_killed=self.oom_killed,
            duration_s=round(self.duration_s, 2), emulated=self.emulated, processes=self.processes,
            duplicate_runtimes=tuple(
                DuplicateRuntimeDetail(family=d.family, label=d.label, pid=d.pid, paths=d.paths,
                                       needed_by=tuple(o.needed_by for o in d.objects))
                for d in self.duplicate_runtimes),
            exception=None if exc is None else _exception_detail(exc),
            exceptions=tuple(_exception_detail(e) for e in self.exceptions),
            emulator_crash=self.emulator_crash,
            single_runtimes=tuple(SingleRuntime(family=f, path=p, processes=n) for f, p, n in self.single_runtimes),
            stopped_for=self.stopped_for,
            limits=None if lim is None else LimitsDetail(
                memory_bytes=lim.memory_bytes, pids=lim.pids, cpus=lim.cpus, network=lim.network,
                output_bytes=lim.output_bytes, output_files=lim.output_files, stream_bytes=lim.stream_bytes,
                gpus="all" if lim.gpus else None),
            capture=self.capture(),
            judgement=judgement)


def _user_frame(frame: str) -> str:
    """'File "x.py", line 23, in forward\n    code' -> 'x.py, line 23, in forward: `code`'."""
    head, _, source = frame.partition("\n")
    head = head.strip().removeprefix("File ").replace('"', "", 2)
    return f"{head}: `{source.strip()}`" if source.strip() else head


def _exception_detail(exc: ExceptionInfo) -> ExceptionDetail:
    gb = exc.graph_break
    return ExceptionDetail(type=exc.type, message=exc.message, graph_break=None if gb is None else GraphBreakDetail(
        reason=gb.reason, explanation=gb.explanation, hints=gb.hints, user_code=gb.user_code))


def _single_runtimes(procs) -> tuple[tuple[str, str, int], ...]:
    """Runtime families of which every process initialised at most one file, and the same one
    everywhere: the evidence that a duplicate-runtime bug did not happen (with its one path)."""
    seen: dict[str, dict[str, int]] = {}
    duplicated: set[str] = set()
    for loads in procs.values():
        per_proc: dict[str, set[str]] = {}
        for obj in loads.initialised:
            family = family_of(obj.path)
            if family:
                per_proc.setdefault(family, set()).add(os.path.normpath(obj.path))
        for family, paths in per_proc.items():
            if len(paths) > 1:
                duplicated.add(family)
            for path in paths:
                seen.setdefault(family, {}).setdefault(path, 0)
                seen[family][path] += 1
    return tuple((family, next(iter(paths)), next(iter(paths.values())))
                 for family, paths in sorted(seen.items()) if family not in duplicated and len(paths) == 1)


def read_text(path: Path, limit: int | None = None) -> str:
    """Read a captured stream as text; with `limit`, only its last `limit` bytes."""
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        if limit is not None:
            size = path.stat().st_size
            fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", "replace")


def analyze(raw: RawRun) -> Evidence:
    stderr = read_text(raw.stderr_path)
    procs = parse_dir(raw.loader_dir) if raw.loader_dir.is_dir() else {}
    crash = next((ln.strip() for ln in stderr.splitlines() if EMULATOR_CRASH in ln), None)
    return Evidence(
        exit_code=raw.exit_code,
        timed_out=raw.timed_out,
        oom_killed=raw.oom_killed,
        duration_s=raw.duration_s,
        emulated=raw.emulated,
        processes=len(procs),
        duplicate_runtimes=tuple(find_duplicate_runtimes(procs)),
        exceptions=tuple(extract_exceptions(stderr)),
        emulator_crash=crash,
        single_runtimes=_single_runtimes(procs),
        limits=raw.limits,
        stopped_for=raw.stopped_for,
        streams=raw.streams,
        outputs=raw.outputs,
        unit=raw.unit,
    )
