"""A bisection's report: bisect.md (summary, resume command, every probe), bisect.svg, bisect.json, report.html.

The SVG is written by hand (no plotting dependency): one mark per candidate
release, coloured by what its probe said, and the boundary between `last_old`
and `first_new`. Every file is deterministic: the same result gives the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from lab.core.results import FAILED_DIFFERENTLY
from lab.drivers.bisect import AMBIGUOUS, FOUND, NOT_REPRODUCED, REPRODUCED, SKIP, BisectResult, Probe
from lab.report.html import write_bisect_html
from lab.report.writer import render

MD_NAME, SVG_NAME, JSON_NAME = "bisect.md", "bisect.svg", "bisect.json"

# fill, stroke per outcome; untested releases are hollow
_COLOURS = {REPRODUCED: ("#d62728", "#8c1a1b"), NOT_REPRODUCED: ("#2ca02c", "#1b641b"),
            SKIP: ("#bdbdbd", "#6e6e6e"), None: ("#ffffff", "#9e9e9e")}
_COLOURS[FAILED_DIFFERENTLY] = ("#ff9f1c", "#a35c00")  # failed, but not with the signature
_LEGEND = ((REPRODUCED, "reproduced"), (NOT_REPRODUCED, "not reproduced"), (SKIP, "skipped (error/timeout)"),
           (FAILED_DIFFERENTLY, "failed differently"), (None, "untested"))
_STEP, _MARGIN, _R, _Y = 56, 48, 9, 64


def write_bisect_report(folder: str | os.PathLike, scenario_name: str, arch: str, result: BisectResult,
                        candidates: Sequence[str], resume_command: str = "") -> Path:
    """Write bisect.md, bisect.svg, bisect.json and report.html into `folder`; return the path of bisect.md."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    svg = render_svg(scenario_name, arch, result, candidates)
    (out / SVG_NAME).write_text(svg, encoding="utf-8", newline="\n")
    record = result.model_copy(update={"scenario": scenario_name, "arch": str(arch), "candidates": tuple(candidates),
                                       "resume": resume_command or result.resume})
    record.write(out / JSON_NAME)
    write_bisect_html(out, record, svg)
    md = out / MD_NAME
    md.write_text(render_markdown(out, scenario_name, arch, result, candidates, resume_command),
                  encoding="utf-8", newline="\n")
    return md


# -- markdown ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceRow:
    label: str
    commit: str | None      # None: not recorded
    url: str | None = None  # the compare row: a link instead of a commit


@dataclass(frozen=True)
class BisectView:
    """What bisect.md (lab/report/templates/bisect.md.j2) is laid out from: plain strings, escaped by
    the template (lab.report.escape's filters)."""

    title: str
    status: str
    summary: str
    resume_command: str
    svg: str
    candidate_count: int
    rows: tuple[tuple[int, str, str, str, str, str, str, str], ...]  # number, release, verdict, evidence,
    #                                   run folder (relative; "" for none), build, run, total (formatted seconds)
    wall: str   # the summary line of the probes' times ("" when no probe has any)
    notes: tuple[str, ...]
    candidates: str
    untested_count: int
    untested: str
    source: tuple[SourceRow, ...] = ()           # the boundary pinned to source
    git_bisect: str = ""
    failed: tuple[tuple[str, str, str], ...] = ()  # release, expected, observed
    failed_counted: str = ""
    compare: str = ""                             # lab compare's summary of the boundary pair
    localization: str = ""
    localize_link: str = ""
    blame: tuple[str, ...] = ()                   # lab.compare.diff.blame_lines
    blame_steps: tuple[tuple[str, str, str], ...] = ()  # label, verdict, flips


