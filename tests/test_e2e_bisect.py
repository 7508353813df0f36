"""A real bisection and a real matrix, arm64 under QEMU, through the `lab` CLI and the real engine.

vmap-inside-compile fails on torch 2.3.x ("torch.func.vmap capture is disabled") and passes
from 2.4.0. Its script stops in Dynamo's tracing, before any C++ compile, so each probe
stays short under emulation. The matrix reuses the images the bisection kept (--keep-images).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import open_page
from tests.conftest import last_json, run_lab
from tests.cpu_torch import TORCH
from tests.report.test_html_browser import clean, keep, visible

pytestmark = [pytest.mark.docker, pytest.mark.arm64, pytest.mark.timeout(3600),
              pytest.mark.beside]  # bin/test's second lane of Docker runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


def test_bisect_finds_the_fix_and_resumes_from_its_folders(runs):
    args = ["bisect", "vmap-inside-compile", "--from", "2.3.1", "--to", "2.4.1", "--arch", "arm64",
            "--out", str(runs), "--json", "--keep-images", "--jobs", "1",  # serial (tests/engines runs it in parallel)
            "--no-blame",  # the blame step has its own e2e test (test_e2e_blame),
            "--no-localize"]  # and the localization at the boundary test_e2e_compare's
    proc = run_lab(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["status"] == "found", result
    assert (result["from_verdict"], result["to_verdict"]) == ("reproduced", "not_reproduced")
    assert (result["last_old"], result["first_new"]) == ("2.3.1", "2.4.0")
    steps = {s["torch"]: s["verdict"] for s in result["steps"]}
    assert steps == {"2.3.1": "reproduced", "2.4.1": "not_reproduced", "2.4.0": "not_reproduced"}
    assert [s["torch"] for s in result["steps"]][:2] == ["2.3.1", "2.4.1"]  # both ends first
    assert result["width"] == 1 and result["rounds"] == len(result["steps"]) == 3  # one probe per round
    folder = Path(result["folder"])
    md = (folder / "bisect.md").read_text()
    assert "2.4.0" in md and "bisect.svg" in md and result["resume"] in md
    assert "<svg" in (folder / "bisect.svg").read_text()
    page = (folder / "report.html").read_text()
    assert 'id="timeline-svg"><svg' in page and "<strong>2.3.1 → 2.4.0</strong>" in page
    # the page of this real bisection, in a real browser (Debian's chromium, which bin/setup installs)
    report = open_page((folder / "report.html").as_uri(), ("#verdict", "#timeline-svg svg", "#probes"))
    keep(report, folder, "bisect-vmap-inside-compile.png")
    clean(report)
    assert "2.3.1 → 2.4.0" in visible(report, "#verdict")["text"]
    assert "2.4.1" in visible(report, "#timeline-svg svg", min_width=150)["text"]
    assert "torch.func.vmap capture is disabled" in (folder / "torch2.3.1" / "report.md").read_text()
    assert "resume after an interruption with: lab bisect vmap-inside-compile" in proc.stderr

    again = run_lab(*args)  # resumes: every probe already has a verdict in its folder
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("(from an earlier run)") == 3
    assert last_json(again.stdout)["first_new"] == "2.4.0"


@pytest.mark.usefixtures("cpu_torch")
def test_matrix_runs_every_cell_and_repeat_gives_a_rate(runs):
    proc = run_lab("run", "vmap-inside-compile", "--torch", "2.3.1,2.4.1", "--arch", "arm64", "--no-diagnose",
                   "--out", str(runs), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = last_json(proc.stdout)
    cells = {c["cell"]: c["verdict"] for c in data["cells"]}
    assert cells == {"vmap-inside-compile[torch=2.3.1,arch=arm64]": "reproduced",
                     "vmap-inside-compile[torch=2.4.1,arch=arm64]": "not_reproduced"}
    assert "vmap-inside-compile[torch=2.4.1,arch=arm64]" in proc.stderr  # the table
    assert 'id="matrix-grid"' in (Path(data["folder"]) / "report.html").read_text()

    # the rate, on a cell that -k picks out of two: natively, on the cheap amd64 torch, where dlpack-cpu's
    # Dynamo failure reproduces in seconds (two more emulated runs of the cell above cost about 70 s);
    # the other cell (2.9.0 on amd64: a 4-5 GB CUDA build) is neither installed nor run
    proc = run_lab("run", "dlpack-cpu", "--torch", f"2.9.0,{TORCH.version}", "--arch", TORCH.arch,
                   "-k", "not 2.9.0", "--repeat", "2", "--no-diagnose", "--out", str(runs), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cell,) = last_json(proc.stdout)["cells"]
    assert cell["cell"] == f"dlpack-cpu[torch={TORCH.version},arch={TORCH.arch}]"
    assert (cell["repeat"], cell["reproduced"], cell["rate"]) == (2, 2, 1.0)
    assert "2/2 reproduced (100%)" in proc.stderr
