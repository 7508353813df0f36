"""The blame travels: a real bisect folder (tests/data/compare/bisect-vmap-newapi) given a blame
answer shows it in `lab compare` (first, when dependencies are the cause), `lab comment`, bisect.md
and report.html, and keeps every key bisect.json had."""

from __future__ import annotations

import json
import shutil

from lab.compare.comment import render_comment
from lab.core.results import BisectResult, read_document
from lab.drivers.bisect_report import write_bisect_report
from tests.conftest import DATA, run_lab

BISECT = DATA / "compare" / "bisect-vmap-newapi"
NUMPY = {"blame": [{"package": "numpy", "old": "1.26.4", "new": "2.4.6"}],
         "blame_summary": "the verdict on torch 2.3.1 (reproduces) depends on numpy (2.3.1's era: numpy 1.26.4, what "
                          "it ran with: 2.4.6); with its era's numpy, torch 2.3.1 does not reproduce",
         "blame_fix": "pin numpy<2 on torch <= 2.3.x"}
TORCH = {"blame": [{"package": "torch", "old": "2.3.1", "new": "2.4.0"}],
         "blame_summary": "torch alone flips the verdict: torch 2.3.1 with its era's dependencies: reproduced",
         "blame_fix": "torch alone"}


def _folder(tmp_path, blame: dict):
    folder = tmp_path / "bisect"
    shutil.copytree(BISECT, folder)
    data = json.loads((folder / "bisect.json").read_text())
    before = set(data)
    (folder / "bisect.json").write_text(json.dumps({**data, **blame}))
    result = read_document(folder / "bisect.json", BisectResult)
    assert before <= set(result.to_json())  # the keys bisect.json had are kept
    return folder, result


def test_dependencies_come_first_when_they_are_the_cause(tmp_path):
    folder, result = _folder(tmp_path, NUMPY)
    proc = run_lab("compare", str(folder))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "cause: dependencies, not torch: numpy 1.26.4 → 2.4.6"
    assert lines[2] == "to act on: pin numpy<2 on torch <= 2.3.x" and lines[3].startswith("A: ")
    comment = render_comment(folder)
    assert "**Dependencies, not torch:** pin numpy<2 on torch <= 2.3.x." in comment
    write_bisect_report(folder, "vmap-newapi", "arm64", result, list(result.candidates), result.resume or "")
    md = (folder / "bisect.md").read_text()
    assert "## Torch or its dependencies?" in md and "cause: dependencies, not torch: numpy 1.26.4 → 2.4.6" in md
    assert 'id="blame"' in (folder / "report.html").read_text()


def test_torch_alone_is_said_as_such(tmp_path):
    folder, result = _folder(tmp_path, TORCH)
    proc = run_lab("compare", str(folder))
    assert proc.stdout.splitlines()[0] == "cause: torch alone (2.3.1 → 2.4.0)"
    assert "**torch alone** flips the verdict" in render_comment(folder)
    proc = run_lab("compare", str(folder), "--json")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["a"]  # the JSON is lab compare's, unchanged


def test_a_bisection_without_blame_prints_as_before(tmp_path):
    folder, _ = _folder(tmp_path, {})
    assert run_lab("compare", str(folder)).stdout.splitlines()[0].startswith("A: ")
    assert "Dependencies, not torch" not in render_comment(folder)
