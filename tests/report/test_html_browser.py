"""report.html in a real browser: Debian's headless chromium (tests/browser.py drives it through the
DevTools protocol) opens the pages and must see the verdict, the loader graph and the timeline, no
console error, and no request but the page itself. Each test keeps a full-page screenshot in
artifacts/browser/ (git-ignored; LAB_ARTIFACTS moves it) and in its pytest tmp folder.

The first test is a real run: the committed run folder of torch 2.5.1 on arm64 (two libgomp); the
docker test makes a fresh real matrix of the cheapest case (amd64, the CPU torch of tests/cpu_torch.py, run twice) and
opens its pages.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab.drivers.bisect import bisect
from lab.drivers.bisect_report import write_bisect_report
from lab.report.html import write_run_html
from tests.browser import PageReport, find_chromium, open_page, save_screenshot
from tests.conftest import DATA, ROOT, last_json, run_lab
from tests.cpu_torch import TORCH
from tests.drivers.test_bisect_report import VERSIONS, fake, regression

pytestmark = pytest.mark.browser
RUN = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"
ARTIFACTS = Path(os.environ.get("LAB_ARTIFACTS", ROOT / "artifacts")) / "browser"
PNG = b"\x89PNG\r\n\x1a\n"


def visible(report: PageReport, selector: str, min_width: float = 1) -> dict:
    box = report.boxes.get(selector)
    assert box is not None, f"{selector} is not on the page"
    assert box["width"] >= min_width and box["height"] > 0, (selector, box)
    assert box["display"] != "none" and box["visibility"] == "visible", (selector, box)
    return box


def clean(report: PageReport) -> None:
    assert report.errors == [], report.errors
    assert report.requests == [report.url], report.requests        # nothing but the file itself
    assert report.screenshot.startswith(PNG) and len(report.screenshot) > 10_000


def keep(report: PageReport, tmp_path: Path, name: str) -> None:
    save_screenshot(report, tmp_path, name)
    save_screenshot(report, ARTIFACTS, name)


RUN_SELECTORS = ("#verdict .verdict", "#evidence", "#loader-graph-svg svg", "#loader-graph-svg svg g.node",
                 '#loader-graph-svg svg [fill="#f8d0d0"]', "#logs", "#logs ~ details")


def test_the_report_of_a_real_run_renders_offline_with_its_loader_graph(tmp_path):
    run_dir = tmp_path / RUN.name
    shutil.copytree(RUN, run_dir)
    page = write_run_html(run_dir)
    report = open_page(page.as_uri(), RUN_SELECTORS)
    keep(report, tmp_path, "report-libgomp-aarch64.png")
    clean(report)
    assert visible(report, "#verdict .verdict")["text"].strip() == "reproduced"
    assert visible(report, "#loader-graph-svg svg", min_width=600)["height"] > 300
    assert "libgomp-f3febf51.so.1.0.0" in visible(report, "#loader-graph-svg svg")["text"]
    visible(report, '#loader-graph-svg svg [fill="#f8d0d0"]')                 # a duplicate copy, drawn red
    visible(report, "#logs ~ details")


def test_a_bisection_page_shows_the_timeline_and_its_boundary(tmp_path):
    folder = tmp_path / "bisect"
    result = bisect(VERSIONS, fake(regression("2.9.0", errors=("2.13.0", "2.14.0", "2.15.0")), folder))
    for p in result.steps:                                   # each probe folder: a copy of a real run
        shutil.copytree(RUN, p.run_dir)
        write_run_html(Path(p.run_dir))
    write_bisect_report(folder, "libgomp-aarch64", "arm64", result, VERSIONS, "lab bisect ...")
    report = open_page((folder / "report.html").as_uri(), ("#verdict", "#timeline-svg svg", "#boundary + table",
                                                           "#probes", "table a"))
    keep(report, tmp_path, "bisect-libgomp-aarch64.png")
    clean(report)
    assert "2.8.0 → 2.9.0" in visible(report, "#verdict")["text"]
    timeline = visible(report, "#timeline-svg svg", min_width=400)
    assert "changes between 2.8.0 and 2.9.0" in timeline["text"] and "2.15.0" in timeline["text"]
    visible(report, "table a")
    assert "last old: torch 2.8.0" in visible(report, "#boundary + table")["text"]


def test_the_harness_sees_requests_and_errors(tmp_path):
    """The checks above mean something: a page that reaches out and fails is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p id="p">x</p><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("boom"); undefinedFunction();</script></body></html>')
    report = open_page(bad.as_uri(), ("#p", "#missing"))
    assert "http://127.0.0.1:9/x.png" in report.requests
    assert any("boom" in e for e in report.errors) and any("exception" in e for e in report.errors)
    assert report.boxes["#missing"] is None and report.boxes["#p"]["text"] == "x"


@pytest.mark.docker
@pytest.mark.timeout(1200)
@pytest.mark.usefixtures("cpu_torch")
def test_a_fresh_real_matrix_writes_pages_that_render_and_is_in_the_history(tmp_path):
    """The cheapest real case (amd64, the CPU torch of tests/cpu_torch.py), run twice as a matrix
    (`--repeat 2`): each run's page, drawn from its own LD_DEBUG log (one libgomp: nothing red), the
    matrix folder's grid, and both runs in the run history as matrix cells."""
    runs = tmp_path / "runs"
    proc = run_lab("run", "libgomp-amd64", *TORCH.args, "--repeat", "2", "--out", str(runs), "--json",
                   "--no-diagnose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cell,) = last_json(proc.stdout)["cells"]
    folder = Path(last_json(proc.stdout)["folder"])
    run_dir = Path(cell["runs"][-1]["run_dir"])
    assert "report.html" in proc.stderr

    report = open_page((run_dir / "report.html").as_uri(), RUN_SELECTORS)
    keep(report, tmp_path, "report-libgomp-amd64.png")
    clean(report)
    assert visible(report, "#verdict .verdict")["text"].strip() == cell["runs"][-1]["verdict"].replace("_", " ")
    graph = visible(report, "#loader-graph-svg svg", min_width=300)
    assert "libgomp" in graph["text"] and "libtorch_cpu.so" in graph["text"]
    assert report.boxes['#loader-graph-svg svg [fill="#f8d0d0"]'] is None   # one libgomp: nothing red

    grid = open_page((folder / "report.html").as_uri(), ("#matrix-grid", "#matrix-grid td.cell a"))
    keep(grid, tmp_path, "matrix-libgomp-amd64.png")
    clean(grid)
    assert TORCH.version in visible(grid, "#matrix-grid")["text"]
    assert f"{cell['reproduced']}/{cell['runnable']} reproduced" in visible(grid, "#matrix-grid")["text"]
    visible(grid, "#matrix-grid td.cell a")                                   # linked to the run's page

    listed = run_lab("runs", "libgomp-amd64", "--out", str(runs), "--json")
    assert listed.returncode == 0, listed.stderr
    history = last_json(listed.stdout)["runs"]
    assert [r["run_dir"] for r in history] == [r["run_dir"] for r in reversed(cell["runs"])]
    assert {r["kind"] for r in history} == {"cell"}
    flaky = last_json(run_lab("runs", "--flaky", "--out", str(runs), "--json").stdout)["flaky"]
    assert [f["case"] for f in flaky] == ([cell["cell"]] if cell["verdict"] == "flaky" else [])


def test_chromium_is_there():
    """bin/setup-host installs it; the other tests of this file need it."""
    assert find_chromium() is not None, "no chromium: run bin/setup-host (apt-get install chromium)"
