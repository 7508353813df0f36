"""The lab's results as typed documents: result.json, evidence.json, bisect.json, ablation.json and
every `--json` line (a run, a matrix, a bisection, an ablation).

Each document is a pydantic model, written with `model_dump_json` and read with `model_validate_json`,
never as a hand-built dict. Each carries

- `schema_version`: an integer, SCHEMA_VERSION today. It grows when a field changes meaning or goes
  away; adding a field does not change it, and readers ignore fields they do not know, so a newer
  lab's document of the same version still reads here;
- `kind`: what the document is (`run`, `evidence`, `bisect`, `matrix`, `ablation`).

A result.json without `schema_version` is **schema 0**, the layout lab 0.1.0 wrote before results
were versioned (tests/data/run-folders/ keeps a real one). It is read through `_migrate_run_v0`,
which adds the fields that layout could lack. Anything else that is not a document of the expected
kind and a known version (a newer major version, another kind, JSON that is no result at all) is a
ResultError: one paragraph naming the file and what is wrong with it.

`lab schema` publishes the JSON Schemas of these models (see lab.schemas). This module depends on
no stage of the pipeline: the stages import it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    computed_field,
    model_validator,
)

from lab.core.errors import ResultError

SCHEMA_VERSION = 1
RESULT_NAME = "result.json"
_MAX_RESULT_BYTES = 16 << 20


class Verdict(str, Enum):
    """What the judge decided about one run."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not_reproduced"
    ERROR = "error"        # infrastructure: a failed build, an emulator crash, out of memory, no torch
    TIMEOUT = "timeout"
    # the script failed, but not with the scenario's signature (another exception, another exit):
    # never silently `not_reproduced`; a bisection skips it unless told to count it on one side
    FAILED_DIFFERENTLY = "failed_differently"


# A bisection's view of a verdict: `error` and `timeout` say nothing about the bug, so they are a skip;
# so is `failed_differently` unless the bisection is told to count it on one side.
REPRODUCED, NOT_REPRODUCED, SKIP = "reproduced", "not_reproduced", "skip"
FAILED_DIFFERENTLY = "failed_differently"
OUTCOMES = (REPRODUCED, NOT_REPRODUCED, SKIP)
Outcome = Literal["reproduced", "not_reproduced", "skip"]
Arch = Literal["amd64", "arm64"]


def outcome_of(verdict: object, failed_differently: str = SKIP) -> str:
    """A verdict (`Verdict` or its string) as a bisection outcome: `reproduced` and `not_reproduced`
    pass through; `error`, `timeout` (and `skip` itself) are `skip`; `failed_differently` is
    `failed_differently` (default `skip`, or one of the sides)."""
    value = str(getattr(verdict, "value", verdict))
    if value in (REPRODUCED, NOT_REPRODUCED):
        return value
    if value in (Verdict.ERROR.value, Verdict.TIMEOUT.value, SKIP):
        return SKIP
    if value == FAILED_DIFFERENTLY:
        if failed_differently not in OUTCOMES:
            raise ValueError(f"a failed_differently probe counts as one of {', '.join(OUTCOMES)}, "
                             f"not {failed_differently!r}")
        return failed_differently
    raise ValueError(f"unknown verdict {value!r}; expected reproduced, not_reproduced, failed_differently, "
                     "error or timeout")


