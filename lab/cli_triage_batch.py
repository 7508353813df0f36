"""The CLI of `lab triage` over several pages (called by lab/cli_issue.py's `triage` when it gets more
than one page, @FILE or --from-file). It parses, shows progress and prints; the batch is
lab.issue.triage_batch."""

from __future__ import annotations

import threading
from pathlib import Path

import typer

from lab.cli import _COLOURS, _OUTPUT, _fleet, _guard, _runs_root, err, escape, out
from lab.cli_issue import _issue_errors


def triage_batch(items: list[str], from_file: Path | None, output: Path | None, out_dir: Path | None,
                 engines: list[str] | None, jobs: int | None, deps: str | None, parallel: int | None,
                 as_json: bool) -> None:
    exit_code: list[int] = []

    def body() -> None:
        from lab.issue.triage_batch import batch_folder, local_runner, read_sources, run_batch
        sources = read_sources(items, from_file)
        runs_root = _runs_root(out_dir)
        fleet = _fleet(engines, jobs)  # every engine answers before the first issue starts
        names = list(fleet.engines)
        at_once = parallel if parallel is not None else 2 * max(1, len(names))
        if at_once < 1:
            raise typer.BadParameter(f"--parallel must be 1 or more, not {at_once}", param_hint="--parallel")
        extra = [*(["--deps", deps] if deps else []), *(["--jobs", str(jobs)] if jobs else [])]
        rotate = names if len(names) > 1 else []
        if not rotate:
            for e in engines or ():
                extra += ["--engine", e]
        folder = batch_folder(runs_root, sources)
        err.print(f"triage of {len(sources)} issues, up to {at_once} at once"
                  + (f" on {len(rotate)} engines" if rotate else "") + f"; summary: {escape(str(folder))}",
                  soft_wrap=True)
        err.print("run the same command again to resume: finished issues that did not change are reused",
                  soft_wrap=True)
        done = [0]
        lock = threading.Lock()
        status = None if _OUTPUT.quiet else err.status(f"triage 0/{len(sources)}", spinner="dots")

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

        runner = local_runner(runs_root, output or Path("scenarios"), at_once, rotate, extra, started)
        if status is not None:
            status.start()
        try:
            summary = run_batch(sources, runs_root, runner, folder=folder, note=note)
        finally:
            if status is not None:
                status.stop()
        for r in summary.issues:
            colour = _COLOURS.get(r.page_verdict or "", "bold")
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
    _guard(_issue_errors(body))
    if exit_code and exit_code[0]:
        raise typer.Exit(exit_code[0])
