"""The MCP tools' results built from what the long verbs print (`lab bisect --json`, `lab triage
--json`): the real bisection kept in tests/data/compare, and the JSON `lab triage` ends with."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from lab.agent.policy import Policy
from lab.agent.server import _bisect_result, _triage_result
from lab.issue.triage import BisectStep, RunStep, TriageState, summary_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "compare" / "bisect-vmap-newapi"


def test_a_bisections_result_names_the_boundary_the_folder_and_the_comment(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(DATA, runs / "bis")
    data = json.loads((runs / "bis" / "bisect.json").read_text())
    data["folder"] = str(runs / "bis")
    r = _bisect_result(Policy(runs_root=runs, scenario_dirs=()), data)
    assert (r.status, r.last_old, r.first_new, r.folder) == ("found", "2.3.1", "2.4.0", "bis")
    assert r.steps and all(s.verdict for s in r.steps)
    assert r.comment.strip() and str(tmp_path) not in r.comment


def test_a_triages_result_carries_both_verdicts_the_boundary_and_the_comment(tmp_path):
    state = TriageState(source="https://github.com/pytorch/pytorch/issues/1", name="issue-1",
                        page_run=RunStep("2.5.1", "amd64", "reproduced"),
                        newest_run=RunStep("2.15.0", "amd64", "not_reproduced"),
                        bisect=BisectStep("found", "2.6.0", "2.7.0", blame=[{"package": "numpy", "old": "1",
                                                                              "new": "2"}]),
                        comment="### Triage by torch-repro-lab")
    printed = {**asdict(state), "summary": summary_lines(state), "folder": str(tmp_path / "runs" / "triage" / "1")}
    r = _triage_result(Policy(runs_root=tmp_path / "runs", scenario_dirs=()), printed)
    assert (r.page_verdict, r.newest_verdict, r.boundary, r.folder) == ("reproduced", "not_reproduced",
                                                                         "2.6.0 -> 2.7.0", "triage/1")
    assert r.blame == ["numpy 1 -> 2"] and r.comment.startswith("### Triage") and "Fixed in torch 2.7.0" in \
        " ".join(r.summary)
