"""`lab mcp`: the lab's verbs as MCP tools over stdio (the official `mcp` SDK's MCPServer).

Quick verbs (list, show, from-issue, compare, comment, read_report) run in this process; run,
bisect and triage run as `python -m lab ... --json` children (lab.agent.jobs) so that a cancelled
call stops their containers. Every input goes through lab.agent.policy first."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import yaml
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from lab import __version__
from lab.agent import models as m
from lab.agent.jobs import JobFailed, run_lab_job
from lab.agent.policy import AgentInputError, Policy
from lab.compare.comment import render_comment
from lab.compare.diff import compare_runs, resolve_pair
from lab.core.errors import LabError
from lab.core.results import RunResult, read_result
from lab.image.resolve import parse_arch
from lab.issue.fetch import fetch_issue
from lab.issue.infer import infer
from lab.issue.write import write_inference
from lab.scenario.lookup import list_scenarios as listed
from lab.scenario.lookup import load_scenario
from lab.scenario.model import check_version

__all__ = ["build_server"]

INSTRUCTIONS = (
    "torch-repro-lab runs a PyTorch bug's reproducing script confined (no network, no host folder, limits) on "
    "a chosen torch release and architecture and returns a verdict with evidence. Start with "
    "scenario_from_issue (an issue URL or its text) or list_scenarios, then run, bisect or triage; read_report, "
    "compare and comment take the folders those return (relative to the server's runs folder).")


def build_server(policy: Policy) -> MCPServer:
    server = MCPServer("torch-repro-lab", version=__version__, instructions=INSTRUCTIONS)

    def refuse(error: LabError) -> ToolError:
        return ToolError(str(error))

    async def job(ctx: Context, args: list[str]) -> dict:
        started = time.monotonic()
        count, last = [0], [0.0]

        async def progress(line: str) -> None:  # at most 4 notifications a second (a build says a lot)
            count[0] += 1
            now = time.monotonic()
            if now - last[0] >= 0.25:
                last[0] = now
                await ctx.report_progress(count[0], None, f"{now - started:.0f}s {line}")
        try:
            return (await run_lab_job([*args, "--out", str(policy.runs_root), "--json"], progress)).data
        except JobFailed as e:
            kind = {2: "refused (bad input)", 3: "infrastructure failure"}.get(e.code, f"failed (exit {e.code})")
            raise ToolError(f"{kind}: {e}") from None

    @server.tool()
    def list_scenarios() -> m.ScenarioList:
        """The scenarios this server can run: the configured folders' and those written from issue pages."""
        rows: list[m.ScenarioInfo] = []
        origins = [("agent", policy.scenarios_folder)] + [("configured", d) for d in policy.scenario_dirs]
        for origin, folder in origins:
            if not folder.is_dir():
                continue
            for item in listed(folder):
                if isinstance(item, LabError):
                    rows.append(m.ScenarioInfo(name=Path(getattr(item, "file", None) or "?").stem, origin=origin,
                                               error=policy.cap(str(item))))
                else:
                    rows.append(m.ScenarioInfo(name=item.source.stem, title=item.title, torch=list(item.torch),
                                               arch=[a.value for a in item.arch], gpu=item.gpu, base=item.base,
                                               origin=origin))
        return m.ScenarioList(scenarios=rows)

    @server.tool()
    def show_scenario(scenario: str) -> m.ScenarioDetail:
        """A scenario as the lab understands it, and its script."""
        try:
            path = policy.scenario_path(scenario)
            s = load_scenario(path)
        except LabError as e:
            raise refuse(e) from None
        script = s.source.parent / s.script if s.script else None
        text = script.read_text(encoding="utf-8", errors="replace") if script and script.is_file() else None
        return m.ScenarioDetail(name=scenario, yaml=yaml.safe_dump(s.model_dump(mode="json"), sort_keys=False),
                                script=policy.cap(text))

    @server.tool()
    def scenario_from_issue(page: str) -> m.FromIssueResult:
        """A scenario from an issue page: a GitHub issue URL, or the page's text (Markdown). Nothing from the
        page runs here; its code becomes the scenario's script, which runs only confined."""
        try:
            inf = infer(fetch_issue(_page_source(policy, page)))
            written = write_inference(inf, policy.scenarios_folder, None, True)
        except LabError as e:
            raise refuse(e) from None
        no_oracle = any(f.name == "expect" and f.default for f in inf.facts)
        return m.FromIssueResult(
            scenario=written.yaml.stem, cpu_variant=written.cpu_variant.stem if written.cpu_variant else None,
            torch=inf.torch, arch=inf.arch.value, base=inf.base, expect=dict(inf.expect), no_oracle=no_oracle,
            facts=[m.InferredFact(name=f.name, value=policy.cap(f.value) or "", line=f.line, how=f.how,
                                  default=f.default) for f in inf.facts],
            fixups=list(inf.fixups))

    @server.tool()
    async def run(scenario: str, ctx: Context, torch: str | None = None, arch: str | None = None,
                  engine: str | None = None) -> m.RunToolResult:
        """Run a scenario once, confined, on a torch release and arch (default: the scenario's), on an engine
        (default, local, or a configured one). Progress is reported; cancelling stops the run."""
        args = _case_args(policy, scenario, torch, arch, engine)
        network = ["--allow-network"] if policy.allow_network else []  # only `lab mcp --allow-network` opens it
        data = await job(ctx, ["run", *args, *network])
        return _run_result(policy, data)

    @server.tool()
    async def bisect(scenario: str, from_torch: str, to_torch: str, ctx: Context, arch: str | None = None,
                     engine: str | None = None) -> m.BisectToolResult:
        """Find the torch release where a scenario's verdict changes, between two releases."""
        try:
            old, new = check_version(from_torch, "from_torch"), check_version(to_torch, "to_torch")
        except LabError as e:
            raise refuse(e) from None
        args = _case_args(policy, scenario, None, arch, engine)
        data = await job(ctx, ["bisect", *args, "--from", old, "--to", new])
        return _bisect_result(policy, data)

    @server.tool()
    def compare(a: str, b: str | None = None) -> m.CompareToolResult:
        """What changed between two run folders of one scenario, or a bisect folder's boundary pair."""
        try:
            fa = policy.folder(a, "a")
            fb = policy.folder(b, "b") if b is not None else None
            pair = resolve_pair(fa, fb)
            for side in pair:
                policy.folder(str(side), "boundary run")
            c = compare_runs(*pair)
        except LabError as e:
            raise refuse(e) from None
        return m.CompareToolResult(a=policy.relative(pair[0]) or "", b=policy.relative(pair[1]) or "",
                                   same_verdict=c.verdict is None,
                                   summary=[policy.cap(s) or "" for s in c.summary[:200]])

    @server.tool()
    def comment(folder: str) -> m.CommentResult:
        """The Markdown comment for a run or bisect folder, ready to paste (secrets scrubbed)."""
        try:
            path = policy.folder(folder)
            text = render_comment(path)
        except LabError as e:
            raise refuse(e) from None
        return m.CommentResult(folder=policy.relative(path) or "", comment=policy.cap(text) or "")

    @server.tool()
    async def triage(page: str, ctx: Context, engine: str | None = None) -> m.TriageToolResult:
        """From an issue page (URL or text) to an answer: a run on the page's release, on the newest, a
        bisection if they differ, and a comment to paste. Resumes an earlier triage of the same page."""
        try:
            source = _page_source(policy, page)
            engines = policy.engine_args(engine)
        except LabError as e:
            raise refuse(e) from None
        data = await job(ctx, ["triage", source, "--output", str(policy.scenarios_folder), *engines])
        return _triage_result(policy, data)

    @server.tool()
    def read_report(folder: str) -> m.ReportResult:
        """The report of a folder under the runs folder: a run (report.md), a bisection (bisect.md) or a
        batch triage (summary.md), with its verdict and summary."""
        try:
            path = policy.folder(folder)
            return _report(policy, path)
        except LabError as e:
            raise refuse(e) from None

    return server