def render_markdown(folder: Path, scenario_name: str, arch: str, result: BisectResult,
                    candidates: Sequence[str], resume_command: str = "") -> str:
    tested = {p.version for p in result.steps}
    untested = [v for v in candidates if v not in tested]
    return render("bisect.md.j2", BisectView(
        title=f"{scenario_name} ({arch}), {result.from_version} to {result.to_version}",
        status=result.status, summary=result.summary, resume_command=resume_command, svg=SVG_NAME,
        candidate_count=len(candidates),
        rows=tuple((n, probe.version, _verdict(probe, result), _one_line(probe.evidence or probe.reason),
                    _run_folder(folder, probe.run_dir), _seconds(probe.build_s), _seconds(probe.run_s),
                    _seconds(probe.total_s))
                   for n, probe in enumerate(result.steps, 1)),
        wall=wall_summary(result.steps),
        notes=tuple(result.notes), candidates=", ".join(candidates),
        untested_count=len(untested), untested=", ".join(untested),
        source=_source(result), git_bisect=result.source.git_bisect if result.source else "",
        failed=tuple((p.version, p.different_failure.expected if p.different_failure else "",
                      p.different_failure.observed if p.different_failure else p.reason)
                     for p in result.steps if p.verdict == FAILED_DIFFERENTLY),
        failed_counted=("skipped: never a boundary" if result.failed_differently == SKIP else
                        f"counted as {result.failed_differently} (--failed-differently)"),
        compare="\n".join(result.compare), localization=result.localization or "",
        localize_link="localize/localize.md" if result.localize_dir else "",
        blame=tuple(result.blame_lines()),
        blame_steps=tuple((st.label, st.verdict, {True: "yes", False: "no"}.get(st.flips, "no verdict"))
                          for st in result.blame_steps)))


def _source(result: BisectResult) -> tuple[SourceRow, ...]:
    s = result.source
    if s is None:
        return ()
    return (SourceRow(f"{s.last_old} (last old)", s.last_old_commit),
            SourceRow(f"{s.first_new} (first new)", s.first_new_commit),
            SourceRow("compare", None, s.compare_url))


def wall_summary(steps: Sequence[Probe]) -> str:
    """One line: the probes' total wall time, and how much of it went to builds and to runs."""
    timed = [p for p in steps if p.total_s is not None]
    if not timed:
        return ""
    total = sum(p.total_s or 0.0 for p in timed)
    build = sum(p.build_s or 0.0 for p in timed)
    run = sum(p.run_s or 0.0 for p in timed)
    share = (lambda part: f" ({100 * part / total:.0f}%)") if total > 0 else (lambda part: "")
    probes = f"{len(timed)} probe" + ("s" if len(timed) != 1 else "")
    rest = _seconds(max(total - build - run, 0.0))
    return (f"Wall time of {probes} with a run: {_seconds(total)}; builds {_seconds(build)}{share(build)}, "
            f"runs {_seconds(run)}{share(run)}, the rest (analysis, records) {rest}.")


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 60:
        return f"{value:.1f} s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _verdict(probe: Probe, result: BisectResult) -> str:
    text = probe.verdict if not probe.skipped else f"{probe.verdict} (skipped)"
    if probe.version == result.last_old and result.status in (FOUND, AMBIGUOUS):
        text += ", last old"
    if probe.version == result.first_new and result.status in (FOUND, AMBIGUOUS):
        text += ", first new"
    return text


def _one_line(text: str, limit: int = 140) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


def _run_folder(folder: Path, run_dir: str | None) -> str:
    """A probe's run folder relative to the bisect folder ("" for none)."""
    if not run_dir:
        return ""
    target = Path(run_dir)
    return (Path(os.path.relpath(target, folder)) if target.is_absolute() else target).as_posix()


# -- svg --------------------------------------------------------------------------------------------

