"""The CLI of `lab new` and `lab triage` (registered by lab/cli.py's last lines; kept in its own file
so the main CLI stays small). Like lab/cli.py it parses, shows progress and prints; the work is in
lab.issue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.cli import (
    _COLOURS,
    DepsOpt,
    EngineOpt,
    JobsOpt,
    JsonOpt,
    OutOpt,
    Progress,
    _engine_for,
    _fail,
    _fleet,
    _guard,
    _runs_root,
    command,
    err,
    out,
    with_deps,
)
from lab.core import exitcodes as codes

FromIssueOpt = Annotated[str | None, typer.Option(
    "--from-issue", help="A GitHub issue URL (GITHUB_TOKEN is used when set), or the issue saved as the API's "
    "JSON, Markdown or HTML.", show_default=False)]
DirOpt = Annotated[Path | None, typer.Option("-o", "--output", help="Folder for the scenario YAML and "
                                             "scripts/ (default: ./scenarios).", show_default=False)]


def _issue_errors(fn):
    """IssueError (the page) is bad input, exit 2; IssueFetchError (GitHub unreachable) infrastructure, 3."""
    from lab.issue.fetch import IssueError, IssueFetchError

    def body() -> None:
        try:
            fn()
        except IssueError as e:
            _fail(e, codes.BAD_INPUT)
        except IssueFetchError as e:
            _fail(e, codes.INFRASTRUCTURE)
    return body


def _show_inference(inf, written, as_json: bool) -> None:
    from lab.issue.write import report_json
    where = inf.page.url or inf.page.source
    err.print(f"[bold]{escape(written.scenario.name)}[/] from {escape(where)}", soft_wrap=True)
    for f in inf.facts:
        place = f"line {f.line}" if f.line else ("default" if f.default else "page")
        shown = f"[yellow]({place})[/]" if f.default else f"[dim]({place})[/]"
        err.print(f"  {f.name:<7} {escape(f.value)}  {shown} {escape(f.how)}", soft_wrap=True)
    for f in inf.fixups:
        err.print(f"  [cyan]fix-up[/]  {escape(f)}", soft_wrap=True)
    err.print(f"wrote {escape(str(written.yaml))}" + (f" and {escape(str(written.cpu_variant))}"
                                                      if written.cpu_variant else ""), soft_wrap=True)
    err.print(f"      {escape(str(written.script))}", soft_wrap=True)
    err.print(f"run it with: [bold]lab run {escape(str(written.cpu_variant or written.yaml))}[/]", soft_wrap=True)
    if as_json:
        out.print(json.dumps({**report_json(inf, written.yaml.stem), "yaml": str(written.yaml),
                              "script": str(written.script),
                              "cpu_variant": str(written.cpu_variant) if written.cpu_variant else None}),
                  markup=False)
    else:
        out.print(str(written.cpu_variant or written.yaml), markup=False)


def from_issue(source: str, output: Path, name: str | None, force: bool):
    from lab.issue.fetch import fetch_issue
    from lab.issue.infer import infer
    from lab.issue.write import write_inference
    inf = infer(fetch_issue(source))
    return inf, write_inference(inf, output, name, force)


@command("new")
def new_cmd(
    name: Annotated[str | None, typer.Argument(help="Scenario name (a slug such as my-bug); with --from-issue "
                                               "it defaults to issue-<number>.", show_default=False)] = None,
    source: FromIssueOpt = None,
    output: DirOpt = None,
    torch: Annotated[str, typer.Option("--torch", help="torch version of the skeleton.")] = "2.5.1",
    force: Annotated[bool, typer.Option("--force", help="Overwrite files that exist.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a new scenario: a commented skeleton and a script template (pt2 bug-report template), or,
    with --from-issue, one inferred from an issue page, saying what came from which page line."""
    folder = output or Path("scenarios")

    def body() -> None:
        if source is None:
            if not name:
                raise typer.BadParameter("give a NAME, or --from-issue SOURCE")
            from lab.issue.write import write_skeleton
            from lab.scenario.schema import check_version
            yaml_path, script = write_skeleton(name, folder, check_version(torch), force)
            err.print(f"wrote {escape(str(yaml_path))}\n      {escape(str(script))}\n"
                      f"edit both, then: [bold]lab run {escape(str(yaml_path))}[/]")
            out.print(str(yaml_path), markup=False)
            return
        inf, written = from_issue(source, folder, name, force)
        _show_inference(inf, written, as_json)
    _guard(_issue_errors(body))


