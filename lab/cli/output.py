"""Where the CLI writes: results on stdout (`out`), progress, warnings and errors on stderr (`err`)
through `logging` with rich's handler, and the progress display of long work."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console, Group
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler
from rich.markup import escape

from lab.core.errors import LabError
from lab.core.scrub import redact_urls

# Lines are wrapped at the terminal's width on a terminal only: in a log file or a CI log, a path or
# a message stays on one line (rich would break it at 80 columns), so it can be searched and copied.
err = Console(stderr=True, highlight=False, soft_wrap=not (sys.stderr is not None and sys.stderr.isatty()))
out = Console(highlight=False, soft_wrap=True)
log = logging.getLogger("lab")

COLOURS = {"reproduced": "bold red", "not_reproduced": "bold green", "error": "bold yellow",
           "timeout": "bold yellow", "flaky": "bold magenta", "mixed": "bold magenta",
           "failed_differently": "bold dark_orange"}


@dataclass
class Output:
    """-v/-q/--debug, given before or after the command name."""
    verbose: int = 0
    quiet: bool = False
    debug: bool = False


OUTPUT = Output()  # read as output.OUTPUT (tests replace it)


class _Handler(RichHandler):
    """rich's handler; without --debug a message is printed as it is, like the rest of stderr (the
    stock layout is a grid that pads every line to the terminal's width)."""

    def render(self, *, record, traceback, message_renderable):
        if not OUTPUT.debug:
            return message_renderable if traceback is None else Group(message_renderable, traceback)
        return super().render(record=record, traceback=traceback, message_renderable=message_renderable)


def set_output(verbose: int = 0, quiet: bool = False, debug: bool = False) -> None:
    """Flags given before and after the command name add up; the last call configures logging."""
    OUTPUT.verbose = max(OUTPUT.verbose, verbose)
    OUTPUT.quiet = OUTPUT.quiet or quiet
    OUTPUT.debug = OUTPUT.debug or debug
    level = (logging.DEBUG if OUTPUT.debug or OUTPUT.verbose else
             logging.WARNING if OUTPUT.quiet else logging.INFO)
    handler = _Handler(console=err, show_time=OUTPUT.debug, show_level=OUTPUT.debug,
                       show_path=OUTPUT.debug, highlighter=NullHighlighter(), markup=False,
                       rich_tracebacks=True, keywords=[])
    lab_log = logging.getLogger("lab")
    lab_log.handlers[:] = [handler]
    lab_log.setLevel(level)
    lab_log.propagate = False
    root = logging.getLogger()
    if OUTPUT.debug or OUTPUT.verbose > 1:  # -vv / --debug: the libraries' debug messages too
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG)


def fail(error: LabError | str, code: int) -> NoReturn:
    """One paragraph on stderr, then exit with `code`."""
    err.print(f"[bold red]error:[/] {escape(redact_urls(str(error)))}")  # an index's URL is a secret
    raise typer.Exit(code)


def say(message: str, level: int = logging.INFO) -> None:
    """A line of progress in rich markup (the caller escapes what it did not write)."""
    log.log(level, message, extra={"markup": True})


def clip(message: str, limit: int) -> str:
    """`message` cut to `limit` characters, and said to be cut (the full text is in the log with -v)."""
    return message if len(message) <= limit else message[: limit - 2].rstrip() + " …"


class Progress:
    """Progress of long work on stderr: build steps stay on screen, the rest updates one status line
    (no status line with -q; with -v every message stays on screen)."""

    SHOWN = ("base", "run", "diagnose", "ablate", "bisect", "replay", "site", "cache", "deps", "blame", "slurm")

    def __init__(self) -> None:
        self._status = None if OUTPUT.quiet else err.status("starting", spinner="dots")

    def __enter__(self) -> Progress:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def __call__(self, stage: str, message: str) -> None:
        message = redact_urls(message.strip())  # pip and apt name the indexes and mirrors they read
        if not message:
            return
        if stage == "build" and message.startswith("Step "):
            say(f"[dim]build[/] {escape(clip(' '.join(message.split()), 160))}")  # a step's lines, joined
        elif stage in self.SHOWN and not message[0].isdigit():
            say(f"[dim]{stage}[/] {escape(clip(message, 400))}")
        else:
            say(f"[dim]{stage}[/] {escape(message)}", logging.DEBUG)
        if self._status is not None:
            self._status.update(f"[bold]{stage}[/] {escape(message[:120])}")


def print_outcome(outcome) -> None:
    """A run's verdict, its summary and where its report is."""
    r = outcome.result
    colour = COLOURS.get(r.verdict.value, "bold")
    err.print(f"verdict: [{colour}]{r.verdict.value}[/] ({escape(r.reason)})")
    for sentence in r.summary:
        err.print(f"  - {escape(sentence)}")
    report = Path(r.run_dir) / "report.md"
    err.print(f"report:  {report}")
    if report.with_name("report.html").exists():
        err.print(f"         {report.with_name('report.html')} (open it in a browser)")


def print_json(document: object) -> None:
    """The one JSON object that ends stdout with --json."""
    out.print(json.dumps(document), markup=False)
