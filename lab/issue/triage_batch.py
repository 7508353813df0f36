"""`lab triage` over many issues: one batch, a bounded number at once, one summary, resumable.

Each issue is the single-page triage (lab.issue.triage) in its own folder `<runs>/triage/<key>/`.
The batch is a list of `TriageJob`s handed to a *runner*: a function that takes the whole list and
yields each job's `JobOutcome` as it ends. `local_runner` (below) runs `lab triage SOURCE` child
processes, at most `parallel` at once, spread over the configured Docker engines; a Slurm runner
(issue 31) plugs in at the same seam and submits the list as one job array, one task per issue.

Resuming: before the runner sees the list, every issue whose triage finished (its comment written)
and whose runs' content keys are the ones its scenario gives now is taken from its folder and not run
again; the others (new, interrupted, failed, or edited since) go to the runner. The summary
(`summary.json`, `summary.md`) is written again after each issue, so an interrupted batch leaves one
that says what is done."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lab.core import exitcodes as codes
from lab.engine.slurm import POLL_S, TERMINAL, SlurmError, parse_squeue
from lab.engine.slurm import command as slurm_command
from lab.image.casekey import content_key
from lab.image.resolve import resolve
from lab.issue.fetch import IssueError
from lab.issue.triage import STATE_FILE, TriageState, summary_lines
from lab.scenario.lookup import load_scenario

__all__ = ["BatchSummary", "IssueSummary", "JobOutcome", "TriageJob", "batch_exit", "local_runner",
           "read_sources", "run_batch", "triage_folder", "triage_key"]

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


class BatchInputError(IssueError):
    """A list of pages that cannot be read (a missing @file, an empty list)."""


def triage_key(source: str) -> str:
    """The folder name of one page's triage under `<runs>/triage/` (what `lab triage SOURCE` uses)."""
    return "".join(c if c.isalnum() else "-" for c in source.rstrip("/").rsplit("/", 2)[-1])[-60:] or "page"


def triage_folder(runs_root: Path, source: str) -> Path:
    return runs_root / "triage" / triage_key(source)


def read_sources(items: Iterable[str], from_file: Path | None = None) -> list[str]:
    """The pages of a batch: arguments as they are, `@FILE` and `--from-file FILE` read one page per line
    (blank lines and `#` comments skipped); the same page twice counts once."""
    found: list[str] = []

    def from_lines(path: Path) -> list[str]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise BatchInputError(f"{path}: the list of pages cannot be read ({e.strerror}).") from None
        return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    for item in items:
        found += from_lines(Path(item[1:])) if item.startswith("@") else [item]
    if from_file is not None:
        found += from_lines(from_file)
    unique = list(dict.fromkeys(found))
    if not unique:
        raise BatchInputError("no issue page to triage: give URLs or saved pages, @FILE or --from-file FILE.")
    keys: dict[str, str] = {}
    for source in unique:
        other = keys.setdefault(triage_key(source), source)
        if other != source:
            raise BatchInputError(f"{other} and {source} would share the triage folder "
                                  f"{triage_key(source)!r}; rename one of the saved pages.")
    return unique


@dataclass(frozen=True)
class TriageJob:
    source: str
    folder: Path          # <runs>/triage/<key>
    index: int = 0


@dataclass(frozen=True)
class JobOutcome:
    job: TriageJob
    exit_code: int        # lab.core.exitcodes: 0 a verdict was reached, 2 bad input, 3 infrastructure...
    error: str = ""
    engine: str | None = None


Runner = Callable[[list[TriageJob]], Iterator[JobOutcome]]


class IssueSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str
    folder: str
    status: Literal["done", "reused", "bad_input", "infrastructure", "interrupted", "failed"]
    exit_code: int
    error: str | None = None
    scenario: str | None = None
    upstream: str | None = None
    engine: str | None = None
    page_torch: str | None = None
    page_verdict: str | None = Field(None, description="the verdict on the release the page names")
    newest_torch: str | None = None
    newest_verdict: str | None = Field(None, description="the verdict on the newest release")
    earlier_torch: str | None = None
    earlier_verdict: str | None = Field(None, description="the verdict on the release before the page's nightly "
                                                          "or source build, when the page's release did not "
                                                          "reproduce")
    boundary: str | None = Field(None, description="`last_old -> first_new`, when a bisection found it")
    bisect_status: str | None = None
    blame: list[str] = Field(default_factory=list, description="what flips the verdict at the boundary")
    failed_differently: bool = Field(False, description="a run failed, but not with the page's failure")
    no_oracle: bool = Field(False, description="the page showed no failure to check: the expectation is the "
                                               "default (the script exits non-zero), so read the verdict with care")
    answer: list[str] = Field(default_factory=list)
    comment: str | None = Field(None, description="comment.md of the issue's triage, ready to paste")


class BatchSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["triage-batch"] = "triage-batch"
    schema_version: int = 1
    updated: str
    folder: str
    total: int
    finished: int
    issues: list[IssueSummary]
    exit_code: int = Field(description="the batch's exit code (lab.core.exitcodes): 0 when every issue "
                                       "reached a verdict, else 3 if any met an infrastructure failure, else 2")


# ----------------------------------------------------------------------------- the batch

def batch_folder(runs_root: Path, sources: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(sorted(sources)).encode()).hexdigest()[:12]
    return runs_root / "triage" / f"batch-{digest}"


def run_batch(sources: list[str], runs_root: Path, runner: Runner, *, folder: Path | None = None,
              note: Callable[[str, str], None] = lambda source, msg: None) -> BatchSummary:
    """Triage every page (those finished and unchanged are reused), with `runner` doing the rest;
    the summary is written into `folder` (default `<runs>/triage/batch-<hash of the list>`) after
    each issue and returned."""
    folder = folder or batch_folder(runs_root, sources)
    jobs = [TriageJob(s, triage_folder(runs_root, s), i) for i, s in enumerate(sources)]
    rows: dict[int, IssueSummary] = {}
    todo = []
    for job in jobs:
        state, why = finished(job)
        if state is not None:
            rows[job.index] = summarize(job, state, "reused", codes.OK)
            note(job.source, "finished earlier and unchanged: reused")
        else:
            note(job.source, why)
            todo.append(job)
    lock = threading.Lock()
    summary = _write(folder, jobs, rows)
    for outcome in runner(todo):
        job = outcome.job
        state = TriageState.load(job.folder / STATE_FILE, job.source)
        status = _status(outcome.exit_code)
        with lock:
            rows[job.index] = summarize(job, state, status, outcome.exit_code, outcome.error, outcome.engine)
            summary = _write(folder, jobs, rows)
        note(job.source, f"{status}" + (f": {outcome.error}" if outcome.error else ""))
    return summary


def finished(job: TriageJob) -> tuple[TriageState | None, str]:
    """The job's earlier triage when it finished and its scenario still gives the same content keys;
    else None and why it (re)runs."""
    state = TriageState.load(job.folder / STATE_FILE, job.source)
    if state.page_run is None or state.comment is None:
        return None, "not triaged yet" if state.scenario is None else "triage not finished: it goes on"
    if not state.scenario or not Path(state.scenario).is_file():
        return None, "its scenario is gone: triaged again"
    try:
        scenario = load_scenario(state.scenario)
        arch = scenario.arch[0].value
        for step in (state.page_run, state.earlier_run, state.newest_run):
            if step is None or step.key is None:
                continue
            if why := content_key(resolve(scenario, torch=step.torch, arch=arch)).differs(step.key, step.parts):
                return None, f"torch {step.torch} runs again: {why}"
    except Exception as e:  # a scenario edited into an invalid one: its triage says so
        return None, f"its scenario no longer loads ({type(e).__name__}): triaged again"
    return state, ""


