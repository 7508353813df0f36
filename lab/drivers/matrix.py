"""Scenario x (torch versions) x (arches) -> cells; `-k` selection; repeated runs -> a rate.

Pure logic: the CLI hands `run_matrix` a function that runs one case (pipeline.run_case in
production), so this module is unit-tested with a fake runner and without Docker.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from lab.core.errors import RunLost, ScenarioError
from lab.core.results import (
    FailureSignature,
    FailureSignatures,
    MatrixCell,
    MatrixResult,
    MatrixRun,
    RunResult,
    Verdict,
)
from lab.drivers.parallel import run_all
from lab.image.resolve import Case, resolve
from lab.report.html import write_matrix_html
from lab.scenario.model import Scenario


def split_list(value: str | None, option: str) -> list[str] | None:
    """'2.5.1,2.9.1 , 2.10.0' -> ['2.5.1', '2.9.1', '2.10.0']; duplicates and empty items are errors."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if any(not v for v in items):
        raise ScenarioError(f"{option} {value!r} has an empty item; separate values with commas.", field=option)
    seen: set[str] = set()
    for v in items:
        if v in seen:
            raise ScenarioError(f"{option} names {v} twice.", field=option)
        seen.add(v)
    return items


def expand(scenario: Scenario, torch: list[str] | None = None, arch: list[str] | None = None,
           backend: str | None = None, sets: dict[str, str] | None = None,
           mode: str | None = None) -> list[Case]:
    """Every (torch, arch) cell: the given lists, else every value the scenario pins. Version-major order."""
    versions = torch or list(scenario.torch)
    arches = arch or [a.value for a in scenario.arch]
    return [resolve(scenario, torch=v, arch=a, backend=backend, sets=sets, mode=mode)
            for v in versions for a in arches]


# --- -k: pytest-style selection on cell names ----------------------------------
_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def select(cases: Iterable[Case], expression: str | None) -> list[Case]:
    """Keep the cells whose name matches `expression`: substrings joined by `and`, `or`, `not`
    and parentheses, as in pytest's -k (`-k "arch=arm64 and not 2.5.1"`)."""
    cases = list(cases)
    if not expression:
        return cases
    matcher = _parse_k(expression)
    return [c for c in cases if matcher(c.name)]


def _parse_k(expression: str) -> Callable[[str], bool]:
    tokens = _TOKEN.findall(expression)
    pos = 0

    def bad(why: str) -> ScenarioError:
        return ScenarioError(f"-k {expression!r}: {why}.", field="-k",
                             hint='Use substrings of cell names with and/or/not, e.g. -k "arch=arm64 and not 2.5.1".')

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def or_expr() -> Callable[[str], bool]:
        left = and_expr()
        while peek() == "or":
            take()
            right = and_expr()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def and_expr() -> Callable[[str], bool]:
        left = not_expr()
        while peek() == "and":
            take()
            right = not_expr()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def not_expr() -> Callable[[str], bool]:
        if peek() == "not":
            take()
            inner = not_expr()
            return lambda s: not inner(s)
        return atom()

    def atom() -> Callable[[str], bool]:
        token = peek()
        if token is None:
            raise bad("it ends where a name was expected")
        if token == "(":
            take()
            inner = or_expr()
            if peek() != ")":
                raise bad("a parenthesis is not closed")
            take()
            return inner
        if token in (")", "and", "or"):
            raise bad(f"unexpected {token!r}")
        word = take()
        return lambda s: word in s

    matcher = or_expr()
    if pos != len(tokens):
        raise bad(f"unexpected {tokens[pos]!r}")
    return matcher


# --- running ------------------------------------------------------------------
@dataclass(frozen=True)
class LostRun:
    """A run its infrastructure ended before its outcome (RunLost: a Slurm task's node failed, it was
    preempted or cancelled by someone else): the cell's `error` with the reason, never a verdict about
    the bug; `run_dir` is what is left of it (the task's Slurm log)."""

    reason: str
    run_dir: str
    verdict: Verdict = Verdict.ERROR
    signature: None = None


