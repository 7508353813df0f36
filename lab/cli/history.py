"""`lab runs` and `lab report`: the run history (query, flaky cases, garbage collection) and the HTML
pages of run, bisect and matrix folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import ArchOpt, JsonOpt, OutOpt, TorchOpt
from lab.cli.output import COLOURS, err, log, out, print_json
from lab.history.index import RunIndex, parse_age, parse_since
from lab.report.html import write_folder_html


def runs(
    scenario: Annotated[str | None, typer.Argument(help="Only this scenario's runs (its name).")] = None,
    torch: TorchOpt = None,
    arch: ArchOpt = None,
    verdict: Annotated[str | None, typer.Option("--verdict", help="Only runs with this verdict.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only runs started on or after this date "
                                              "(YYYY-MM-DD, UTC).")] = None,
    flaky: Annotated[bool, typer.Option("--flaky", help="Cases whose runs reached different verdicts, "
                                        "with their reproduction rate.")] = False,
    gc: Annotated[bool, typer.Option("--gc", help="Remove old run folders the lab made for your runs (never the "
                                     "newest of a case, nor what a bisection or a bundle refers to).")] = False,
    older_than: Annotated[str | None, typer.Option("--older-than", help="With --gc: folders older than this "
                                                   "(30d, 12h, 2w).")] = None,
    keep: Annotated[int | None, typer.Option("--keep", min=0, help="With --gc: keep the newest N runs of "
                                             "each case.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --gc: say what would go, remove nothing.")]
    = False,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The run history: every run, probe, matrix cell and replay under the runs folder, newest first."""
    def body() -> None:
        index = RunIndex(inputs.runs_root(out_dir))
        if gc:
            done = index.gc(parse_age(older_than) if older_than else None, keep, dry_run=dry_run)
            _notes(index)
            verb = "would remove" if dry_run else "removed"
            for path in done.removed:
                err.print(f"{verb} {escape(str(path))}", soft_wrap=True)
            for path in done.kept_referenced:
                err.print(f"kept {escape(str(path))} (a bisection or a bundle refers to it)", soft_wrap=True)
            err.print(f"{verb} {len(done.removed)} run folder(s), kept {len(done.kept_referenced)} referenced")
            if done.not_marked:
                err.print(f"left alone {len(done.not_marked)} folder(s) the lab did not mark as made for your runs "
                          "(made by an older lab, or unpacked from a bundle): remove those by hand")
            if as_json:
                print_json({"removed": [str(p) for p in done.removed], "dry_run": dry_run,
                                      "kept": [str(p) for p in done.kept_referenced],
                                      "not_marked": [str(p) for p in done.not_marked]})
            return
        if flaky:
            cases = index.flaky(scenario)
            _notes(index)
            table = Table("case", "runs", "reproduced", "rate")
            for c in cases:
                table.add_row(escape(c.case), str(c.runs), f"{c.reproduced}/{c.runnable}", f"{c.rate:.0%}")
            err.print(table if cases else "no flaky case: every case's runs agree")
            if as_json:
                print_json({"flaky": [c.to_json() for c in cases]})
            return
        entries = index.query(scenario, torch, arch, verdict, parse_since(since) if since else None)
        _notes(index)
        table = Table("started", "case", "kind", "verdict", "run folder")
        for e in entries:
            colour = COLOURS.get(e.verdict, "bold")
            table.add_row(e.started, escape(e.case), e.kind, f"[{colour}]{e.verdict}[/]", escape(str(e.path)))
        if as_json:
            err.print(table if entries else "no run matches")
            print_json({"runs": [e.to_json() for e in entries]})
        else:
            out.print(table if entries else "no run matches")
    guard(body)


def _notes(index) -> None:
    for note in index.notes:
        log.warning(note)


def report(
    folders: Annotated[list[Path], typer.Argument(help="Run, bisect or matrix folders.", exists=True,
                                                  file_okay=False, resolve_path=True)],
) -> None:
    """(Re)write report.html in run, bisect and matrix folders (a self-contained page: open it in any browser)."""
    def body() -> None:
        for folder in folders:
            out.print(str(write_folder_html(folder)), markup=False, soft_wrap=True)
    guard(body)
