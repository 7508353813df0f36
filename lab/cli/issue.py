"""`lab new` and `lab triage`: a scenario from a skeleton or an issue page (saying what came from which
page line), and from an issue to an answer (runs, a bisection, a comparison, a comment). The work is
in lab.issue; this module parses, shows progress and prints."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.build.hostpip import discover
from lab.build.image import check_release
from lab.build.releases import candidates
from lab.build.resolve import resolve
from lab.cli import inputs, routing
from lab.cli.guard import guard
from lab.cli.options import DepsOpt, EngineOpt, JobsOpt, JsonOpt, OutOpt
from lab.cli.output import COLOURS, Progress, err, out, print_json
from lab.drivers.bisect_run import BisectRequest, run_bisect
from lab.issue.fetch import fetch_issue
from lab.issue.infer import infer
from lab.issue.triage import BisectStep, RunStep, TriageState, compare_seam, run_triage, summary_lines
from lab.issue.write import report_json, write_inference, write_skeleton
from lab.pipeline import run_case
from lab.scenario.lookup import load_scenario
from lab.scenario.model import check_version

FromIssueOpt = Annotated[str | None, typer.Option(
    "--from-issue", help="A GitHub issue URL (GITHUB_TOKEN is used when set), or the issue saved as the API's "
    "JSON, Markdown or HTML.", show_default=False)]
DirOpt = Annotated[Path | None, typer.Option("-o", "--output", help="Folder for the scenario YAML and "
                                             "scripts/ (default: ./scenarios).", show_default=False)]


def _show_inference(inf, written, as_json: bool) -> None:
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
        print_json({**report_json(inf, written.yaml.stem), "yaml": str(written.yaml),
                              "script": str(written.script),
                              "cpu_variant": str(written.cpu_variant) if written.cpu_variant else None})
    else:
        out.print(str(written.cpu_variant or written.yaml), markup=False)


def from_issue(source: str, output: Path, name: str | None, force: bool):
    inf = infer(fetch_issue(source))
    return inf, write_inference(inf, output, name, force)


def new(
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
            yaml_path, script = write_skeleton(name, folder, check_version(torch), force)
            err.print(f"wrote {escape(str(yaml_path))}\n      {escape(str(script))}\n"
                      f"edit both, then: [bold]lab run {escape(str(yaml_path))}[/]")
            out.print(str(yaml_path), markup=False)
            return
        inf, written = from_issue(source, folder, name, force)
        _show_inference(inf, written, as_json)
    guard(body)


def triage(
    source: Annotated[str, typer.Argument(help="A GitHub issue URL, or the issue saved as API JSON, Markdown "
                                          "or HTML.", show_default=False)],
    output: DirOpt = None,
    out_dir: OutOpt = None,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    deps: DepsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """From an issue to an answer: from-issue, a run on the page's version and arch, a run on the newest
    release if it reproduced, a bisection if they differ, the comparison and a comment to paste.
    Run it again to resume: finished steps are read from triage.json."""
    def body() -> None:
        runs_root = inputs.runs_root(out_dir)
        folder = output or Path("scenarios")
        host = discover()
        fleet = routing.fleet(engines, jobs)
        key = "".join(c if c.isalnum() else "-" for c in source.rstrip("/").rsplit("/", 2)[-1])[-60:] or "page"
        tri = runs_root / "triage" / key
        state = TriageState.load(tri / "triage.json", source)
        err.print(f"triage folder: {escape(str(tri))} (run the same command again to resume)", soft_wrap=True)

        def make():
            inf, written = from_issue(source, folder, None, True)
            _show_inference(inf, written, False)
            target = written.cpu_variant or written.yaml
            return str(target), written.scenario.name, inf.page.url, inf.torch, inf.arch.value

        def one(yaml_path: str, torch: str, arch: str) -> RunStep:
            case = resolve(inputs.with_deps(load_scenario(yaml_path), deps), torch=torch, arch=arch)
            check_release(case, host)
            engine = routing.engine_for(fleet, case)
            with Progress() as progress:
                outcome = run_case(case, engine, host, runs_root, progress)
            r = outcome.result
            colour = COLOURS.get(r.verdict.value, "bold")
            err.print(f"  torch {torch} {arch}: [{colour}]{r.verdict.value}[/] ({escape(r.reason[:160])})")
            return RunStep(torch=torch, arch=arch, verdict=r.verdict.value, reason=r.reason, run_dir=str(r.run_dir),
                           key=r.content_key, parts=r.content_parts)

        def bis(yaml_path: str, old: str, new: str, arch: str) -> BisectStep:
            loaded = inputs.with_deps(load_scenario(yaml_path), deps)
            with Progress() as progress:
                run = run_bisect(BisectRequest(loaded, yaml_path, old, new, arch), host, runs_root, progress,
                                 fleet=fleet)
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
            print_json({**asdict(state), "summary": summary_lines(state), "folder": str(tri)})
        else:
            out.print("\n".join(summary_lines(state)), markup=False)
    guard(body)
