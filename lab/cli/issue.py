"""`lab new` and `lab triage`: a scenario from a skeleton or an issue page (saying what came from which
page line), and from an issue to an answer (runs, a bisection, a comparison, a comment). The work is
in lab.issue; this module parses, shows progress and prints."""

from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.cli import inputs, routing
from lab.cli import output as output_state
from lab.cli.guard import guard
from lab.cli.options import DepsOpt, EngineOpt, JobsOpt, JsonOpt, OutOpt
from lab.cli.output import COLOURS, Progress, err, out, print_json
from lab.drivers.bisect_run import BisectRequest, run_bisect
from lab.image.builder import check_release
from lab.image.hostpip import discover
from lab.image.releases import candidates
from lab.image.resolve import resolve
from lab.issue.fetch import fetch_issue
from lab.issue.infer import infer
from lab.issue.triage import BisectStep, RunStep, TriageState, compare_seam, run_triage, summary_lines
from lab.issue.triage_batch import batch_folder, local_runner, read_sources, run_batch, slurm_runner, triage_folder
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
        _triage_batch(items, from_file, output, out_dir, engines, jobs, deps, parallel, as_json)
        return
    source = items[0]

    def body() -> None:
        runs_root = inputs.runs_root(out_dir)
        folder = output or Path("scenarios")
        host = discover()
        fleet = routing.fleet(engines, jobs)
        tri = triage_folder(runs_root, source)
        state = TriageState.load(tri / "triage.json", source)
        err.print(f"triage folder: {escape(str(tri))} (run the same command again to resume)", soft_wrap=True)

        def make():
            inf, written = from_issue(source, folder, None, True)
            _show_inference(inf, written, False)
            target = written.cpu_variant or written.yaml
            return str(target), written.scenario.name, inf.page.url, inf.torch, inf.arch.value, inf.earlier

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
                request = BisectRequest(loaded, yaml_path, old, new, arch, emulated_slots=jobs is None,
                                        probe_details=bool(inputs.settings()["bisect.probe_details"]))
                run = run_bisect(request, host, runs_root, progress,
                                 fleet=fleet)
            res = run.result
            return BisectStep(status=res.status, last_old=res.last_old, first_new=res.first_new,
                              folder=str(run.folder), summary=res.summary,
                              blame=[b.model_dump() for b in getattr(res, "blame", ())],
                              blame_fix=getattr(res, "blame_fix", None),
                              blame_summary=getattr(res, "blame_summary", None) or "")

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


def _triage_batch(items: list[str], from_file: Path | None, output: Path | None, out_dir: Path | None,
                 engines: list[str] | None, jobs: int | None, deps: str | None, parallel: int | None,
                 as_json: bool) -> None:
    exit_code: list[int] = []

    def body() -> None:
        sources = read_sources(items, from_file)
        runs_root = inputs.runs_root(out_dir)
        fleet = routing.fleet(engines, jobs)  # every engine answers before the first issue starts
        names = list(fleet.engines)
        at_once = parallel if parallel is not None else 2 * max(1, len(names))
        if at_once < 1:
            raise typer.BadParameter(f"--parallel must be 1 or more, not {at_once}", param_hint="--parallel")
        extra = [*(["--deps", deps] if deps else []), *(["--jobs", str(jobs)] if jobs else [])]
        rotate = names if len(names) > 1 else []
        partition = names[0].removeprefix("slurm:") if len(names) == 1 and names[0].startswith("slurm:") else None
        if not rotate and partition is None:
            for e in engines or ():
                extra += ["--engine", e]
        folder = batch_folder(runs_root, sources)
        how = (f"as one Slurm job array on partition {escape(partition)}" if partition else
               f"up to {at_once} at once" + (f" on {len(rotate)} engines" if rotate else ""))
        err.print(f"triage of {len(sources)} issues, {how}; summary: {escape(str(folder))}", soft_wrap=True)
        err.print("run the same command again to resume: finished issues that did not change are reused",
                  soft_wrap=True)
        done = [0]
        lock = threading.Lock()
        status = None if output_state.OUTPUT.quiet else err.status(f"triage 0/{len(sources)}", spinner="dots")

        def started(job, engine) -> None:
            err.print(f"[dim]start[/] {escape(job.source)}" + (f" on {escape(engine)}" if engine else ""),
                      soft_wrap=True)

        def note(source: str, message: str) -> None:
            with lock:
                if message in ("done", "reused") or message.startswith(("bad_input", "infrastructure", "failed",
                                                                        "interrupted", "finished earlier")):
                    done[0] += 1
                colour = "red" if message.startswith(("bad_input", "infrastructure", "failed")) else "dim"
                err.print(f"[{colour}]{escape(source)}[/] {escape(message)}", soft_wrap=True)
                if status is not None:
                    status.update(f"triage {done[0]}/{len(sources)}")

        runner = (slurm_runner(runs_root, output or Path("scenarios"), partition, extra, started) if partition
                  else local_runner(runs_root, output or Path("scenarios"), at_once, rotate, extra, started))
        if status is not None:
            status.start()
        try:
            summary = run_batch(sources, runs_root, runner, folder=folder, note=note)
        finally:
            if status is not None:
                status.stop()
        for r in summary.issues:
            colour = COLOURS.get(r.page_verdict or "", "bold")
            where = r.upstream or r.source
            page = f"[{colour}]{r.page_verdict}[/] on {r.page_torch}" if r.page_verdict else r.status
            new = f", {r.newest_verdict} on {r.newest_torch}" if r.newest_verdict and r.newest_torch != r.page_torch \
                else ""
            extra_words = "".join([f", boundary {r.boundary}" if r.boundary else "",
                                   ", failed differently" if r.failed_differently else "",
                                   ", no oracle" if r.no_oracle else "",
                                   f": {r.error}" if r.error else ""])
            err.print(f"  {escape(where)}: {page}{escape(new)}{escape(extra_words)}", soft_wrap=True)
        err.print(f"summary: {escape(str(folder / 'summary.md'))}", soft_wrap=True)
        if as_json:
            out.print(summary.model_dump_json(), markup=False)
        else:
            out.print(str(folder / "summary.json"), markup=False)
        exit_code.append(summary.exit_code)
    guard(body)
    if exit_code and exit_code[0]:
        raise typer.Exit(exit_code[0])