# ----------------------------------------------------------------------------- helpers

def _page_source(policy: Policy, page: str) -> str:
    """A URL as it is; a page's text saved in the workspace (by its hash) and named by that file."""
    text = (page or "").strip()
    if not text:
        raise AgentInputError("page: give an issue URL or the issue's text.", field="page")
    if text.startswith(("https://", "http://")) and "\n" not in text:
        return text
    if len(text) > 2_000_000:
        raise AgentInputError("page: the text is over 2 MB.", field="page")
    folder = policy.workspace / "pages"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"page-{hashlib.sha256(text.encode()).hexdigest()[:16]}.md"
    if not path.is_file():
        path.write_text(text, encoding="utf-8")
    return str(path)


def _case_args(policy: Policy, scenario: str, torch: str | None, arch: str | None, engine: str | None) -> list[str]:
    try:
        path, _ = policy.check_scenario(scenario)
        args = [str(path)]
        if torch is not None:
            args += ["--torch", check_version(torch, "torch")]
        if arch is not None:
            args += ["--arch", parse_arch(arch).value]
        args += policy.engine_args(engine)
    except LabError as e:
        raise ToolError(str(e)) from None
    return args


def _comment(folder: Path) -> str:
    try:
        return render_comment(folder)
    except LabError as e:
        return f"(no comment: {e})"


