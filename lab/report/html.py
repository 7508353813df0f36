"""report.html: one self-contained page per run folder, bisection and matrix.

Inline CSS and inline SVG only: no script, no font, no image and no link that leaves the file, so
it opens offline and can be attached to an issue. The pages are laid out by Jinja templates
(lab/report/templates/*.html.j2, autoescaped); the Python side reads the folder's documents (the
run folder is the source of truth, so an old folder can be drawn again) and hands plain values over.
The only markup passed through unescaped is SVG this package made: Graphviz's loader graph (every
label escaped by `dot`) and the bisection timeline (lab.drivers.bisect_report escapes its text).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from markupsafe import Markup

from lab.analyze.evidence import read_text
from lab.analyze.loader import canonical_path
from lab.core.errors import LabError
from lab.core.results import BisectResult, EvidenceRecord, MatrixResult, RunResult, read_document, read_result
from lab.report.loader_graph import NO_DOT, Edge, draw, graph_of_run
from lab.report.writer import render

HTML_NAME = "report.html"
_LOG_TAIL_LINES = 400


@dataclass(frozen=True)
class Log:
    title: str
    body: str
    open: bool = False


@dataclass(frozen=True)
class Dup:
    family: str
    pid: int
    copies: tuple[tuple[str, str], ...]   # (path, needed by)


@dataclass(frozen=True)
class GraphView:
    svg: Markup | None
    note: str | None
    pid: int
    program: str
    family: str | None
    edges: tuple[Edge, ...]


@dataclass(frozen=True)
class RunView:
    title: str
    verdict: str
    reason: str
    facts: tuple[tuple[str, str], ...]
    words: tuple[str, ...]
    checks: tuple[tuple[str, str, str, bool], ...]
    duplicates: tuple[Dup, ...]
    exception: str | None
    graph: GraphView | None
    graph_missing: str
    logs: tuple[Log, ...]


def write_run_html(run_dir: Path, dot: str | None = None) -> Path:
    """Write report.html into a run folder from its result.json, evidence.json, loader log and logs."""
    path = run_dir / HTML_NAME
    _write(path, render("report.html.j2", run_view(run_dir, dot)))
    return path


def run_view(run_dir: Path, dot: str | None = None) -> RunView:
    result = read_result(run_dir)
    evidence = None
    if (run_dir / "evidence.json").exists():
        try:
            evidence = read_document(run_dir / "evidence.json", EvidenceRecord)
        except LabError:
            evidence = None
    if not isinstance(result, RunResult):
        return RunView(title=result.scenario, verdict=result.status, reason=result.reason,
                       facts=(("Case", result.case), ("torch", result.torch), ("Arch", result.arch)),
                       words=(), checks=(), duplicates=(), exception=None, graph=None,
                       graph_missing="the run did not finish", logs=tuple(_logs(run_dir)))
    graph = graph_of_run(run_dir)
    picture = draw(graph, dot) if graph else None
    facts = [("Case", result.case), ("torch", result.torch), ("Arch", result.arch),
             ("Emulated", "yes" if result.emulated else "no")]
    if result.backend:
        facts.append(("Backend", result.backend))
    if result.duration_s is not None:
        facts.append(("Run time", f"{result.duration_s:.1f} s"))
    if result.exit_code is not None:
        facts.append(("Exit code", str(result.exit_code)))
    if result.killed:
        facts.append(("Killed", result.killed))
    if result.torch_build is not None and result.torch_build.git_version:
        facts.append(("torch commit", result.torch_build.git_version))
    if result.different_failure is not None:
        facts += [("Signature expected", result.different_failure.expected),
                  ("Signature observed", result.different_failure.observed)]
    elif result.signature is not None:
        facts.append(("Failure signature", result.signature.words()))
    facts += [("Started", result.started), ("Engine", _engine_words(result))]
    if result.local is not None:  # the local engine: this host, no container
        facts += [("Host", f"{result.local.os}, {result.local.libc}"),
                  ("System packages", result.local.system_packages),
                  ("Python", f"{result.local.python} ({result.local.python_env}: {result.local.environment})"),
                  ("Confinement", result.local.confinement)]
    facts += [("Run folder", run_dir.name), ("torch-repro-lab", result.lab_version)]
    if evidence is not None:
        dups = tuple(Dup(d.label or d.family, d.pid, tuple(zip(d.paths, (n or "?" for n in d.needed_by), strict=False)))
                     for d in evidence.duplicate_runtimes)
    else:  # an older or damaged evidence.json: result.json's summary, the requesters from the loader log
        parent = {e.child: e.parent for e in graph.edges} if graph else {}
        dups = tuple(Dup(d.family, d.pid, tuple((p, parent.get(canonical_path(p), "?")) for p in d.paths))
                     for d in result.evidence.duplicate_runtimes)
    words = result.summary or (graph.words if graph else ())
    exc = result.evidence.exception
    return RunView(
        title=result.scenario, verdict=result.verdict.value, reason=result.reason, facts=tuple(facts),
        words=tuple(words),
        checks=tuple((c.key, c.expected, c.observed, c.held) for c in result.checks),
        duplicates=dups, exception=f"{exc.type}: {exc.message}" if exc else None,
        graph=None if graph is None else GraphView(
            svg=Markup(picture.svg) if picture and picture.svg else None,
            note=picture.note if picture else NO_DOT, pid=graph.pid, program=graph.program or "program",
            family=graph.family, edges=graph.edges),
        graph_missing="the run left no loader log (out/ld/)",
        logs=tuple(_logs(run_dir)))


_LOGS = (("stderr.txt", "stderr", True), ("stdout.txt", "stdout", False),
         ("diagnose/stderr.txt", "diagnose step: stderr", False), ("build.log", "build log", False),
         ("collect_env.txt", "python -m torch.utils.collect_env", False), ("Dockerfile", "Dockerfile", False),
         ("scenario.yaml", "scenario.yaml (resolved)", False))


def _logs(run_dir: Path) -> list[Log]:
    out = []
    for name, title, is_open in _LOGS:
        if (run_dir / name).is_file():
            lines = read_text(run_dir / name, limit=512 * 1024).splitlines()
            note = f" (last {_LOG_TAIL_LINES} of {len(lines)} lines)" if len(lines) > _LOG_TAIL_LINES else ""
            out.append(Log(title + note, "\n".join(lines[-_LOG_TAIL_LINES:]), is_open and bool(lines)))
    return out


# --- a bisection --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRow:
    number: int
    torch: str
    verdict: str
    outcome: str
    reason: str
    link: str | None      # relative link to the probe's report.html (or folder)


@dataclass(frozen=True)
class BoundarySide:
    label: str            # "last old" / "first new"
    torch: str
    verdict: str
    evidence: str
    reason: str
    link: str | None


@dataclass(frozen=True)
class BisectView:
    title: str
    status: str
    summary: str
    timeline: Markup
    boundary: str | None
    compare: tuple[BoundarySide, ...]    # the two releases either side of the boundary, when found
    rows: tuple[ProbeRow, ...]
    notes: tuple[str, ...]
    resume: str | None
    candidates: tuple[str, ...]
    source: object = None                 # core.results.SourceBoundary: commits, compare link, git bisect
    compare_lines: tuple[str, ...] = ()   # lab compare's summary of the boundary pair
    localization: str | None = None
    blame: tuple[str, ...] = ()


def write_bisect_html(folder: Path, result: BisectResult, timeline_svg: str) -> Path:
    """report.html of a bisect folder: the summary, the timeline (SVG made by the driver), every probe."""
    rows = tuple(ProbeRow(n, p.version, p.verdict, p.outcome, p.reason, _link(folder, p.run_dir))
                 for n, p in enumerate(result.steps, 1))
    boundary = (f"{result.last_old} → {result.first_new}" if result.last_old and result.first_new else None)
    probes = {p.version: p for p in result.steps}
    compare = tuple(BoundarySide(label, probes[v].version, probes[v].verdict, probes[v].evidence, probes[v].reason,
                                 _link(folder, probes[v].run_dir))
                    for label, v in (("last old", result.last_old), ("first new", result.first_new)) if v in probes)
    view = BisectView(title=f"bisect {result.scenario or ''} ({result.arch or '?'})", status=result.status,
                      summary=result.summary, timeline=Markup(timeline_svg), boundary=boundary,
                      compare=compare if len(compare) == 2 else (), rows=rows,
                      notes=result.notes, resume=result.resume, candidates=result.candidates,
                      source=result.source, compare_lines=result.compare, localization=result.localization,
                      blame=tuple(result.blame_lines()))
    path = folder / HTML_NAME
    _write(path, render("bisect.html.j2", view))
    return path


# --- a matrix -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GridCell:
    verdict: str
    rate: str
    link: str | None
    name: str


@dataclass(frozen=True)
class MatrixView:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[GridCell | None, ...]], ...]


def write_matrix_html(folder: Path, result: MatrixResult) -> Path:
    """report.html of a matrix folder: a grid, torch versions down, arch (and backend) across."""
    def column(c) -> str:
        return str(getattr(c.arch, "value", c.arch)) + (f" · {c.backend}" if c.backend else "")
    columns = tuple(dict.fromkeys(column(c) for c in result.cells))
    versions = tuple(dict.fromkeys(c.torch for c in result.cells))
    at = {(c.torch, column(c)): c for c in result.cells}
    rows = []
    for v in versions:
        cells = []
        for col in columns:
            c = at.get((v, col))
            if c is None:
                cells.append(None)
                continue
            rate = (f"{c.reproduced}/{c.runnable} reproduced" if c.repeat > 1 else "")
            cells.append(GridCell(c.verdict, rate, _link(folder, c.runs[-1].run_dir) if c.runs else None, c.cell))
        rows.append((v, tuple(cells)))
    path = folder / HTML_NAME
    _write(path, render("matrix.html.j2", MatrixView(f"matrix {result.scenario}", columns, tuple(rows))))
    return path


def _link(folder: Path, run_dir: str | None) -> str | None:
    """A relative link from `folder` to a run folder's report.html (its folder when it has none)."""
    if not run_dir:
        return None
    target = Path(run_dir)
    if not target.is_absolute():
        target = Path.cwd() / target
    if not target.exists():
        return None
    page = target / HTML_NAME
    rel = os.path.relpath(page if page.exists() else target, folder.resolve())
    return quote(Path(rel).as_posix())


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    tmp.replace(path)


def write_folder_html(folder: Path, dot: str | None = None) -> Path:
    """(Re)write report.html of a run, bisect (bisect.json + bisect.svg) or matrix (matrix.json) folder."""
    if (folder / "bisect.json").is_file():
        result = read_document(folder / "bisect.json", BisectResult)
        svg = (folder / "bisect.svg").read_text(encoding="utf-8") if (folder / "bisect.svg").is_file() else ""
        return write_bisect_html(folder, result, svg)
    if (folder / "matrix.json").is_file():
        return write_matrix_html(folder, read_document(folder / "matrix.json", MatrixResult))
    return write_run_html(folder, dot)


def _engine_words(result) -> str:
    e = result.engine
    if e.kind == "local":
        return f"local (this host, no container; {e.version}) on {e.host_arch}"
    return f"{e.name} (Docker {e.version}) on {e.host_arch}" + (", emulated" if result.emulated else "")