def render_svg(scenario_name: str, arch: str, result: BisectResult, candidates: Sequence[str]) -> str:
    """A timeline of every candidate release: a mark each, coloured by verdict, with the boundary."""
    probes = {p.version: (n, p) for n, p in enumerate(result.steps, 1)}
    count = max(len(candidates), 1)
    legend = _MARGIN + sum(_legend_step(label) for _, label in _LEGEND)
    width = max(2 * _MARGIN + _STEP * (count - 1), legend)
    longest = max((len(v) for v in candidates), default=4)
    label_drop = 12 + int(longest * 6.5 * 0.71)  # labels at 45 degrees
    legend_y = _Y + 24 + label_drop + 16
    height = legend_y + 20
    x_of = {v: _MARGIN + _STEP * i for i, v in enumerate(candidates)}

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f"<title>{escape(f'bisect {scenario_name} ({arch})')}: {escape(result.summary)}</title>",
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{_MARGIN - _R}" y="18" font-size="13" font-weight="bold">'
             f"{escape(f'{scenario_name} ({arch}): {result.status}')}</text>"]
    parts += _boundary(result, x_of)
    if candidates:
        parts.append(f'<line x1="{x_of[candidates[0]]}" y1="{_Y}" x2="{x_of[candidates[-1]]}" y2="{_Y}" '
                     'stroke="#9e9e9e" stroke-width="2"/>')
    for version in candidates:
        parts += _mark(version, x_of[version], probes.get(version))
    parts += _legend(legend_y)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _boundary(result: BisectResult, x_of: dict[str, int]) -> list[str]:
    if result.status not in (FOUND, AMBIGUOUS) or result.last_old not in x_of or result.first_new not in x_of:
        return []
    x0, x1 = x_of[result.last_old], x_of[result.first_new]
    if result.status == FOUND:
        x = (x0 + x1) // 2
        label = f"changes between {result.last_old} and {result.first_new}"
        return [f'<line x1="{x}" y1="{_Y - 26}" x2="{x}" y2="{_Y + 16}" stroke="#000000" stroke-width="2" '
                'stroke-dasharray="4 3"/>',
                f'<text x="{x}" y="{_Y - 30}" text-anchor="middle">{escape(label)}</text>']
    label = f"ambiguous: between {result.last_old} and {result.first_new}"
    return [f'<rect x="{x0}" y="{_Y - 24}" width="{x1 - x0}" height="40" fill="#fff3c4" stroke="#c9a227" '
            'stroke-dasharray="4 3"/>',
            f'<text x="{(x0 + x1) // 2}" y="{_Y - 30}" text-anchor="middle">{escape(label)}</text>']


def _mark(version: str, x: int, probed: tuple[int, Probe] | None) -> list[str]:
    outcome = probed[1].outcome if probed else None
    fill, stroke = _COLOURS[FAILED_DIFFERENTLY if probed and probed[1].verdict == FAILED_DIFFERENTLY else outcome]
    if probed:
        n, p = probed
        tip = f"{version}: {p.verdict}" + (f" ({_one_line(p.reason, 200)})" if p.reason else "") + f", probe {n}"
    else:
        tip = f"{version}: untested"
    out = [f"<g><title>{escape(tip)}</title>",
           f'<circle cx="{x}" cy="{_Y}" r="{_R}" fill="{fill}" stroke="{stroke}" stroke-width="2"/>']
    if outcome == SKIP:
        d = _R - 4
        out.append(f'<path d="M{x - d} {_Y - d}L{x + d} {_Y + d}M{x - d} {_Y + d}L{x + d} {_Y - d}" '
                   f'stroke="{stroke}" stroke-width="2"/>')
    if probed:
        out.append(f'<text x="{x}" y="{_Y - _R - 4}" text-anchor="middle" font-size="9" fill="#555555">'
                   f"{probed[0]}</text>")
    ly = _Y + _R + 12
    out.append(f'<text x="{x - 3}" y="{ly}" transform="rotate(45 {x - 3} {ly})">{escape(version)}</text></g>')
    return out


def _legend_step(label: str) -> int:
    return 26 + int(len(label) * 6.3)


def _legend(y: int) -> list[str]:
    out, x = [], _MARGIN
    for outcome, label in _LEGEND:
        fill, stroke = _COLOURS[outcome]
        out.append(f'<circle cx="{x}" cy="{y}" r="6" fill="{fill}" stroke="{stroke}" stroke-width="2"/>')
        if outcome in (SKIP, FAILED_DIFFERENTLY):
            out.append(f'<path d="M{x - 3} {y - 3}L{x + 3} {y + 3}M{x - 3} {y + 3}L{x + 3} {y - 3}" '
                       f'stroke="{stroke}" stroke-width="1.5"/>')
        out.append(f'<text x="{x + 10}" y="{y + 4}">{escape(label)}</text>')
        x += _legend_step(label)
    return out
