"""`lab triage SOURCE`: from-issue, a run on the page's version and arch, a run on the newest release
for that arch when it reproduced, a bisection when the two verdicts differ, then the comparison of the
boundary and a comment ready to paste. When the page ran a nightly or a source build and the release
that first shipped its code does not reproduce, the release before it runs too: the fix may have landed
after the page's build and before that release, leaving the bug in the release before only; when that one
reproduces, the bisection is between the two. Each step is recorded in `triage.json` as it ends, so a second
`lab triage` with the same source and folder goes on where the first stopped. A run step is reused only
while its content key (lab.image.casekey) is the one the scenario gives now: after an edit of the
scenario (its expect, script, vars...) the run and every step after it run again, and the note says why.

The steps are callables handed in by the CLI (a run, a bisection, the newest release, the comparison),
so tests drive the whole chain with fakes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.compare.comment import relative_paths, render_comment
from lab.compare.diff import boundary_pair, compare_runs
from lab.core.errors import LabError
from lab.core.scrub import scrub_text
from lab.image.casekey import content_key
from lab.image.resolve import check_deps, resolve
from lab.report.writer import render
from lab.scenario.lookup import load_scenario

__all__ = ["RunStep", "BisectStep", "TriageState", "compare_seam", "run_triage", "summary_lines"]

STATE_FILE = "triage.json"
STATE_FORMAT = 1


@dataclass
class RunStep:
    torch: str
    arch: str
    verdict: str
    reason: str = ""
    run_dir: str | None = None
    key: str | None = None              # the run's content key (lab.image.casekey): reused only while it holds
    parts: dict[str, str] | None = None


@dataclass
class BisectStep:
    status: str
    last_old: str | None = None
    first_new: str | None = None
    folder: str | None = None
    summary: str = ""
    blame: list = field(default_factory=list)   # [{package, old, new}] (lab.drivers.blame); torch alone: torch
    blame_fix: str | None = None
    blame_summary: str = ""             # the blame step's answer, or why there is none ("not known: ...")


@dataclass
class TriageState:
    source: str
    scenario: str | None = None        # the YAML the lab runs (the CPU variant of a GPU page)
    name: str | None = None
    upstream: str | None = None
    page_run: RunStep | None = None
    newest_run: RunStep | None = None
    bisect: BisectStep | None = None
    earlier: str | None = None         # the release before the page's nightly or source build (lab.issue.infer)
    earlier_run: RunStep | None = None
    compare: dict = field(default_factory=dict)
    comment: str | None = None
    format: int = STATE_FORMAT

    @classmethod
    def load(cls, path: Path, source: str) -> TriageState:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(source=source)
        if data.get("format") != STATE_FORMAT or data.get("source") != source:
            return cls(source=source)
        state = cls(source=source, scenario=data.get("scenario"), name=data.get("name"),
                    upstream=data.get("upstream"), compare=data.get("compare") or {}, comment=data.get("comment"),
                    earlier=data.get("earlier") if isinstance(data.get("earlier"), str) else None)
        for key, kind in (("page_run", RunStep), ("newest_run", RunStep), ("bisect", BisectStep),
                          ("earlier_run", RunStep)):
            if isinstance(data.get(key), dict):
                setattr(state, key, kind(**data[key]))
        return state

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".triage.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)
        os.replace(tmp, path)


Run = Callable[[str, str, str], RunStep]                  # (scenario yaml, torch, arch)
Bisect = Callable[[str, str, str, str], BisectStep]       # (scenario yaml, old, new, arch)
Compare = Callable[[TriageState], dict]


def run_triage(state: TriageState, folder: Path, *, make_scenario: Callable[[], tuple[str, str, str | None, str, str]],
               run: Run, bisect: Bisect, newest: Callable[[str], str], compare: Compare,
               note: Callable[[str, str], None] = lambda step, msg: None, deps: str | None = None) -> TriageState:
    """Every step not yet in `state`, saving it after each. `make_scenario` gives (yaml, name,
    upstream, torch, arch) of the written scenario, and may add the release before the page's nightly or
    source build (lab.issue.infer's `earlier`). `deps` (`--deps`) overrides the scenario's."""
    path = folder / STATE_FILE
    if state.scenario is None or not Path(state.scenario).is_file():
        yaml_path, name, upstream, torch, arch, *more = make_scenario()
        state.scenario, state.name, state.upstream = yaml_path, name, upstream
        state.earlier = more[0] if more and more[0] != torch else None
        state.page_run = state.newest_run = state.bisect = state.earlier_run = None
        state.save(path)
        note("from-issue", f"wrote {yaml_path} (torch {torch}, {arch})")
    else:
        note("from-issue", f"{state.scenario} (from the earlier triage)")
    scenario = load_scenario(state.scenario)
    if deps is not None:
        scenario = scenario.model_copy(update={"deps": check_deps(deps)})
    torch, arch = scenario.torch[0], scenario.arch[0].value

    def key(version: str):
        return content_key(resolve(scenario, torch=version, arch=arch))

    def keyed(step: RunStep, version: str) -> RunStep:
        """The step with the content key of the case it ran (the run's own, else the one taken now)."""
        if step.key is None:
            wanted = key(version)
            step.key, step.parts = wanted.digest, dict(wanted.parts)
        return step

    def stale(step: RunStep | None, version: str) -> str | None:
        """Why a recorded run no longer holds (the content key of its case changed), or None."""
        return key(version).differs(step.key, step.parts) if step is not None else None

    if state.page_run is not None and (why := stale(state.page_run, state.page_run.torch)):
        note("run", f"torch {state.page_run.torch} runs again: {why}")  # and every step after it
        state.page_run = state.newest_run = state.bisect = state.earlier_run = None
    if state.page_run is None:
        note("run", f"the page's case: torch {torch}, {arch}")
        state.page_run = keyed(run(state.scenario, torch, arch), torch)
        state.save(path)
    else:
        note("run", f"torch {torch}: {state.page_run.verdict} (from the earlier triage)")
    if state.page_run.verdict == "not_reproduced" and state.earlier:
        # The page ran a nightly or a source build, and the release that first shipped its code does not
        # reproduce: the release before it runs, and when it reproduces, the bisection is between the two
        # (the fix landed before the later one). A run of another kind there bisects nothing.
        earlier = state.earlier
        if why := stale(state.earlier_run, earlier):
            note("run", f"torch {earlier} runs again: {why}")
            state.earlier_run = state.bisect = None
        if state.earlier_run is None:
            note("run", f"not reproduced on torch {torch}, the first release with the page's build's code; "
                        f"the release before it: torch {earlier}")
            state.earlier_run = keyed(run(state.scenario, earlier, arch), earlier)
            state.save(path)
        else:
            note("run", f"torch {earlier}: {state.earlier_run.verdict} (from the earlier triage)")
        if state.earlier_run.verdict == "reproduced" and state.bisect is None:
            note("bisect", f"between {earlier} and {torch}")
            state.bisect = bisect(state.scenario, earlier, torch, arch)
            state.save(path)
        return _finish(state, path, compare)
    if state.page_run.verdict != "reproduced":
        return _finish(state, path, compare)
    latest = newest(arch)
    if state.newest_run is not None and state.newest_run.torch == latest and (why := stale(state.newest_run, latest)):
        note("run", f"torch {latest} runs again: {why}")
        state.newest_run = state.bisect = None
    if state.newest_run is None or state.newest_run.torch != latest:
        if latest == state.page_run.torch:
            state.newest_run = state.page_run
        else:
            note("run", f"the newest release for {arch}: torch {latest}")
            state.newest_run = keyed(run(state.scenario, latest, arch), latest)
        state.save(path)
    # Only a run that says the bug is gone is a fix to bisect toward: a failure of another kind on the
    # newest release (failed_differently: an API it removed, another exception) makes a boundary that is
    # not the bug's, and error or timeout say nothing (issue 28).
    if state.newest_run.verdict != "not_reproduced" or state.newest_run.torch == state.page_run.torch:
        return _finish(state, path, compare)
    if state.bisect is None:
        note("bisect", f"between {state.page_run.torch} and {state.newest_run.torch}")
        state.bisect = bisect(state.scenario, state.page_run.torch, state.newest_run.torch, arch)
        state.save(path)
    return _finish(state, path, compare)


def _finish(state: TriageState, path: Path, compare: Compare) -> TriageState:
    state.compare = compare(state)
    state.comment = comment_text(state)
    state.save(path)
    (path.parent / "comment.md").write_text(state.comment, encoding="utf-8")
    return state


def compare_seam(runner: Callable[[str, str], dict] | None = None) -> Compare:
    """The compare and comment step. By default it is `lab compare`'s and `lab comment`'s: the
    bisection's boundary pair compared (or the page's run against the newest release's when there is
    no bisection folder), and the comment `lab comment` writes for the bisection folder. A `runner`
    (old run folder, new run folder) -> {"text", "comment"} stands in for it in tests of the chain."""
    def step(state: TriageState) -> dict:
        pair = _pair(state)
        if pair is None or not (pair[0].run_dir and pair[1].run_dir):
            return {"available": None, "why": "nothing to compare: the triage has no two runs that differ"}
        older, newer = pair
        old = state.bisect.last_old if state.bisect and state.bisect.last_old else older.torch
        new = state.bisect.first_new if state.bisect and state.bisect.first_new else newer.torch
        if runner is not None:
            result = runner(older.run_dir, newer.run_dir)
            found = result if isinstance(result, dict) else {"text": str(result)}
            return {"available": True, "old": old, "new": new, **found}
        return {"old": old, "new": new, **_lab_compare(state, Path(older.run_dir), Path(newer.run_dir))}
    return step


def _pair(state: TriageState) -> tuple[RunStep, RunStep] | None:
    """The two runs of the triage on two releases, older first: the release before the page's nightly
    and the page's release, or the page's release and the newest."""
    page = state.page_run
    if page is None:
        return None
    if state.earlier_run is not None:
        return state.earlier_run, page
    if state.newest_run is not None and state.newest_run is not page:
        return page, state.newest_run
    return None


def _lab_compare(state: TriageState, older: Path, newer: Path) -> dict:
    """The bisection's boundary pair compared, with `lab comment`'s comment; else the two runs given."""
    folder = Path(state.bisect.folder) if state.bisect and state.bisect.folder else None
    try:
        if folder is not None and (folder / "bisect.json").is_file():
            a, b = boundary_pair(folder)
            comment = render_comment(folder)
        else:
            a, b, comment = older, newer, None
        text = "\n".join(compare_runs(a, b).summary)
    except (LabError, OSError) as e:
        return {"available": False, "why": f"the comparison could not be made: {e}"}
    found = {"available": True, "a": str(a), "b": str(b), "text": text}
    return {**found, "comment": comment} if comment else found


def summary_lines(state: TriageState) -> list[str]:
    """The answer in plain words: reproduced or not, where, fixed or not, in which release."""
    page = state.page_run
    if page is None:
        return ["not run yet"]
    where = f"torch {page.torch} on {page.arch}"
    if page.verdict != "reproduced":
        first = f"{_word(page.verdict)} on {where}, the version the page names: {page.reason}".rstrip(": ")
        early = state.earlier_run
        if early is None:
            return [first, "Nothing to bisect: the triage stops here."]
        if early.verdict != "reproduced":
            either = " either" if early.verdict == "not_reproduced" else ""
            return [first, f"{_word(early.verdict)} on torch {early.torch}{either}, the release before it (the "
                           f"page ran a nightly or a source build): {early.reason}".rstrip(": "),
                    "Nothing to bisect: the triage stops here."]
        lines = [first, f"Reproduced on torch {early.torch}, the release before it: the page ran a nightly or a "
                        f"source build, so the bug shipped in torch {early.torch} and was fixed before torch "
                        f"{page.torch}."]
        return lines + _bisect_lines(state.bisect)
    lines = [f"Reproduced on {where}, the version the page names."]
    new = state.newest_run
    if new is None:
        return lines
    if new is page:
        lines.append(f"torch {page.torch} is the newest release for {page.arch}: still present there, not fixed.")
        return lines
    if new.verdict == "reproduced":
        lines.append(f"Still reproduced on torch {new.torch}, the newest release for {new.arch}: NOT fixed.")
    elif new.verdict == "not_reproduced":
        lines.append(f"Not reproduced on torch {new.torch}, the newest release for {new.arch}: fixed.")
        lines += _bisect_lines(state.bisect)
    elif new.verdict == "failed_differently":
        lines.append(f"Failed differently on torch {new.torch}, the newest release for {new.arch} ({new.reason}): "
                     "not the page's failure and not a fix, so fixed or not is unknown and nothing is bisected.")
    else:
        lines.append(f"No verdict on torch {new.torch} ({new.verdict}: {new.reason}), so fixed or not is unknown.")
    return lines


def _bisect_lines(b: BisectStep | None) -> list[str]:
    """The bisection's boundary and what flips it, or why it found none."""
    if b is None:
        return []
    if b.status != "found" or not b.first_new:
        return [f"The bisection did not find the release: {b.status}. {b.summary}".strip()]
    lines = [f"Fixed in torch {b.first_new} (last release with the bug: {b.last_old})."]
    if b.blame_fix:
        lines.append("What flips it: " + ("torch alone." if b.blame_fix == "torch alone" else
                     ", ".join(f"{x['package']} {x['old']} → {x['new']}" for x in b.blame)
                     + f", not torch ({b.blame_fix})."))
    elif b.blame_summary.startswith("not known"):
        lines.append(f"What flips it, torch or its dependencies: {b.blame_summary}.")
    return lines


def _word(verdict: str) -> str:
    return {"not_reproduced": "NOT reproduced", "error": "no verdict (error)", "timeout": "no verdict (timeout)",
            "failed_differently": "Failed differently (not the page's failure)"}.get(verdict, verdict)


def comment_text(state: TriageState) -> str:
    """A comment for the upstream issue: the answer, the runs, and how to repeat them. It names no
    path of the user's (issue 33): folders under the runs folder relative to it (as `lab comment`
    does), a saved page by its file's name, the home folder as `~`."""
    text = _comment_text(state)
    for step in (state.page_run, state.earlier_run, state.newest_run):
        if step is not None and step.run_dir:
            text = relative_paths(text, Path(step.run_dir))
    return scrub_text(text)


def _source_name(source: str) -> str:
    """An issue's URL as it is; a saved page by its file's name."""
    return source if "://" in source else Path(source).name


@dataclass(frozen=True)
class TriageView:
    """What the triage comment (lab/report/templates/triage.md.j2) is laid out from."""

    summary: tuple[str, ...]
    runs: tuple[RunStep, ...]
    boundary: tuple[str, str] | None      # last old, first new
    compare_comment: str | None           # `lab comment` of the boundary, pasted
    compare_text: str | None              # else the comparison's text
    compare_why: str | None               # else why there is none
    source: str


def _comment_text(state: TriageState) -> str:
    runs = [state.page_run, state.earlier_run, state.newest_run if state.newest_run is not state.page_run else None]
    b, cmp = state.bisect, state.compare or {}
    available = bool(cmp.get("available"))
    return render("triage.md.j2", TriageView(
        summary=tuple(summary_lines(state)), runs=tuple(step for step in runs if step),
        boundary=(str(b.last_old), str(b.first_new)) if b and b.status == "found" else None,
        compare_comment=str(cmp["comment"]) if available and cmp.get("comment") else None,
        compare_text=str(cmp["text"]) if available and cmp.get("text") else None,
        compare_why=str(cmp["why"]) if cmp.get("why") else None, source=_source_name(state.source)))