@dataclass
class Cell:
    case: Case
    results: list[RunResult | LostRun] = field(default_factory=list)  # one per repeat

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def verdicts(self) -> list[str]:
        return [r.verdict.value for r in self.results]

    @property
    def reproduced(self) -> int:
        return self.verdicts.count("reproduced")

    @property
    def runnable(self) -> int:
        """Runs that reached a verdict about the bug (reproduced or not)."""
        return sum(v in ("reproduced", "not_reproduced") for v in self.verdicts)

    @property
    def verdict(self) -> str:
        """One word for the cell: the verdict when every run agrees, else `flaky`."""
        verdicts = set(self.verdicts)
        if not verdicts:
            return "not_run"
        if len(verdicts) == 1:
            return verdicts.pop()
        if verdicts <= {"reproduced", "not_reproduced"}:
            return "flaky"
        return "mixed"

    @property
    def rate(self) -> float | None:
        """Reproduction rate among the runs that reached a verdict about the bug."""
        return self.reproduced / self.runnable if self.runnable else None

    def rate_words(self) -> str:
        if self.rate is None:
            return f"0/{len(self.results)} runs reached a verdict"
        return f"{self.reproduced}/{self.runnable} reproduced ({self.rate:.0%})"

    def record(self) -> MatrixCell:
        return MatrixCell(cell=self.name, torch=self.case.torch, arch=self.case.arch.value,
                          backend=self.case.backend, verdict=self.verdict, repeat=len(self.results),
                          reproduced=self.reproduced, runnable=self.runnable,
                          rate=None if self.rate is None else round(self.rate, 4),
                          runs=tuple(MatrixRun(verdict=r.verdict, run_dir=r.run_dir, reason=r.reason)
                                     for r in self.results))


def run_matrix(cases: list[Case], run_one: Callable[[Case, int], RunResult], repeat: int = 1,
               on_result: Callable[[Cell, RunResult | LostRun], None] | None = None, *, workers: int = 1,
               on_interrupt: Callable[[], None] = lambda: None) -> list[Cell]:
    """Run each case `repeat` times (`run_one(case, i)` runs it once and returns its result),
    `workers` runs at once; each cell's results stay in the order of its repeats. A run lost to its
    infrastructure (`run_one` raises RunLost) is recorded as that run's `error` and the others go on."""
    if repeat < 1:
        raise ScenarioError(f"--repeat must be 1 or more, not {repeat}.", field="--repeat")
    cells = [Cell(c) for c in cases]
    tasks = [(cell, i) for cell in cells for i in range(repeat)]
    lock = threading.Lock()

    def one(task: tuple[Cell, int]) -> RunResult:
        cell, i = task
        result: RunResult | LostRun
        try:
            result = run_one(cell.case, i)
        except RunLost as exc:
            result = LostRun(reason=exc.message[:400], run_dir=exc.where)
        if on_result:
            with lock:
                on_result(cell, result)
        return result

    for (cell, _), result in zip(tasks, run_all(tasks, one, workers, on_interrupt), strict=True):
        cell.results.append(result)
    if cells and cells[0].case.scenario.expect.exit_code_only:
        hold_to_first_signature(cells)
    return cells


def hold_to_first_signature(cells: list[Cell]) -> tuple[FailureSignature, str] | None:
    """A scenario that expects only an exit code, where any failure would hold: the first run, in cell
    and repeat order, that reproduced with a signature (an exception and its torch frame, or a signal)
    sets the matrix's signature, and every other run that reproduced with another one becomes
    `failed_differently`, as PyTorch's minifier rejects a candidate that fails with another error.
    The signature and its run go into matrix.json (`signature`, `signature_from`)."""
    first = next(((r.signature, r.case) for c in cells for r in c.results
                  if r.verdict == Verdict.REPRODUCED and r.signature is not None), None)
    if first is None:
        return None
    signature, source = first
    for cell in cells:
        for i, r in enumerate(cell.results):
            if r.verdict != Verdict.REPRODUCED or signature.matches(r.signature):
                continue
            seen = "no exception and no signal" if r.signature is None else r.signature.words()
            cell.results[i] = r.model_copy(update={
                "verdict": Verdict.FAILED_DIFFERENTLY,
                "different_failure": FailureSignatures(expected=f"{signature.words()} (recorded from {source})",
                                                       observed=seen),
                "reason": (f"failed differently: exit code as expected, but {seen}, not the failure "
                           f"{source} recorded first ({signature.words()})")})
    return signature, source


def matrix_result(scenario: Scenario, cells: list[Cell]) -> MatrixResult:
    """`lab run --json` of a matrix."""
    kept = hold_to_first_signature(cells) if scenario.expect.exit_code_only else None
    return MatrixResult(scenario=scenario.name, cells=tuple(c.record() for c in cells),
                        signature=kept[0] if kept else None, signature_from=kept[1] if kept else None)


MATRIX_JSON = "matrix.json"


def write_matrix_folder(runs_root: Path, result: MatrixResult, now: datetime | None = None) -> Path:
    """runs/<scenario>/matrix-<timestamp>/ with matrix.json and report.html (the grid of cells, each
    linked to its last run's report); the returned result's `folder` names it."""
    now = now or datetime.now(timezone.utc)
    parent = runs_root / result.scenario
    parent.mkdir(parents=True, exist_ok=True)
    stem = f"matrix-{now:%Y%m%dT%H%M%SZ}"
    for n in range(1, 1000):
        folder = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free matrix folder name under {parent}")
    recorded = result.model_copy(update={"folder": str(folder)})
    recorded.write(folder / MATRIX_JSON)
    write_matrix_html(folder, recorded)
    return folder
