"""`lab triage` over many pages: the list (@FILE, --from-file), the batch through its runner seam
(here a runner that drives the real triage chain with fake runs), the summary (summary.json and
summary.md: verdicts, boundary, blame, failed-differently and no-oracle cases named), resuming (a
finished, unchanged issue is not run again; an edited one is), and the batch's exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lab.core import exitcodes as codes
from lab.issue.triage import BisectStep, RunStep, TriageState, compare_seam, run_triage
from lab.issue.triage_batch import (
    BatchInputError,
    BatchSummary,
    JobOutcome,
    batch_exit,
    read_sources,
    run_batch,
    triage_folder,
)
from tests.conftest import run_lab

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"
FIXED = str(CORPUS / "147282.md")       # reproduced on its release, fixed in 2.7.0 (fake runs below)
DIFFERENT = str(CORPUS / "102339.md")   # its run fails differently
NO_ORACLE = str(CORPUS / "101980.md")   # the page shows no failure: the default expectation


def _runner(tmp_path: Path, seen: list[list[str]]):
    """A batch runner: the real chain (lab.issue.triage.run_triage) with fake runs, one job at a time."""
    from lab.issue.fetch import fetch_issue
    from lab.issue.infer import infer
    from lab.issue.write import write_inference

    def runner(jobs):
        seen.append([j.source for j in jobs])
        for job in jobs:
            def make(job=job):
                inf = infer(fetch_issue(job.source))
                w = write_inference(inf, tmp_path / "sc", force=True)
                return str(w.cpu_variant or w.yaml), w.scenario.name, inf.page.url, inf.torch, inf.arch.value

            def run(y, torch, arch, job=job):
                if job.source == DIFFERENT:
                    return RunStep(torch, arch, "failed_differently", reason="AttributeError, not the page's")
                return RunStep(torch, arch, "reproduced" if torch != "2.15.0" else "not_reproduced",
                               run_dir=f"/r/{torch}")
            state = run_triage(TriageState.load(job.folder / "triage.json", job.source), job.folder,
                               make_scenario=make, run=run,
                               bisect=lambda *a: BisectStep("found", "2.6.0", "2.7.0",
                                                            blame=[{"package": "numpy", "old": "1.26.4",
                                                                    "new": "2.0.0"}], blame_fix="pin numpy"),
                               newest=lambda arch: "2.15.0", compare=compare_seam())
            assert state.comment
            yield JobOutcome(job, codes.OK)
    return runner


def test_a_batch_writes_one_summary_names_the_odd_cases_and_resumes(tmp_path):
    runs = tmp_path / "runs"
    sources = [FIXED, DIFFERENT, NO_ORACLE]
    seen: list[list[str]] = []
    summary = run_batch(sources, runs, _runner(tmp_path, seen))
    assert seen == [sources] and summary.exit_code == 0 and summary.finished == 3
    by = {r.source: r for r in summary.issues}
    fixed = by[FIXED]
    assert (fixed.page_verdict, fixed.newest_verdict, fixed.newest_torch) == ("reproduced", "not_reproduced", "2.15.0")
    assert fixed.boundary == "2.6.0 -> 2.7.0" and fixed.blame == ["numpy 1.26.4 -> 2.0.0"]
    assert fixed.comment and Path(fixed.comment).read_text().startswith("### Triage by torch-repro-lab")
    assert by[DIFFERENT].failed_differently and by[DIFFERENT].newest_verdict is None
    assert by[NO_ORACLE].no_oracle and not by[FIXED].no_oracle
    folder = Path(summary.folder)
    on_disk = BatchSummary.model_validate_json((folder / "summary.json").read_text())
    assert on_disk == summary
    md = (folder / "summary.md").read_text()
    assert "| reproduced (2.5.1) | not_reproduced (2.15.0) | 2.6.0 -> 2.7.0 | numpy 1.26.4 -> 2.0.0 |" in md
    assert "**Failed differently" in md and "**No oracle" in md

    # the same batch again: every issue finished and unchanged, so nothing is given to the runner
    again = run_batch(sources, runs, _runner(tmp_path, seen))
    assert seen[-1] == [] and {r.status for r in again.issues} == {"reused"}
    assert [r.model_dump(exclude={"status"}) for r in again.issues] == \
        [r.model_dump(exclude={"status"}) for r in summary.issues]

    # an edit of one issue's scenario: that issue alone runs again
    state = TriageState.load(triage_folder(runs, FIXED) / "triage.json", FIXED)
    path = Path(state.scenario)
    data = yaml.safe_load(path.read_text())
    data["expect"] = {"exit_code": 3}
    path.write_text(yaml.safe_dump(data))
    run_batch(sources, runs, _runner(tmp_path, seen))
    assert seen[-1] == [FIXED]


def test_an_interrupted_batch_leaves_a_summary_that_says_what_is_done(tmp_path):
    runs = tmp_path / "runs"
    seen: list[list[str]] = []
    inner = _runner(tmp_path, seen)

    def stops_after_one(jobs):
        for outcome in inner(jobs):
            yield outcome
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_batch([FIXED, NO_ORACLE], runs, stops_after_one)
    folder = next((runs / "triage").glob("batch-*"))
    data = json.loads((folder / "summary.json").read_text())
    assert data["finished"] == 1 and data["exit_code"] == codes.INTERRUPTED
    assert [r["status"] for r in data["issues"]] == ["done", "interrupted"]
    run_batch([FIXED, NO_ORACLE], runs, _runner(tmp_path, seen))
    assert seen[-1] == [NO_ORACLE]  # the finished one is reused


def test_the_list_of_pages(tmp_path):
    listed = tmp_path / "issues.txt"
    listed.write_text(f"# to triage\n{FIXED}\n\n{NO_ORACLE}\n{FIXED}\n")
    assert read_sources([f"@{listed}", DIFFERENT]) == [FIXED, NO_ORACLE, DIFFERENT]
    assert read_sources([], listed) == [FIXED, NO_ORACLE]
    with pytest.raises(BatchInputError, match="cannot be read"):
        read_sources([f"@{tmp_path / 'missing.txt'}"])
    with pytest.raises(BatchInputError, match="no issue page"):
        read_sources([], tmp_path / "issues.txt" if False else _empty(tmp_path))
    with pytest.raises(BatchInputError, match="would share the triage folder"):
        read_sources(["a/147282.md", "b/147282.md"])


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n")
    return path


def test_the_batch_exit_code():
    from lab.issue.triage_batch import IssueSummary

    def row(code):
        return IssueSummary(source="s", folder="f", status="done", exit_code=code)
    assert batch_exit([row(0), row(0)]) == codes.OK
    assert batch_exit([row(0), row(codes.BAD_INPUT)]) == codes.BAD_INPUT
    assert batch_exit([row(codes.BAD_INPUT), row(codes.INFRASTRUCTURE)]) == codes.INFRASTRUCTURE


def test_the_cli_refuses_a_missing_list_with_one_paragraph_and_exit_2(tmp_path):
    proc = run_lab("triage", f"@{tmp_path / 'nope.txt'}", "--out", str(tmp_path / "runs"))
    assert proc.returncode == codes.BAD_INPUT, proc.stderr
    assert "cannot be read" in proc.stderr and "Traceback" not in proc.stderr


def test_the_cli_batch_runs_each_page_as_lab_triage_and_exits_with_the_batchs_code(tmp_path):
    """The real local runner (a `lab triage SOURCE` child per page, two at once, the local engine so no
    Docker engine is asked): pages that give no scenario are bad input, named in the summary with their
    own paragraph, and the batch exits 2 with summary.json's code."""
    listed = tmp_path / "pages.txt"
    pages = [str(CORPUS / "108747.md"), str(CORPUS / "121288.md")]
    listed.write_text("\n".join(pages) + "\n")
    args = ("triage", "--from-file", str(listed), "--engine", "local", "--parallel", "2",
            "--out", str(tmp_path / "runs"), "-o", str(tmp_path / "sc"), "--json")
    proc = run_lab(*args)
    assert proc.returncode == codes.BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["kind"] == "triage-batch" and data["exit_code"] == codes.BAD_INPUT
    assert [(r["source"], r["status"]) for r in data["issues"]] == [(p, "bad_input") for p in pages]
    assert "has no code block" in data["issues"][0]["error"]
    summary = Path(data["folder"])
    assert json.loads((summary / "summary.json").read_text()) == data
    assert "| bad_input |" in (summary / "summary.md").read_text()
