"""Verdicts a bisection may take from earlier runs instead of running them again (issue 34).

A `lab run`, a matrix cell, a triage's runs or another bisection's probes that ran the very case a
bisection is about to probe (the same content key: scenario, script, expect, vars and `--set`,
base, dependencies, the lab's templates and rules, torch and arch; lab.image.casekey) already hold
its answer. `earlier_verdicts` finds them through the run history (lab.history.index) and keeps
only those that are evidence this lab can stand behind:

- the folder carries the runs root's marker and it checks out (lab.core.runmarker): the lab made
  it at that very path under this runs root. A bundle unpacked by hand, a replay's `replayed/`
  folder or a folder copied or moved from elsewhere does not;
- neither the folder nor its result.json or evidence.json is a symbolic link;
- result.json is a finished run's (a RunResult) for this scenario, torch and arch, and records the
  content key the probe has now;
- its verdict says something about the bug (`reproduced`, `not_reproduced` or
  `failed_differently`): an `error` or a `timeout` may have been the machine's, so that release
  runs again;
- evidence.json, written beside it by the same run, records the same verdict: a result.json
  edited by hand to another verdict is not believed.

The newest folder that passes wins, unless earlier runs of the same case disagree (a flaky case, a
matrix with `--repeat`): then there is no one answer to take, and the release runs again. A folder
that does not pass is named with its reason, so the bisection can say why it ran a release again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lab.core.errors import LabError
from lab.core.results import RESULT_NAME, RunResult, parse_result
from lab.core.runmarker import marked_since, runs_key
from lab.history.index import RunIndex

__all__ = ["EVIDENCE_VERDICTS", "Earlier", "earlier_verdicts", "trusted_result"]

EVIDENCE_VERDICTS = ("reproduced", "not_reproduced", "failed_differently")
_EVIDENCE = "evidence.json"
_MAX_EVIDENCE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Earlier:
    """An earlier run a probe can stand on: its folder and its result."""

    run_dir: Path
    result: RunResult


def trusted_result(root: Path, run_dir: Path, *, scenario: str, torch: str, arch: str, digest: str,
                   key: bytes | None) -> RunResult | str:
    """The result of `run_dir` when it is valid evidence for the probe whose content key is `digest`
    (see the module's docstring), else why not, in words."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink() or any((run_dir / name).is_symlink() for name in (RESULT_NAME, _EVIDENCE)):
        return "a symbolic link"
    if marked_since(root, run_dir, key) is None:
        return "not a folder this lab made here (its marker is missing or does not check out)"
    file = run_dir / RESULT_NAME
    try:
        result = parse_result(file.read_bytes(), str(file))
    except (OSError, LabError) as exc:
        return f"its result.json cannot be read ({str(exc).splitlines()[0][:120]})"
    if not isinstance(result, RunResult):
        return "not a finished run"
    if (result.scenario, result.torch, result.arch.value if hasattr(result.arch, "value") else str(result.arch)) \
            != (scenario, torch, arch):
        return "another scenario, torch or arch"
    if result.content_key != digest:
        return "made from another content key"
    if result.verdict.value not in EVIDENCE_VERDICTS:
        return f"its verdict ({result.verdict.value}) says nothing about the bug"
    try:
        with open(run_dir / _EVIDENCE, "rb") as fh:
            recorded = json.loads(fh.read(_MAX_EVIDENCE_BYTES))
        judged = recorded["judgement"]["verdict"]
    except (OSError, ValueError, TypeError, KeyError):
        return "its evidence.json is missing or cannot be read"
    if judged != result.verdict.value:
        return f"its result.json says {result.verdict.value}, its evidence.json {judged}"
    return result


def earlier_verdicts(runs_root: Path, scenario: str, arch: str, wanted: dict[str, str], *,
                     exclude: Path | None = None) -> tuple[dict[str, Earlier], list[str]]:
    """For each torch release of `wanted` (release -> the content key its probe has now), the newest
    earlier run under `runs_root` that is valid evidence for it; and, in words, the folders of those
    releases that were not taken and why. Folders under `exclude` (the bisection's own, which its
    resume reads) are left out. A run history that cannot be read is a note, never an error: the
    releases then simply run."""
    found: dict[str, Earlier] = {}
    refused: list[str] = []
    root = Path(runs_root)
    try:
        entries = RunIndex(root).query(scenario=scenario, arch=arch)
    except (OSError, LabError) as exc:
        return {}, [f"the run history could not be read, so no earlier verdict is reused ({exc})"]
    key = runs_key(root, create=False)
    skip = Path(exclude).resolve() if exclude is not None else None
    disagree: set[str] = set()
    for entry in entries:  # newest first
        version = entry.torch
        if version not in wanted or version in disagree or entry.kind == "replay":
            continue
        where = Path(entry.path)
        if skip is not None and (where.resolve() == skip or skip in where.resolve().parents):
            continue
        answer = trusted_result(root, where, scenario=scenario, torch=version, arch=arch, digest=wanted[version],
                                key=key)
        if isinstance(answer, RunResult):
            if version not in found:
                found[version] = Earlier(where, answer)
            elif found[version].result.verdict != answer.verdict:  # flaky: no one answer to take
                newer = found.pop(version)
                refused.append(f"torch {version}: earlier runs of the same case disagree ({newer.run_dir}: "
                               f"{newer.result.verdict.value}, {where}: {answer.verdict.value}), so it runs again")
                disagree.add(version)
        elif answer != "made from another content key":  # another version of the scenario: not news
            refused.append(f"{where}: {answer}")
    return found, refused