def _run_result(policy: Policy, data: dict) -> m.RunToolResult:
    r = read_result(data["run_dir"])
    if not isinstance(r, RunResult):
        raise ToolError(f"the run stopped without a verdict ({r.status}): {r.reason}")
    exc = r.evidence.exception
    cut = bool(r.capture and any(getattr(s, "cut", False) for s in (r.capture.stdout, r.capture.stderr)))
    folder = Path(r.run_dir)
    return m.RunToolResult(
        scenario=r.scenario, torch=r.torch, arch=str(getattr(r.arch, "value", r.arch)),
        engine=r.engine.kind if r.engine else None,
        emulated=r.emulated, verdict=r.verdict.value, reason=policy.cap(r.reason) or "",
        evidence=m.Evidence(exception=policy.cap(f"{exc.type}: {exc.message}"[:2000]) if exc else None,
                            duplicate_runtimes=[d.family for d in r.evidence.duplicate_runtimes],
                            summary=[s[:2000] for s in r.summary[:50]], output_cut=cut),
        run_folder=policy.relative(folder) or "", network="no network" not in (r.limits or ""),
        confinement=r.limits, comment=policy.cap(_comment(folder)) or "")


def _bisect_result(policy: Policy, data: dict) -> m.BisectToolResult:
    folder = Path(data["folder"]) if data.get("folder") else None
    blame = [f"{b.get('package')} {b.get('old')} -> {b.get('new')}" for b in data.get("blame") or []]
    return m.BisectToolResult(
        status=data.get("status", "?"), from_verdict=data.get("from_verdict"), to_verdict=data.get("to_verdict"),
        last_old=data.get("last_old"), first_new=data.get("first_new"),
        steps=[m.BisectStepResult(torch=str(s.get("torch") or s.get("version")), verdict=str(s.get("verdict")))
               for s in data.get("steps", [])],
        summary=policy.cap(str(data.get("summary") or "")) or "", blame=blame,
        folder=policy.relative(folder) or "", comment=(policy.cap(_comment(folder)) or "") if folder else "")


def _triage_result(policy: Policy, data: dict) -> m.TriageToolResult:
    page, new, bis = data.get("page_run") or {}, data.get("newest_run") or {}, data.get("bisect") or {}
    boundary = f"{bis['last_old']} -> {bis['first_new']}" if bis.get("status") == "found" else None
    return m.TriageToolResult(
        source=data.get("source", ""), scenario=data.get("name"), page_verdict=page.get("verdict"),
        page_torch=page.get("torch"), newest_verdict=new.get("verdict"), newest_torch=new.get("torch"),
        boundary=boundary,
        blame=[f"{b.get('package')} {b.get('old')} -> {b.get('new')}" for b in bis.get("blame", [])],
        summary=list(data.get("summary") or []), folder=policy.relative(data.get("folder")) or "",
        comment=policy.cap(data.get("comment")))


def _report(policy: Policy, path: Path) -> m.ReportResult:
    for name, kind in (("report.md", "run"), ("bisect.md", "bisect"), ("matrix.md", "matrix"),
                       ("summary.md", "triage"), ("comment.md", "triage")):
        doc = path / name
        if doc.is_file() and not doc.is_symlink():
            verdict, summary = None, []
            if kind == "run" and (path / "result.json").is_file():
                r = read_result(path)
                verdict = r.verdict.value if isinstance(r, RunResult) else None
                summary = list(r.summary) if isinstance(r, RunResult) else []
            text = doc.read_text(encoding="utf-8", errors="replace")
            return m.ReportResult(folder=policy.relative(path) or "", kind=kind, verdict=verdict,
                                  summary=summary[:50], report=policy.cap(text) or "")
    raise AgentInputError(f"{policy.relative(path)}: no report.md, bisect.md or summary.md in this folder.",
                          field="folder")