def _iso_time(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO 8601 time such as 2026-11-22T12:09:58+00:00") from None
    return value


IsoTime = Annotated[str, AfterValidator(_iso_time)]


class Record(BaseModel):
    """Every part of a document: frozen, unknown fields ignored (see the module docstring), keys as
    the JSON spells them."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True, serialize_by_alias=True,
                              json_schema_serialization_defaults_required=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, as plain data (for `json.dumps` and for comparing)."""
        return self.model_dump(mode="json")


class Document(Record):
    """A whole document: what a file or a `--json` line holds."""

    schema_version: Literal[1] = SCHEMA_VERSION

    def write(self, path: Path) -> None:
        """Write it as indented JSON, atomically (a reader never sees half a file)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)


# --- one run: result.json ----------------------------------------------------------------------------
class Check(Record):
    """One expectation of the scenario, as the judge saw it."""

    key: str
    expected: str
    observed: str
    held: bool


class FailureSignatures(Record):
    """A run that failed, but not with the scenario's signature: both signatures, side by side."""

    expected: str   # what the scenario's expectations say the bug looks like
    observed: str   # how this run failed: its exception, exit code and duplicate runtimes


class FailureSignature(Record):
    """How a failing run failed, in the terms PyTorch's minifier compares (`check_str`): the final
    exception's type and the innermost torch frame it went through (`torch/_inductor/graph.py in
    run_node`), or the signal that killed the process. The frame is None when no torch frame was on
    the stack (the script raised it itself)."""

    exception: str | None = None   # unqualified type: RuntimeError, Unsupported
    frame: str | None = None       # innermost torch frame, `torch/<path> in <function>`
    signal: str | None = None      # SIGSEGV, SIGABRT... (a crash, not an exception)

    def words(self) -> str:
        if self.signal:
            return f"killed by {self.signal}"
        if self.exception:
            return self.exception + (f" in {self.frame}" if self.frame else " (no torch frame)")
        return "no exception and no signal"

    def matches(self, observed: FailureSignature | None) -> bool:
        """Whether `observed` is this failure: the same signal; or the same exception type and, when
        this one names a frame, a frame with the same file or the same function (a release that
        moves or renames one of them is still the same failure; one that changes both is not)."""
        if observed is None:
            return False
        if self.signal or observed.signal:
            return self.signal == observed.signal
        if self.exception != observed.exception:
            return False
        if not self.frame:
            return True
        if not observed.frame:
            return False
        mine, theirs = self.frame.partition(" in "), observed.frame.partition(" in ")
        return mine[0] == theirs[0] or (bool(mine[2]) and mine[2] == theirs[2])


class TorchBuild(Record):
    """The torch the image really has, from its `torch/version.py`: the release and the commit it
    was built from (`torch.version.git_version`), so a boundary maps onto the source."""

    version: str | None = None
    git_version: str | None = None
    cuda: str | None = None


class Judgement(Record):
    verdict: Verdict
    reason: str
    checks: tuple[Check, ...] = ()
    different: FailureSignatures | None = None   # set when the verdict is failed_differently
    signature: FailureSignature | None = None    # how the script failed, when it failed


class DuplicateRuntimeRef(Record):
    """Two or more files of one runtime family initialised in one process."""

    family: str
    pid: int
    paths: tuple[str, ...]


class ExceptionRef(Record):
    """The exception the script exited with."""

    type: str
    message: str


class RunEvidence(Record):
    """The evidence in result.json (and `lab run --json`): evidence.json has the rest."""

    duplicate_runtimes: tuple[DuplicateRuntimeRef, ...] = ()
    exception: ExceptionRef | None = None


class ImageRef(Record):
    tag: str
    id: str
    cached: bool
    # the venv's packages were not in the image: the run got the host's cross-installed tree as
    # read-only mounts (a Docker engine on this host, lab.image.sitemount)
    site_mounted: bool = False


class BaseRef(Record):
    requested: str
    ref: str
    origin: Literal["local", "pulled", "bootstrapped"]
    image_id: str


class StreamCaptureDetail(Record):
    """What was kept of one output stream (stdout or stderr)."""

    bytes: int          # what the script wrote
    kept: int           # what the run folder holds
    cap: int | None
    cut: bool
    note: str | None = None


class SkippedDetail(Record):
    """An entry of /out the lab did not copy (a link, fifo, device, unsafe name...)."""

    path: str
    kind: str
    detail: str = ""


class OutputCopyDetail(Record):
    """What was copied out of the container's /out through the engine API."""

    folder: str
    files: int
    bytes: int
    skipped: tuple[SkippedDetail, ...] = ()
    stopped: str | None = None


class CaptureDetail(Record):
    """What the run folder kept of the script's outputs, with every cut and skip."""

    stdout: StreamCaptureDetail | None = None
    stderr: StreamCaptureDetail | None = None
    out: OutputCopyDetail | None = None


class StageTimes(Record):
    """Wall seconds of each stage of one run (a stage that did not happen is absent)."""

    site_s: float | None = None         # the requirements cross-installed on the host (uv), or found cached
    build_s: float | None = None        # the image: base, site image and the case's build, or found cached
    base_s: float | None = None         # of build_s: the base (bootstrapped when cold)
    run_s: float | None = None
    analyze_s: float | None = None
    diagnose_s: float | None = None
    collect_env_s: float | None = None
    total_s: float


class EngineRef(Record):
    version: str
    host_arch: str
    name: str = "default"  # the engine used: its Docker context's name, or its address
    kind: Literal["docker", "local"] = "docker"  # local: this host, no container (`--engine local`)


class LocalRef(Record):
    """A run of the local engine: the host it ran on, its Python and how the script was confined."""

    os: str                # the host's OS (PRETTY_NAME of /etc/os-release)
    libc: str              # glibc 2.36
    python: str            # 3.11.7
    python_env: Literal["venv", "current"]
    environment: str       # the venv's folder, or the interpreter's path
    system_packages: str   # where they came from: the host, never the scenario's base image
    confined: bool
    confinement: str       # bubblewrap's version and what it allowed, or "not confined (--trust-script) ..."


class DepsRef(Record):
    """How everything but torch resolved (lab.image.era): the setting, uv's --exclude-newer cut, and
    the version of every package the run had (its pip freeze, torch and the venv's tools left out)."""

    setting: str = "latest"
    exclude_newer: str | None = None
    torch_uploaded: str | None = None
    pinned: tuple[str, ...] = ()          # the pins the lab chose itself (a blame probe, a replay)
    packages: dict[str, str] = {}


class RunResult(Document):
    """result.json of a run that reached a verdict, and `lab run --json`."""

    kind: Literal["run"] = "run"
    scenario: str
    case: str
    torch: str
    arch: Arch
    backend: str | None
    mode: str | None
    emulated: bool
    verdict: Verdict
    reason: str
    summary: tuple[str, ...]
    run_dir: str
    evidence: RunEvidence
    graph_breaks: int | None
    exit_code: int | None
    duration_s: float | None
    killed: str | None
    limits: str | None
    capture: CaptureDetail | None = None
    diagnose: str | None = None         # whether the diagnose step ran, and why
    timings: StageTimes | None = None
    checks: tuple[Check, ...]
    image: ImageRef | None
    base: BaseRef | None
    engine: EngineRef
    local: LocalRef | None = None       # the local engine's host, Python and confinement
    lab_version: str
    started: IsoTime
    different_failure: FailureSignatures | None = None   # failed_differently: expected vs observed
    torch_build: TorchBuild | None = None                 # torch/version.py of the image
    content_key: str | None = None      # lab.image.casekey: what the run was made from (reuse only the same)
    content_parts: dict[str, str] | None = None   # each part's own hash, to say which one changed
    signature: FailureSignature | None = None             # how the script failed, when it failed
    deps: DepsRef | None = None         # how the dependencies resolved, and what the run had


class UnfinishedRun(Document):
    """result.json of a run that stopped without a verdict: interrupted (Ctrl-C) or failed (the
    infrastructure broke). `verdict` is always null."""

    kind: Literal["run"] = "run"
    scenario: str
    case: str
    torch: str
    arch: Arch
    backend: str | None = None
    mode: str | None = None
    verdict: None = None
    status: Literal["interrupted", "failed"]
    reason: str
    run_dir: str


def _finished_or_not(data: Any) -> str:
    if isinstance(data, dict):
        return "unfinished" if data.get("verdict") is None else "finished"
    return "unfinished" if getattr(data, "verdict", None) is None else "finished"


AnyRun = Annotated[Annotated[RunResult, Tag("finished")] | Annotated[UnfinishedRun, Tag("unfinished")],
                   Discriminator(_finished_or_not)]
RUN_FILE = TypeAdapter(AnyRun)


# --- evidence.json -------------------------------------------------------------------------------------
class DuplicateRuntimeDetail(Record):
    family: str
    label: str
    pid: int
    paths: tuple[str, ...]
    needed_by: tuple[str | None, ...]   # who asked for each file, in the order of `paths`


class GraphBreakDetail(Record):
    reason: str
    explanation: str | None
    hints: tuple[str, ...]
    user_code: tuple[str, ...]


class ExceptionDetail(Record):
    type: str
    message: str
    graph_break: GraphBreakDetail | None = None


class SingleRuntime(Record):
    """A runtime family of which every process loaded one file, the same one."""

    family: str
    path: str
    processes: int


class LimitsDetail(Record):
    memory_bytes: int | None
    pids: int | None
    cpus: float | None
    network: bool
    output_bytes: int | None = None   # cap on what is copied out of /out
    output_files: int | None = None   # cap on the number of files copied out of /out
    stream_bytes: int | None = None   # cap on each of stdout and stderr
    gpus: str | None = None           # "all": the container requested every GPU of the engine (`--gpus all`)


class EvidenceRecord(Document):
    """evidence.json: everything the analysis found, and the judge's checks."""

    kind: Literal["evidence"] = "evidence"
    exit_code: int | None
    timed_out: bool
    oom_killed: bool
    duration_s: float
    emulated: bool
    processes: int
    duplicate_runtimes: tuple[DuplicateRuntimeDetail, ...]
    exception: ExceptionDetail | None
    exceptions: tuple[ExceptionDetail, ...]
    emulator_crash: str | None
    single_runtimes: tuple[SingleRuntime, ...]
    stopped_for: str | None
    limits: LimitsDetail | None
    capture: CaptureDetail | None = None
    judgement: Judgement


# --- a bisection: bisect.json and `lab bisect --json` ----------------------------------------------
class Probe(Record):
    """What one release did. `verdict` is the raw verdict (e.g. `error` for a skip); it defaults to
    the outcome, or to `skip` when only the outcome is known."""

    version: str = Field(alias="torch")
    verdict: Literal["reproduced", "not_reproduced", "failed_differently", "error", "timeout",
                     "skip"]  # given, or the outcome
    outcome: Outcome
    reason: str = ""
    evidence: str = ""
    run_dir: str | None = None
    # wall seconds of the probe's run (result.json `timings`): building its image, running the
    # script, and the whole run; absent when no run happened (a skip before the build)
    build_s: float | None = None
    run_s: float | None = None
    total_s: float | None = None
    engine: str | None = None   # the engine that ran it
    emulated: bool | None = None
    git_version: str | None = None      # torch.version.git_version of the probe's image
    different_failure: FailureSignatures | None = None   # failed_differently: expected vs observed
    # the verdict was taken from an earlier run with the same content key (a `lab run`, a matrix cell,
    # a triage's run, another bisection's probe): its folder; the release was not run again
    reused_from: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _verdict_from_outcome(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("verdict") and isinstance(data.get("outcome"), str):
            data = {**data, "verdict": data["outcome"]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Probe:
        if self.verdict == FAILED_DIFFERENTLY:
            return self  # counted as the bisection was told: a skip, or one of the sides
        if outcome_of(self.verdict) != self.outcome:
            raise ValueError(f"verdict {self.verdict!r} contradicts outcome {self.outcome!r}")
        return self

    @classmethod
    def judged(cls, version: str, verdict: object, reason: str = "", evidence: str = "",
               run_dir: str | None = None, *, build_s: float | None = None, run_s: float | None = None,
               total_s: float | None = None, engine: str | None = None, emulated: bool | None = None,
               failed_differently: str = SKIP, git_version: str | None = None,
               different_failure: FailureSignatures | None = None) -> Probe:
        """A probe from a judge's verdict (`Verdict` or string): the outcome follows from it
        (`failed_differently` says how a probe that failed differently counts)."""
        raw = str(getattr(verdict, "value", verdict))
        return cls(version=version, verdict=raw, outcome=outcome_of(raw, failed_differently), reason=reason,
                   evidence=evidence, run_dir=run_dir, build_s=build_s, run_s=run_s, total_s=total_s,
                   engine=engine, emulated=emulated, git_version=git_version,
                   different_failure=different_failure)

    @property
    def skipped(self) -> bool:
        return self.outcome == SKIP


FOUND, AMBIGUOUS, NO_CHANGE, NO_RUNNABLE_PAIR = "found", "ambiguous", "no_change", "no_runnable_pair"
PYTORCH_REPO = "https://github.com/pytorch/pytorch"


class SourceBoundary(Record):
    """The boundary pinned to PyTorch's source: the two releases' commits (`torch.version.git_version`
    of the probes' images), a link that compares them, and the line that starts a commit-level
    `git bisect` on a PyTorch checkout. A commit that was not recorded falls back to the release tag."""

    last_old: str
    first_new: str
    last_old_commit: str | None = None
    first_new_commit: str | None = None
    compare_url: str
    git_bisect: str

    @classmethod
    def of(cls, last_old: str, first_new: str, old_commit: str | None, new_commit: str | None,
           direction: str | None) -> SourceBoundary:
        old_ref = old_commit or release_tag(last_old)
        new_ref = new_commit or release_tag(first_new)
        if direction == "fix":  # the new behaviour is the good one: name the terms
            line = f"git bisect start --term-old=broken --term-new=fixed {new_ref} {old_ref}"
        else:
            line = f"git bisect start {new_ref} {old_ref}"
        return cls(last_old=last_old, first_new=first_new, last_old_commit=old_commit,
                   first_new_commit=new_commit, compare_url=f"{PYTORCH_REPO}/compare/{old_ref}...{new_ref}",
                   git_bisect=line)


def release_tag(version: str) -> str:
    """PyTorch's git tag of a release: `2.5.1+cpu` -> `v2.5.1`."""
    return "v" + version.split("+", 1)[0]


class Blamed(Record):
    """One package whose version flips the verdict at a bisection's boundary (lab.drivers.blame);
    `torch` itself when torch alone flips it. `old`/`new`: the older side's (or the era's) version and
    the newer side's (or today's)."""

    package: str
    old: str | None = None
    new: str | None = None


class BlameStep(Record):
    """One run of the blame step: a boundary release rebuilt with another dependency set."""

    torch: str
    label: str                      # what it was given: "2.3.0's dependencies", "its era's", "ddmin 1"...
    changed: tuple[str, ...] = ()   # the packages whose version differed from what the probe ran with
    verdict: str
    flips: bool | None = None       # None: no verdict (error, timeout)
    run_dir: str | None = None
    total_s: float | None = None
    reused: bool = False


class BisectResult(Document):
    """Where the behaviour changes (lab.bisect finds it; lab.bisect_run adds where and how it ran).

    `last_old` is the newest release that behaves like the old end, `first_new` the oldest that
    behaves like the new end; both are runnable releases, never skips. `from_verdict`/`to_verdict`
    are the verdicts of the runnable ends actually used (`old_end`/`new_end`), which differ from the
    requested ends (`from`/`to`) when those were skipped. `skipped_between` lists the skipped
    releases between `last_old` and `first_new` (non-empty exactly when `ambiguous`).
    """

    kind: Literal["bisect"] = "bisect"
    from_verdict: Literal["reproduced", "not_reproduced"] | None = None
    to_verdict: Literal["reproduced", "not_reproduced"] | None = None
    last_old: str | None = None
    first_new: str | None = None
    steps: tuple[Probe, ...] = ()
    status: Literal["found", "ambiguous", "no_change", "no_runnable_pair"]
    ambiguous: bool = False
    skipped_between: tuple[str, ...] = ()
    from_version: str = Field(alias="from")
    to_version: str = Field(alias="to")
    old_end: str | None = None
    new_end: str | None = None
    notes: tuple[str, ...] = ()
    width: int = 1                # releases probed per round (the slots it had)
    rounds: int | None = None     # rounds of probes (with width 1: the probes made; eager: the moments probes started)
    eager: bool = False           # each probe started as soon as a slot was free (lab.drivers.bisect_eager)
    # where and how the driver ran it (absent from the pure search's answer)
    scenario: str | None = None
    arch: Arch | None = None
    candidates: tuple[str, ...] = ()
    folder: str | None = None
    resume: str | None = None
    # how probes that failed differently were counted (`--failed-differently`), and which they were
    failed_differently: Outcome = SKIP
    # a scenario that expects only an exit code: the failure its first failing probe recorded (in the
    # folder's signature.json), which every later probe that fails must match, and that probe's release
    signature: FailureSignature | None = None
    signature_from: str | None = None
    source: SourceBoundary | None = None          # the boundary's commits, compare link, git bisect line
    compare: tuple[str, ...] = ()                 # the compare summary of the boundary pair (lab compare)
    localization: str | None = None               # the bad boundary release localized (lab.drivers.localize)
    localize_dir: str | None = None               # its localize.json and localize.md
    deps: str = "latest"                          # how everything but torch resolved (lab.image.era)
    blame: tuple[Blamed, ...] = ()                # what flips the verdict at the boundary (lab.drivers.blame)
    blame_summary: str | None = None              # the blame step's answer in one sentence, or why not run
    blame_fix: str | None = None                  # a line a maintainer can act on ("pin numpy<2 on torch <= 2.2.x")
    blame_steps: tuple[BlameStep, ...] = ()       # its runs

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failed_differently_probes(self) -> tuple[str, ...]:
        """Every release whose probe failed, but not with the scenario's signature."""
        return tuple(p.version for p in self.steps if p.verdict == FAILED_DIFFERENTLY)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def skipped(self) -> tuple[str, ...]:
        """Every release that was probed and skipped, in probe order."""
        return tuple(p.version for p in self.steps if p.skipped)

    def blame_lines(self) -> list[str]:
        """The blame step's answer (lab.drivers.blame) in lines: dependencies first when they are the cause."""
        if not self.blame and not self.blame_summary:
            return []
        deps = [b for b in self.blame if b.package != "torch"]
        out = []
        if deps:
            out.append("cause: dependencies, not torch: " + ", ".join(f"{b.package} {b.old} → {b.new}" for b in deps))
        elif self.blame:
            out.append(f"cause: torch alone ({self.last_old} → {self.first_new})")
        if self.blame_summary:
            out.append(f"blame: {self.blame_summary}")
        if self.blame_fix and deps:
            out.append(f"to act on: {self.blame_fix}")
        return out

    @property
    def direction(self) -> str | None:
        """`regression` (not_reproduced -> reproduced), `fix` (the reverse), or None."""
        if self.status not in (FOUND, AMBIGUOUS):
            return None
        return "regression" if self.to_verdict == REPRODUCED else "fix"

    @property
    def summary(self) -> str:
        """One paragraph that states the result (what the CLI prints and the report leads with)."""
        old = f"{self.old_end} ({self.from_verdict})"
        new = f"{self.new_end} ({self.to_verdict})"
        if self.status == FOUND:
            text = (f"first release that behaves like {new}: {self.first_new}; "
                    f"last like {old}: {self.last_old}.")
        elif self.status == AMBIGUOUS:
            text = (f"the change lies between {self.last_old} ({self.from_verdict}) and {self.first_new} "
                    f"({self.to_verdict}), but {', '.join(self.skipped_between)} could not be run, so the "
                    "boundary is ambiguous: it is one of " + ", ".join((*self.skipped_between, self.first_new))
                    + ".")
        elif self.status == NO_CHANGE:
            text = (f"both ends {self.from_verdict}: nothing to bisect ({self.old_end}: {self.from_verdict}, "
                    f"{self.new_end}: {self.to_verdict}).")
        else:
            runnable = [f"{p.version} ({p.verdict})" for p in self.steps if not p.skipped]
            text = ("no two releases with different verdicts could be run: "
                    + (f"only {runnable[0]} ran" if runnable else "every release probed was skipped")
                    + f" between {self.from_version} and {self.to_version}.")
        if self.notes and self.status != FOUND:
            text += " " + " ".join(n if n.endswith(".") else n + "." for n in self.notes)
        return text


# --- a matrix: `lab run --torch A,B --arch X,Y --json` ------------------------------------------------
CellVerdict = Literal["reproduced", "not_reproduced", "failed_differently", "error", "timeout", "flaky", "mixed",
                      "not_run"]


class MatrixRun(Record):
    verdict: Verdict
    run_dir: str
    reason: str


class MatrixCell(Record):
    """One case of a matrix, run `repeat` times: one verdict when every run agrees, else `flaky`
    (reproduced and not) or `mixed` (with errors); `rate` among the runs that reached a verdict."""

    cell: str
    torch: str
    arch: Arch
    backend: str | None
    verdict: CellVerdict
    repeat: int
    reproduced: int
    runnable: int
    rate: float | None
    runs: tuple[MatrixRun, ...]


class MatrixResult(Document):
    kind: Literal["matrix"] = "matrix"
    scenario: str
    cells: tuple[MatrixCell, ...]
    folder: str | None = None   # runs/<scenario>/matrix-<timestamp>/: matrix.json and report.html
    # a scenario that expects only an exit code: the first failing run's signature, which every other
    # run that failed had to match (else failed_differently), and the cell it came from
    signature: FailureSignature | None = None
    signature_from: str | None = None


# --- an ablation: ablation.json and `lab run --ablate --json` --------------------------------------
class AblationStep(Record):
    backend: str
    mode: str | None
    verdict: Verdict
    reason: str
    run_dir: str | None


class AblationResult(Document):
    kind: Literal["ablation"] = "ablation"
    scenario: str
    torch: str
    arch: Arch
    emulated: bool
    run_dir: str
    ablation: tuple[AblationStep, ...]
    layer: Literal["dynamo", "aot_autograd", "inductor", "inductor-max-autotune"] | None
    conclusion: str


# --- a localization: localize.json and `lab localize --json` --------------------------------------
class BisectorResult(Record):
    """What torch._inductor.compiler_bisector said, or why it did not run."""

    available: bool            # the release ships the module with its `run` command
    ran: bool
    words: str                 # one sentence for the report
    backend: str | None = None
    subsystem: str | None = None
    bisect_number: int | None = None
    debug_info: str | None = None
    exit_code: int | None = None
    log: str | None = None     # the bisector's stdout, relative to the localize folder


class LocalizeResult(Document):
    """localize.json: the layer (ablation) and the subsystem (compiler_bisector) of a compile bug."""

    kind: Literal["localize"] = "localize"
    scenario: str
    torch: str
    arch: str
    layer: str | None
    ablation: str              # the ablation's conclusion, or why there was none
    ablation_dir: str | None
    bisector: BisectorResult
    conclusion: str
    key: str | None = None     # the content key of the case localized (lab.image.casekey): a bisection
                               # run again over its folder takes this localization when it is the same



# --- reading --------------------------------------------------------------------------------------------
def read_result(run_dir: Path | str, *, where: str | None = None) -> RunResult | UnfinishedRun:
    """The result.json of a run folder, through the model: every consumer reads results with this.

    Raises ResultError (naming `where`, default the file) when the file is missing, is not JSON, is
    another kind of document, comes from a newer lab, or does not fit the schema.
    """
    path = Path(run_dir) / RESULT_NAME
    name = where or str(path)
    missing = "" if where else f", so {run_dir} is not a run folder"
    hint = "Pass a folder that `lab run` made, such as runs/<scenario>/<time>-torch<v>-<arch>."
    return parse_result(_read_bytes(path, name, missing, hint), name)


DocumentT = TypeVar("DocumentT", bound=Document)


def read_document(path: Path | str, model: type[DocumentT]) -> DocumentT:
    """Another document (bisect.json, ablation.json, evidence.json) through its model, checked like
    result.json: its kind, and a schema version this lab reads (one without is lab 0.1.0's, whose
    fields these documents kept)."""
    name = str(path)
    data = _parse_json(_read_bytes(Path(path), name), name)
    kind = model.model_fields["kind"].default
    _schema_version(data, name, kind)
    try:
        return model.model_validate({**data, "schema_version": SCHEMA_VERSION, "kind": kind})
    except ValidationError as exc:
        raise ResultError(f"{name}: {validation_problem(exc)}.", hint=_more(exc) + _DAMAGED) from None


def _read_bytes(path: Path, name: str, missing: str = "", hint: str | None = None) -> bytes:
    try:
        if path.is_symlink() or not path.is_file():
            raise FileNotFoundError
        with path.open("rb") as handle:
            raw = handle.read(_MAX_RESULT_BYTES + 1)
    except FileNotFoundError:
        raise ResultError(f"{name}: there is no such file{missing}.", hint=hint) from None
    except OSError as exc:
        raise ResultError(f"{name}: cannot be read ({exc.strerror or exc}).") from None
    if len(raw) > _MAX_RESULT_BYTES:
        raise ResultError(f"{name}: is larger than {_MAX_RESULT_BYTES >> 20} MiB, more than any result.",
                          hint=_DAMAGED)
    return raw


_DAMAGED = "The run folder is damaged or was not made by `lab run`; run the scenario again."


def parse_result(raw: bytes | str, where: str) -> RunResult | UnfinishedRun:
    """result.json's text as a RunResult (verdict reached) or an UnfinishedRun; schema 0 is migrated."""
    data = _parse_json(raw, where)
    version = _schema_version(data, where, "run")
    if version == 0:
        data = _migrate_run_v0(data)
    try:
        return RUN_FILE.validate_python(data)
    except ValidationError as exc:
        old = (" (it has no `schema_version`, so it was read as the unversioned layout of lab 0.1.0, and it "
               "is not that either)") if version == 0 else ""
        raise ResultError(f"{where}: {validation_problem(exc)}{old}.", hint=_more(exc) + _DAMAGED) from None


def _parse_json(raw: bytes | str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)  # UTF-8 only, no guessing
    except UnicodeDecodeError as exc:
        raise ResultError(f"{where}: is not UTF-8 text (byte {exc.start}).", hint=_DAMAGED) from None
    except json.JSONDecodeError as exc:
        raise ResultError(f"{where}: is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).",
                          hint=_DAMAGED) from None
    except (ValueError, RecursionError) as exc:
        raise ResultError(f"{where}: is not usable JSON ({str(exc)[:200] or 'nested too deeply'}).",
                          hint=_DAMAGED) from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
            type(data), "null")
        raise ResultError(f"{where}: is {kind} in JSON, not an object.", hint=_DAMAGED)
    return data


_KIND_WORDS = {"run": "a run's result", "evidence": "a run's evidence", "bisect": "a bisection's result",
               "matrix": "a matrix's result", "ablation": "an ablation's result",
               "compare": "a comparison of two runs", "localize": "a localization"}


def _schema_version(data: dict[str, Any], where: str, kind: str) -> int:
    """The document's schema version, after checking its kind; 0 when it predates versions."""
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ResultError(f"{where}: field `schema_version` must be a whole number, got {_show(version)}.",
                          hint=_DAMAGED)
    found = data.get("kind", kind if version == 0 else None)
    if found != kind:
        what = _KIND_WORDS.get(found, f"of kind {_show(found)}") if isinstance(found, str) else \
            f"without a valid `kind` ({_show(found)})"
        raise ResultError(f"{where}: is {what}, not {_KIND_WORDS[kind]}.",
                          hint=f"Pass the {RESULT_NAME} of a run folder." if kind == "run" else None)
    if version > SCHEMA_VERSION:
        raise ResultError(
            f"{where}: was written by a newer torch-repro-lab (schema_version {version}); this lab "
            f"reads schema_version {SCHEMA_VERSION} and the older unversioned layout.",
            hint="Upgrade torch-repro-lab to read it.")
    return version


# Fields lab 0.1.0 added to result.json over time; a schema-0 file may lack them.
_V0_DEFAULTS: dict[str, Any] = {"backend": None, "mode": None, "summary": [], "graph_breaks": None,
                                "exit_code": None, "duration_s": None, "killed": None, "limits": None,
                                "checks": [], "image": None, "base": None}


def _migrate_run_v0(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 0 (no `schema_version`) -> schema 1: the fields added since, with the values that mean
    "not recorded". Unfinished runs had the same keys as now."""
    migrated = {**data, "schema_version": SCHEMA_VERSION, "kind": "run"}
    if data.get("verdict") is not None:
        for key, value in _V0_DEFAULTS.items():
            migrated.setdefault(key, value)
    return migrated


def validation_problem(exc: ValidationError) -> str:
    """A pydantic error as words: the first problem, with the field's dotted path."""
    error = exc.errors()[0]
    loc = format_loc(tuple(error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"the required field `{loc}` is missing"
    if error["type"] == "extra_forbidden":
        return f"unknown field `{loc}`"
    return (f"field `{loc}`: " if loc else "") + f"{message}, got {_show(error.get('input'))}"


def _more(exc: ValidationError) -> str:
    more = len(exc.errors()) - 1
    return f"{more} more problem{'s' if more > 1 else ''} after this one. " if more else ""


def format_loc(loc: Sequence[Any]) -> str:
    """('evidence', 'duplicate_runtimes', 0, 'pid') -> 'evidence.duplicate_runtimes[0].pid' (the
    union's branch tags left out)."""
    text = ""
    for part in loc:
        if part in ("finished", "unfinished"):
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    # a key comes from the file: keep the message one line, whatever the key holds
    return text if text.isprintable() else repr(text)[1:-1]


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
