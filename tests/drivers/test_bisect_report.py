"""lab.bisect_report: bisect.md, bisect.svg and bisect.json from a BisectResult."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from lab.drivers.bisect import BisectResult, Probe, bisect
from lab.drivers.bisect_report import render_svg, write_bisect_report

SVG_NS = "{http://www.w3.org/2000/svg}"
VERSIONS = ["2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0",
            "2.13.0", "2.14.0", "2.15.0"]
RESUME = "lab bisect libgomp-aarch64 --from 2.5.1 --to 2.15.0 --arch arm64"


def fake(verdicts: dict[str, str], runs: Path | None = None, timed: bool = False):
    """Probes from a verdict per release; `timed`: with fixed, made-up stage times (as result.json's)."""
    def probe(version: str) -> Probe:
        verdict = verdicts[version]
        reason = "crashed under emulation; confirm on native arm64" if verdict == "error" else ""
        evidence = {"reproduced": "duplicate libgomp:\n torch.libs/libgomp-a34b3233.so.1 | /lib/libgomp.so.1",
                    "not_reproduced": "one libgomp"}.get(verdict, "")
        run_dir = str(runs / f"libgomp-aarch64[torch={version}]") if runs else None
        times = {}
        if timed:
            i = VERSIONS.index(version)
            build, run = 30.0 + 7 * i, 45.5 + (i % 3)
            times = {"build_s": build, "run_s": run, "total_s": build + run + 2.25}
        return Probe.judged(version, verdict, reason=reason, evidence=evidence, run_dir=run_dir, **times)
    return probe


def regression(boundary: str, errors=()) -> dict[str, str]:
    b = VERSIONS.index(boundary)
    return {v: "error" if v in errors else ("not_reproduced" if i < b else "reproduced")
            for i, v in enumerate(VERSIONS)}


def circles(svg_text: str) -> list[ET.Element]:
    return ET.fromstring(svg_text).findall(f".//{SVG_NS}circle")


def test_report_files_and_summary(tmp_path):
    out = tmp_path / "bisect-run"
    runs = out / "runs"
    result = bisect(VERSIONS, fake(regression("2.9.0", errors=("2.13.0", "2.14.0", "2.15.0")), runs))
    md_path = write_bisect_report(out, "libgomp-aarch64", "arm64", result, VERSIONS, RESUME)
    assert md_path == out / "bisect.md"
    md = md_path.read_text()
    assert md.startswith("# Bisect: libgomp-aarch64 (arm64), 2.5.1 to 2.15.0\n")
    assert "first release that behaves like 2.12.0 (reproduced): 2.9.0; last like 2.5.1 (not_reproduced): " \
           "2.8.0." in md
    assert f"```sh\n{RESUME}\n```" in md
    assert "![Timeline of the 13 candidate releases](bisect.svg)" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == len(result.steps)
    assert rows[0].startswith("| 1 | 2.5.1 | not_reproduced | one libgomp | [runs/libgomp-aarch64[torch=2.5.1]]"
                              "(runs/libgomp-aarch64%5Btorch%3D2.5.1%5D/) |")
    assert "| 2 | 2.15.0 | error (skipped) | crashed under emulation; confirm on native arm64 |" in rows[1]
    assert "duplicate libgomp: torch.libs/libgomp-a34b3233.so.1 \\| /lib/libgomp.so.1" in md  # one line, escaped
    assert "2.8.0 | not_reproduced, last old |" in md and "2.9.0 | reproduced, first new |" in md
    assert "- 2.15.0 skipped: crashed under emulation" in md
    assert json.loads((out / "bisect.json").read_text())["first_new"] == "2.9.0"
    assert (out / "bisect.svg").is_file()


def test_json_is_the_results_json(tmp_path):
    result = bisect(VERSIONS, fake(regression("2.9.0")))
    write_bisect_report(tmp_path, "s", "arm64", result, VERSIONS)
    data = json.loads((tmp_path / "bisect.json").read_text())
    written = BisectResult.model_validate_json((tmp_path / "bisect.json").read_text())
    assert written == result.model_copy(update={"scenario": "s", "arch": "arm64", "candidates": tuple(VERSIONS)})
    assert data["candidates"] == VERSIONS and data["scenario"] == "s"
    assert (data["schema_version"], data["kind"]) == (1, "bisect")


def test_svg_is_valid_xml_with_a_mark_per_candidate(tmp_path):
    verdicts = regression("2.9.0", errors=("2.13.0", "2.14.0", "2.15.0"))
    result = bisect(VERSIONS, fake(verdicts))
    svg = render_svg("libgomp-aarch64", "arm64", result, VERSIONS)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    marks = [c for c in circles(svg) if c.get("r") == "9"]
    assert len(marks) == len(VERSIONS)
    fills = {}
    for group in root.findall(f"{SVG_NS}g"):
        title = group.find(f"{SVG_NS}title").text
        fills[title.split(":")[0]] = group.find(f"{SVG_NS}circle").get("fill")
    probed = {p.version: p.outcome for p in result.steps}
    for version in VERSIONS:
        expected = {"reproduced": "#d62728", "not_reproduced": "#2ca02c", "skip": "#bdbdbd"}.get(
            probed.get(version), "#ffffff")
        assert fills[version] == expected, version
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "changes between 2.8.0 and 2.9.0" in texts
    assert len(root.findall(f".//{SVG_NS}path")) == 3 + 2  # crosses on the three skips, two in the legend


def test_svg_ambiguous_range_and_escaping():
    versions = ["1.0", "1.1", "1.2", "1.3"]
    verdicts = {"1.0": "not_reproduced", "1.1": "error", "1.2": "timeout", "1.3": "reproduced"}
    result = bisect(versions, fake(verdicts))
    svg = render_svg("a<b>&\"c'", "arm64", result, versions)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "ambiguous: between 1.0 and 1.3" in texts
    assert "a<b>&\"c' (arm64): ambiguous" in texts
    assert "&lt;b&gt;&amp;" in svg


def test_svg_untested_and_no_boundary():
    result = bisect(["1.0", "1.1", "1.2"], fake({"1.0": "reproduced", "1.1": "x", "1.2": "reproduced"}))
    svg = render_svg("s", "amd64", result, ["1.0", "1.1", "1.2"])
    marks = [c for c in circles(svg) if c.get("r") == "9"]
    assert [c.get("fill") for c in marks] == ["#d62728", "#ffffff", "#d62728"]
    assert "changes between" not in svg and "ambiguous:" not in svg


def test_markdown_for_no_change_without_resume(tmp_path):
    result = bisect(["1.0", "1.1"], fake({"1.0": "reproduced", "1.1": "reproduced"}))
    md = write_bisect_report(tmp_path, "s", "amd64", result, ["1.0", "1.1"]).read_text()
    assert "**Result (no_change).** both ends reproduced: nothing to bisect" in md
    assert "```sh" not in md
    assert "| 1 | 1.0 | reproduced | duplicate libgomp" in md and "| — |" in md


def test_relative_run_dirs_kept_and_absolute_made_relative(tmp_path):
    result = bisect(["1.0", "1.1"], lambda v: Probe(version=v, outcome="reproduced" if v == "1.1" else "not_reproduced",
                                                    run_dir="../runs/x" if v == "1.0" else str(tmp_path / "r y")))
    md = write_bisect_report(tmp_path / "out", "s", "amd64", result, ["1.0", "1.1"]).read_text()
    assert "[../runs/x](../runs/x/)" in md
    assert "[../r y](../r%20y/)" in md


def test_bytes_are_deterministic(tmp_path):
    verdicts = regression("2.10.0", errors=("2.7.0", "2.15.0"))
    for name in ("a", "b"):
        result = bisect(VERSIONS, fake(verdicts, Path("/runs")))
        write_bisect_report(tmp_path / name, "libgomp-aarch64", "arm64", result, VERSIONS, RESUME)
    for file in ("bisect.md", "bisect.svg", "bisect.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