@command("triage")
def triage_cmd(
    sources: Annotated[list[str] | None, typer.Argument(
        help="GitHub issue URLs, or issues saved as API JSON, Markdown or HTML; @FILE reads one per line. "
        "Several make one batch.", show_default=False)] = None,
    output: DirOpt = None,
    out_dir: OutOpt = None,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    deps: DepsOpt = None,
    from_file: Annotated[Path | None, typer.Option(
        "--from-file", help="A file of issue URLs or saved pages, one per line (# comments); makes a batch.",
        show_default=False)] = None,
    parallel: Annotated[int | None, typer.Option(
        "--parallel", help="A batch: how many issues are triaged at once (default: 2 per engine).",
        show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """From an issue to an answer: from-issue, a run on the page's version and arch, a run on the newest
    release if it reproduced, a bisection if they differ, the comparison and a comment to paste.
    Run it again to resume: finished steps are read from triage.json. Several pages (or @FILE,
    --from-file) are one batch with one summary (summary.md, summary.json); a rerun skips the
    issues that finished and did not change."""
    items = list(sources or [])
    if from_file is not None or len(items) != 1 or items[0].startswith("@"):
        from lab.cli_triage_batch import triage_batch
        triage_batch(items, from_file, output, out_dir, engines, jobs, deps, parallel, as_json)
        return
    source = items[0]

    def body() -> None:
        from lab.build.hostpip import discover
        from lab.build.image import check_release
        from lab.build.releases import candidates
        from lab.build.resolve import resolve
        from lab.drivers.bisect_run import run_bisect
        from lab.issue.triage import BisectStep, RunStep, TriageState, compare_seam, run_triage, summary_lines
        from lab.pipeline import run_case
        from lab.scenario.schema import load_scenario

        runs_root = _runs_root(out_dir)
        folder = output or Path("scenarios")
        host = discover()
        fleet = _fleet(engines, jobs)
        from lab.issue.triage_batch import triage_folder
        tri = triage_folder(runs_root, source)
        state = TriageState.load(tri / "triage.json", source)
        err.print(f"triage folder: {escape(str(tri))} (run the same command again to resume)", soft_wrap=True)

        def make():
            inf, written = from_issue(source, folder, None, True)
            _show_inference(inf, written, False)
            target = written.cpu_variant or written.yaml
            return str(target), written.scenario.name, inf.page.url, inf.torch, inf.arch.value

        def one(yaml_path: str, torch: str, arch: str) -> RunStep:
            case = resolve(with_deps(load_scenario(yaml_path), deps), torch=torch, arch=arch)
            check_release(case, host)
            engine = _engine_for(fleet, case)
            with Progress() as progress:
                outcome = run_case(case, engine, host, runs_root, progress)
            r = outcome.result
            colour = _COLOURS.get(r.verdict.value, "bold")
            err.print(f"  torch {torch} {arch}: [{colour}]{r.verdict.value}[/] ({escape(r.reason[:160])})")
            return RunStep(torch=torch, arch=arch, verdict=r.verdict.value, reason=r.reason, run_dir=str(r.run_dir),
                           key=r.content_key, parts=r.content_parts)

        def bis(yaml_path: str, old: str, new: str, arch: str) -> BisectStep:
            loaded = with_deps(load_scenario(yaml_path), deps)
            with Progress() as progress:
                run = run_bisect(loaded, yaml_path, old, new, arch, None, host, runs_root, progress, fleet=fleet)
            res = run.result
            return BisectStep(status=res.status, last_old=res.last_old, first_new=res.first_new,
                              folder=str(run.folder), summary=res.summary,
                              blame=[b.model_dump() for b in getattr(res, "blame", ())],
                              blame_fix=getattr(res, "blame_fix", None))

        def newest(arch: str) -> str:
            return candidates("torch", host=host, python="3.11", arch=arch)[-1]

        state = run_triage(state, tri, make_scenario=make, run=one, bisect=bis, newest=newest,
                           compare=compare_seam(), deps=deps,
                           note=lambda step, msg: err.print(f"[dim]{step}[/] {escape(msg)}", soft_wrap=True))
        err.print("[bold]answer:[/]")
        for line in summary_lines(state):
            err.print(f"  {escape(line)}", soft_wrap=True)
        if state.compare.get("why"):
            err.print(f"  [dim]{escape(state.compare['why'])}[/]", soft_wrap=True)
        err.print(f"comment: {escape(str(tri / 'comment.md'))}", soft_wrap=True)
        if as_json:
            from dataclasses import asdict
            out.print(json.dumps({**asdict(state), "summary": summary_lines(state), "folder": str(tri)}),
                      markup=False)
        else:
            out.print("\n".join(summary_lines(state)), markup=False)
    _guard(_issue_errors(body))