def summarize(job: TriageJob, state: TriageState, status: str, code: int, error: str = "",
              engine: str | None = None) -> IssueSummary:
    page, new, bis = state.page_run, state.newest_run, state.bisect
    boundary = f"{bis.last_old} -> {bis.first_new}" if bis and bis.status == "found" else None
    blame = [f"{b.get('package')} {b.get('old')} -> {b.get('new')}" for b in (bis.blame if bis else [])]
    if bis and bis.blame_fix == "torch alone":
        blame = ["torch alone"]
    early = state.earlier_run
    verdicts = {s.verdict for s in (page, new, early) if s is not None}
    comment = job.folder / "comment.md"
    return IssueSummary(
        source=job.source, folder=str(job.folder), status=status, exit_code=code, error=error or None,
        scenario=state.name, upstream=state.upstream, engine=engine,
        page_torch=page.torch if page else None, page_verdict=page.verdict if page else None,
        newest_torch=new.torch if new else None, newest_verdict=new.verdict if new else None,
        earlier_torch=early.torch if early else None, earlier_verdict=early.verdict if early else None,
        boundary=boundary, bisect_status=bis.status if bis else None, blame=blame,
        failed_differently="failed_differently" in verdicts, no_oracle=_no_oracle(state),
        answer=summary_lines(state) if page else [], comment=str(comment) if comment.is_file() else None)


def _no_oracle(state: TriageState) -> bool:
    """Whether the scenario's expectation is the inference's default (the page showed no failure)."""
    if not state.scenario:
        return False
    yaml_path = Path(state.scenario)
    name = state.name or yaml_path.stem
    for stem in (name, name.removesuffix("-cpu")):
        report = yaml_path.with_name(f"{stem}.from-issue.json")
        try:
            facts = json.loads(report.read_text(encoding="utf-8")).get("facts", [])
        except (OSError, ValueError):
            continue
        return any(f.get("name") == "expect" and f.get("default") for f in facts)
    return False


def _status(code: int) -> str:
    return {codes.OK: "done", codes.BAD_INPUT: "bad_input", codes.INFRASTRUCTURE: "infrastructure",
            codes.INTERRUPTED: "interrupted"}.get(code, "failed")


def batch_exit(rows: Iterable[IssueSummary]) -> int:
    found = {r.exit_code for r in rows}
    if found <= {codes.OK}:
        return codes.OK
    if codes.INTERRUPTED in found:
        return codes.INTERRUPTED
    if codes.INFRASTRUCTURE in found or codes.INTERNAL in found:
        return codes.INFRASTRUCTURE
    return codes.BAD_INPUT


def _write(folder: Path, jobs: list[TriageJob], rows: dict[int, IssueSummary]) -> BatchSummary:
    issues = [rows.get(j.index) or IssueSummary(source=j.source, folder=str(j.folder), status="interrupted",
                                                exit_code=codes.INTERRUPTED, error="not finished yet")
              for j in jobs]
    summary = BatchSummary(updated=datetime.now(timezone.utc).isoformat(timespec="seconds"), folder=str(folder),
                           total=len(jobs), finished=len(rows), issues=issues,
                           exit_code=batch_exit(rows.values()) if len(rows) == len(jobs) else codes.INTERRUPTED)
    folder.mkdir(parents=True, exist_ok=True)
    texts = ((SUMMARY_JSON, summary.model_dump_json(indent=2) + "\n"), (SUMMARY_MD, summary_markdown(summary)))
    for name, text in texts:
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, folder / name)
    return summary


def summary_markdown(summary: BatchSummary) -> str:
    def cell(text: object) -> str:
        return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")
    out = ["# Triage of many issues", "",
           f"{summary.finished} of {summary.total} issues finished (updated {summary.updated}).", "",
           "| issue | status | on its release | on the newest | boundary | blame | notes |",
           "|---|---|---|---|---|---|---|"]
    for r in summary.issues:
        notes = []
        if r.failed_differently:
            notes.append("failed differently")
        if r.no_oracle:
            notes.append("no oracle (the page showed no failure)")
        if r.earlier_verdict:
            notes.append(f"the release before the page's build: {r.earlier_verdict} ({r.earlier_torch})")
        if r.error:
            notes.append(r.error[:200])
        page = f"{r.page_verdict} ({r.page_torch})" if r.page_verdict else ""
        new = f"{r.newest_verdict} ({r.newest_torch})" if r.newest_verdict else ""
        out.append(f"| {cell(r.upstream or r.source)} | {r.status} | {cell(page)} | {cell(new)} | "
                   f"{cell(r.boundary or r.bisect_status or '')} | {cell(', '.join(r.blame))} | "
                   f"{cell('; '.join(notes))} |")
    named = [(w, [r for r in summary.issues if getattr(r, f)]) for w, f in
             (("Failed differently (a run failed, but not with the page's failure)", "failed_differently"),
              ("No oracle (the page showed no failure; the expectation is the default exit code)", "no_oracle"))]
    for words, rows in named:
        if rows:
            out += ["", f"**{words}:** " + ", ".join(r.upstream or r.source for r in rows)]
    for r in summary.issues:
        if r.answer:
            out += ["", f"## {r.upstream or r.source}", "", *[f"- {a}" for a in r.answer],
                    *([f"- comment: `{r.comment}`"] if r.comment else [])]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- the local runner

