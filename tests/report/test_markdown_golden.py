"""ablation.md, localize.md, the paste-ready comment (`lab comment`) and the triage comment, byte for
byte (golden files in tests/data/reports/), from real records in tests/data/compare and the shipped
scenarios. They were captured before these writers moved to the Jinja templates of lab/report/templates,
so they hold the move to its word: the same bytes (but for the triage comment, whose two `<details>`
now come from the one `details` filter, with `<summary>` on its own line as everywhere else). After an
intended change of a layout, regenerate with LAB_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from lab.analyze.judge import Verdict
from lab.compare.comment import render_comment
from lab.core.results import LocalizeResult, read_document
from lab.drivers.ablate import LADDER, Step, ablation_markdown, conclude
from lab.drivers.localize import localize_markdown
from lab.issue.triage import BisectStep, RunStep, TriageState, comment_text
from tests.conftest import DATA
from tests.report.test_report_golden import _case

GOLDEN = DATA / "reports"
COMPARE = DATA / "compare"
REPO = str(Path(__file__).resolve().parents[2])


# A record's links to the runs it names (under /tmp/cmp-runs when it was made) are relative to the
# folder it is read from, so they climb as many folders as the checkout is deep: not part of the layout.
_CLIMB = re.compile(r"(?:\.\./)+(?:tmp/)?cmp-runs/")


def _check(name: str, text: str) -> None:
    text = text.replace(REPO, "<repo>")  # the checkout's place is the tester's
    path = GOLDEN / name
    if os.environ.get("LAB_UPDATE_GOLDEN"):
        path.write_bytes(text.encode("utf-8"))
    golden = path.read_text(encoding="utf-8")
    assert _CLIMB.sub("<up>/cmp-runs/", text) == _CLIMB.sub("<up>/cmp-runs/", golden), \
        f"{name} differs from its golden file"


@pytest.mark.parametrize("name, verdicts, autotune", [
    ("ablation-inductor.md", ("not_reproduced", "not_reproduced", "reproduced"), False),
    ("ablation-inconclusive.md", ("not_reproduced", "timeout"), True),
])
def test_ablation_md(tmp_path, name, verdicts, autotune):
    case = _case("vmap-inside-compile", arch="amd64")
    steps = [Step(rung, Verdict(v), tmp_path / f"{rung.backend}{'-' + rung.mode if rung.mode else ''}",
                  "ran past 300 s" if v == "timeout" else "")
             for rung, v in zip(LADDER if autotune else LADDER[:3], verdicts, strict=False)]
    _check(name, ablation_markdown(case, steps, conclude(steps)))


@pytest.mark.parametrize("name, folder", [
    ("localize-relu-inject.md", COMPARE / "localize-relu-inject"),
    ("localize-vmap-newapi.md", COMPARE / "bisect-vmap-newapi" / "localize"),
])
def test_localize_md(name, folder):
    result = read_document(folder / "localize.json", LocalizeResult)
    _check(name, localize_markdown(result, folder))
    _check(name.replace(".md", "-nofolder.md"), localize_markdown(result))


@pytest.mark.parametrize("name, folder", [
    ("comment-bisect-vmap-newapi.md", COMPARE / "bisect-vmap-newapi"),
    ("comment-bisect-libgomp-aarch64.md", COMPARE / "bisect-libgomp-aarch64"),
    ("comment-run-relu-inject.md", COMPARE / "relu-inject-2.13.0"),
    ("comment-localize-relu-inject.md", COMPARE / "localize-relu-inject"),
    ("comment-run-failed-differently.md", COMPARE / "bisect-vmap-newapi" / "torch2.2.2"),
    # a run of the local engine (the CUDA seed on the H200): the host it ran on, never a base or Docker
    ("comment-run-local-gpu.md", DATA / "local-gpu"),
])
def test_comment(name, folder):
    _check(name, render_comment(folder))


def test_triage_comments():
    found = TriageState(source="https://github.com/pytorch/pytorch/issues/147282", name="assert-147282",
                        page_run=RunStep("2.5.1", "amd64", "reproduced"),
                        newest_run=RunStep("2.13.0", "amd64", "not_reproduced"),
                        bisect=BisectStep("found", last_old="2.6.0", first_new="2.7.0",
                                          blame=[{"package": "numpy", "old": "1.26.4", "new": "2.0.0"}],
                                          blame_fix="pin numpy<2"),
                        compare={"available": True, "text": "verdict: reproduced -> not_reproduced\n| a | b |"})
    _check("triage-found.md", comment_text(found))
    page = RunStep("2.5.1", "arm64", "not_reproduced", reason="the script passed")
    _check("triage-not-reproduced.md", comment_text(TriageState(source="/saved/page.md", page_run=page,
                                                                compare={"why": "no bisection: nothing to compare"})))
    same = RunStep("2.15.0", "amd64", "reproduced")
    _check("triage-still-present.md", comment_text(TriageState(source="p", page_run=same, newest_run=same,
                                                               compare={"available": True, "comment": "**x**"})))
