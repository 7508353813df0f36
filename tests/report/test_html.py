"""report.html (lab.report.html): a run folder's page from a real run, the bisect and matrix pages,
and the self-containment rule (no script, no request, only inline CSS and SVG)."""

from __future__ import annotations

import html.parser
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lab.core.results import MatrixResult, read_document
from lab.drivers.bisect import bisect
from lab.drivers.bisect_report import write_bisect_report
from lab.drivers.matrix import Cell, expand, matrix_result, write_matrix_folder
from lab.report.html import write_folder_html, write_run_html
from tests.conftest import DATA, fake_result, run_lab, tiny_scenario
from tests.drivers.test_bisect_report import VERSIONS, fake, regression

RUN = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"


class _Tags(html.parser.HTMLParser):
    """Every tag and attribute of a page, to check that nothing in it can leave the file."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def assert_self_contained(text: str) -> _Tags:
    parser = _Tags()
    parser.feed(text)
    names = {t for t, _ in parser.tags}
    assert not names & {"script", "link", "img", "iframe", "object", "embed", "image", "use", "font"}, names
    for tag, attrs in parser.tags:
        for key in ("src", "href", "xlink:href", "srcset", "action"):
            value = attrs.get(key)
            assert value is None or value.split(":")[0] not in ("http", "https", "ftp", "data", "javascript"), \
                (tag, key, value)
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    assert "@import" not in text and "url(" not in text
    return parser


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "20261122T120958Z-torch2.5.1-arm64"
    shutil.copytree(RUN, folder)
    return folder


def test_run_page_of_a_real_run(run_dir):
    text = write_run_html(run_dir).read_text()
    tags = assert_self_contained(text)
    assert '<span class="verdict v-reproduced">reproduced</span>' in text
    assert "two GNU OpenMP runtimes in pid 1" in text                              # the evidence in words
    assert "<code>/lib/aarch64-linux-gnu/libgomp.so.1</code>, needed by <code>/tmp/torchinductor_root/" in text
    assert '<tr><td><code>duplicate_runtime</code></td><td>two or more libgomp</td>' in text
    details = [a for t, a in tags.tags if t == "details"]
    assert len(details) >= 5 and sum("open" in a for a in details) == 1        # the logs, stderr open
    assert "UserWarning: Failed to initialize NumPy" in text                     # stderr of the run
    if shutil.which("dot"):
        assert '<div class="graph" id="loader-graph-svg"><svg' in text and "libgomp-f3febf51.so.1.0.0" in text


def test_without_dot_the_page_lists_the_edges_and_says_how_to_draw_them(run_dir):
    text = write_run_html(run_dir, dot=str(run_dir / "no-dot")).read_text()
    assert_self_contained(text)
    assert 'class="note">Graphviz `dot` failed' in text and "loader-graph-svg" not in text
    assert '<tr class="failed-check"><td><code>/tmp/torchinductor_root/' in text


def test_markup_in_the_logs_is_escaped(run_dir):
    (run_dir / "stderr.txt").write_text('<script>alert(1)</script><img src="http://example.com/x">\n')
    text = write_run_html(run_dir).read_text()
    assert_self_contained(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_an_unfinished_run_gets_a_page(tmp_path):
    from lab.core.results import UnfinishedRun
    UnfinishedRun(scenario="s", case="s[torch=2.5.1,arch=amd64]", torch="2.5.1", arch="amd64", backend=None,
                  mode=None, status="interrupted", reason="Ctrl-C",
                  run_dir=str(tmp_path)).write(tmp_path / "result.json")
    text = write_run_html(tmp_path).read_text()
    assert "v-interrupted" in text and "Ctrl-C" in text and "the run did not finish" in text


def test_bisect_folder_gets_a_page_with_the_timeline_and_links_to_probe_reports(tmp_path, run_dir):
    probes = tmp_path / "bisect"
    result = bisect(VERSIONS, fake(regression("2.9.0", errors=("2.13.0", "2.14.0", "2.15.0")), probes))
    for p in result.steps:  # each probe folder holds a run's report.html, as bisect_run writes them
        shutil.copytree(run_dir, p.run_dir)
        write_run_html(Path(p.run_dir))
    write_bisect_report(probes, "libgomp-aarch64", "arm64", result, VERSIONS, "lab bisect ...")
    text = (probes / "report.html").read_text()
    assert_self_contained(text)
    assert '<div class="graph" id="timeline-svg"><svg' in text
    assert "changes between 2.8.0 and 2.9.0" in text and "<strong>2.8.0 → 2.9.0</strong>" in text
    assert '<a href="libgomp-aarch64%5Btorch%3D2.5.1%5D/report.html">report</a>' in text   # relative, quoted
    assert 'class="cell v-error">error</td>' in text
    boundary = text.split('<h2 id="boundary">')[1].split("</table>")[0]
    assert "<th>last old: torch 2.8.0</th><th>first new: torch 2.9.0</th>" in boundary
    assert "<pre>one libgomp</pre>" in boundary and "torch.libs/libgomp-a34b3233.so.1 | /lib/libgomp.so.1" in boundary
    assert boundary.count('<a href="libgomp-aarch64%5Btorch%3D2.') == 2
    assert write_folder_html(probes) == probes / "report.html"                     # `lab report` redraws it


def test_matrix_folder_gets_a_grid(tmp_path, run_dir):
    scenario = tiny_scenario(tmp_path, "name: m\ntorch: ['2.5.1', '2.9.1']\narch: [amd64, arm64]\n"
                                       "base: debian:bookworm\nexpect:\n  exit_code: 0\n")
    cases = expand(scenario)
    verdicts = {0: ["reproduced", "not_reproduced"], 1: ["reproduced"] * 2, 2: ["not_reproduced"] * 2}
    cells = [Cell(c, [fake_result(c, v, run_dir) for v in verdicts.get(i, [])]) for i, c in enumerate(cases)]
    folder = write_matrix_folder(tmp_path / "runs", matrix_result(scenario, cells),
                                 now=datetime(2026, 11, 23, 12, tzinfo=timezone.utc))
    assert folder == tmp_path / "runs" / "m" / "matrix-20261123T120000Z"
    assert read_document(folder / "matrix.json", MatrixResult).folder == str(folder)
    text = (folder / "report.html").read_text()
    assert_self_contained(text)
    rows = text.split('<table id="matrix-grid">')[1].split("</table>")[0].split("<tr>")[2:]
    assert [r.split("</th>")[0].removeprefix("<th>") for r in rows] == ["2.5.1", "2.9.1"]
    assert "v-flaky" in rows[0] and "1/2 reproduced" in rows[0] and "v-not_run" in rows[1]
    assert 'v-reproduced" title="m[torch=2.5.1,arch=arm64]"><a href="' in text


def test_lab_report_command_redraws_a_folder(run_dir):
    (run_dir / "report.html").unlink(missing_ok=True)
    proc = run_lab("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(run_dir / "report.html")
    assert "reproduced" in (run_dir / "report.html").read_text()
    bad = run_lab("report", str(run_dir.parent))
    assert bad.returncode == 2 and "not a run folder" in " ".join(bad.stderr.split()) and "Traceback" not in bad.stderr
    assert json.loads((run_dir / "result.json").read_text())["verdict"] == "reproduced"