@dataclass
class LocalRunner:
    """`lab triage SOURCE` child processes, at most `parallel` at once; with several engines, each
    job gets the engine with the fewest jobs running (its `--engine`), so engines work in parallel."""

    runs_root: Path
    scenarios: Path
    parallel: int
    engines: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    on_start: Callable[[TriageJob, str | None], None] = lambda job, engine: None

    def __call__(self, jobs: list[TriageJob]) -> Iterator[JobOutcome]:
        busy = {e: 0 for e in self.engines}
        lock = threading.Lock()

        def one(job: TriageJob) -> JobOutcome:
            with lock:
                engine = min(busy, key=lambda e: busy[e]) if busy else None
                if engine is not None:
                    busy[engine] += 1
            self.on_start(job, engine)
            try:
                return self._run(job, engine)
            finally:
                if engine is not None:
                    with lock:
                        busy[engine] -= 1
        with ThreadPoolExecutor(max_workers=max(1, self.parallel)) as pool:
            pending: set[Future] = {pool.submit(one, job) for job in jobs}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        yield fut.result()
            finally:
                for fut in pending:
                    fut.cancel()

    def _run(self, job: TriageJob, engine: str | None) -> JobOutcome:
        command = [sys.executable, "-m", "lab", "-q", "triage", job.source, "--out", str(self.runs_root),
                   "--output", str(self.scenarios), "--json", *self.extra_args]
        if engine is not None:
            command += ["--engine", engine]
        job.folder.mkdir(parents=True, exist_ok=True)
        with open(job.folder / "triage.log", "w", encoding="utf-8") as log:
            proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                  env={**os.environ, "COLUMNS": "200"})
        return _outcome(job, proc.returncode, engine)


def local_runner(runs_root: Path, scenarios: Path, parallel: int, engines: list[str] | None = None,
                 extra_args: list[str] | None = None,
                 on_start: Callable[[TriageJob, str | None], None] = lambda job, engine: None) -> Runner:
    return LocalRunner(runs_root, scenarios, parallel, list(engines or []), list(extra_args or []), on_start)


# ----------------------------------------------------------------------------- on Slurm: one array

@dataclass
class SlurmRunner:
    """The whole batch as one `sbatch --array` on a partition: task i runs `lab triage SOURCE_i` on its
    node, with the node's local engine, writing its triage folder on the shared runs folder as a local
    child does. The lab follows the tasks through `squeue`; a task that ends without its exit code
    (a node failure, a preemption, a cancel by someone else) is an infrastructure failure for that
    issue, never a verdict. Closing the generator (Ctrl-C) cancels the array."""

    runs_root: Path
    scenarios: Path
    partition: str
    extra_args: list[str] = field(default_factory=list)
    on_start: Callable[[TriageJob, str | None], None] = lambda job, engine: None
    cpus_per_task: int = 2

    def __call__(self, jobs: list[TriageJob]) -> Iterator[JobOutcome]:
        if not jobs:
            return
        work = self.runs_root / ".slurm" / f"triage-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)
        work.chmod(0o700)  # the task script is code to the node's lab: the user's alone
        (work / "sources.txt").write_text("".join(f"{job.source}\n" for job in jobs), encoding="utf-8")
        for job in jobs:
            job.folder.mkdir(parents=True, exist_ok=True)
        folders = work / "folders.txt"
        folders.write_text("".join(f"{job.folder}\n" for job in jobs), encoding="utf-8")
        command = [sys.executable, "-m", "lab", "-q", "triage", "--out", str(self.runs_root),
                   "--output", str(self.scenarios), "--json", "--engine", "local", *self.extra_args]
        script = work / "task.sh"
        script.write_text(
            "#!/bin/sh\n# one issue of the batch: line SLURM_ARRAY_TASK_ID+1 of sources.txt\n"
            f"cd {shlex.quote(str(work))} || exit 3\n"
            'n=$((SLURM_ARRAY_TASK_ID + 1))\n'
            'source=$(sed -n "${n}p" sources.txt)\n'
            'folder=$(sed -n "${n}p" folders.txt)\n'
            f'{shlex.join(command)} "$source" >/dev/null 2>"$folder/triage.log"\n'
            'code=$?\n'
            'echo "$code" > "exit-$SLURM_ARRAY_TASK_ID.tmp" && mv "exit-$SLURM_ARRAY_TASK_ID.tmp" '
            '"exit-$SLURM_ARRAY_TASK_ID"\n', encoding="utf-8")
        script.chmod(0o700)
        job_id = slurm_command(["sbatch", "--parsable", f"--array=0-{len(jobs) - 1}", f"--partition={self.partition}",
                                "--job-name=lab-triage", f"--chdir={work}", f"--output={work}/slurm-%A_%a.out",
                                f"--cpus-per-task={self.cpus_per_task}", "--requeue", "--export=ALL", str(script)],
                               "sbatch").strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {job_id!r}, not a job id.")
        where = f"slurm:{self.partition} job {job_id}"
        for job in jobs:
            self.on_start(job, f"{where}_{jobs.index(job)}")
        left = dict(enumerate(jobs))
        gone_since: float | None = None
        try:
            while left:
                try:
                    states = parse_squeue(slurm_command(["squeue", "-h", "-r", "-j", job_id, "--states=all",
                                                         "-o", "%i|%T|%N|%r"], "squeue"))
                except SlurmError:
                    states = {}
                for index in sorted(left):
                    exit_file = work / f"exit-{index}"
                    state = states.get(index)
                    if exit_file.is_file() and (state is None or state.state in TERMINAL):
                        yield _outcome(left.pop(index), int(exit_file.read_text().strip() or 3), where)
                    elif state is not None and state.state in TERMINAL and not exit_file.is_file():
                        time.sleep(POLL_S)  # the shared filesystem may show the file a moment late
                        if not exit_file.is_file():
                            job = left.pop(index)
                            yield JobOutcome(job, codes.INFRASTRUCTURE, f"Slurm job {job_id}_{index} ended "
                                             f"{state.state} on {state.node} before its triage finished: an "
                                             "infrastructure failure, not a verdict", where)
                if not states and left:
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > 30:  # squeue forgot them without an exit code
                        for index in sorted(left):
                            yield JobOutcome(left.pop(index), codes.INFRASTRUCTURE,
                                             f"Slurm job {job_id}_{index} is no longer known to squeue and "
                                             "left no exit code", where)
                else:
                    gone_since = None
                if left:
                    time.sleep(POLL_S)
        finally:
            if left:  # Ctrl-C, or the caller stopped early: nothing of the batch keeps running
                subprocess.run(["scancel", job_id], capture_output=True, timeout=20)


def _outcome(job: TriageJob, code: int, where: str | None) -> JobOutcome:
    """A `lab triage` child's end: its exit code and, unless 0, the last error paragraph of its log."""
    error = ""
    if code != 0:
        lines = (job.folder / "triage.log").read_text(encoding="utf-8", errors="replace").splitlines() \
            if (job.folder / "triage.log").is_file() else []
        starts = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
        error = " ".join(x.strip() for x in lines[starts[-1]:])[6:].strip()[:1000] if starts else \
            f"exit {code} (see {job.folder / 'triage.log'})"
    return JobOutcome(job, code, error, where)


def slurm_runner(runs_root: Path, scenarios: Path, partition: str, extra_args: list[str] | None = None,
                 on_start: Callable[[TriageJob, str | None], None] = lambda job, engine: None) -> Runner:
    return SlurmRunner(runs_root, scenarios, partition, list(extra_args or []), on_start)
