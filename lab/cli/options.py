"""The options several commands share, with their help texts (one place, so `lab X --help` says the
same thing in every command), and -v/-q/--debug, which every command takes."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from lab.cli.output import set_output

ScenarioArg = Annotated[str, typer.Argument(help="A name from the project's scenarios/ or the shipped ones, "
                                            "or a path to a YAML file.", show_default=False)]
TorchOpt = Annotated[str | None, typer.Option("--torch", help="torch version (default: the scenario's).")]
ArchOpt = Annotated[str | None, typer.Option("--arch", help="amd64 or arm64 (default: the scenario's, or the "
                                             "default_arch setting where it lists several).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="End stdout with one JSON object.")]
DepsOpt = Annotated[str | None, typer.Option(
    "--deps", help="How everything but torch resolves: latest (today's index), era (as of the torch release's "
    "upload date plus a week) or a date such as 2024-04-01 (default: the scenario's `deps`, else latest).",
    show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Runs folder (default: the runs_dir setting, ./runs).")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", help="Run on this engine only: a Docker context name, a DOCKER_HOST URL (unix://, tcp://, "
    "ssh://), or `local` (this host, no container); repeat it for several. Default: the current engine and "
    "the `engines` setting.", show_default=False)]
PythonEnvOpt = Annotated[str, typer.Option(
    "--python-env", help="The local engine's Python: `venv` (a venv per case made with uv, cached) or `current` "
    "(the interpreter already there, LAB_LOCAL_PYTHON or the lab's own, when its torch is the case's).")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-script", help="Let the local engine run the script where bubblewrap cannot confine it (the report "
    "says \"not confined\").")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", help="How many cases run at once across the engines (default: each engine's slots, "
    "one per 2 CPUs and 4 GiB of memory; see `lab engines`).", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Scenario variable NAME=VALUE.")]

VerboseOpt = Annotated[int, typer.Option("-v", "--verbose", count=True, show_default=False,
                                         help="More detail on stderr: every progress message (-vv: the "
                                              "libraries' debug messages too).")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="No progress on stderr: results, warnings and "
                                        "errors only.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Debug messages, and the traceback of an unexpected "
                                        "error.")]
_COMMON = [inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=0, annotation=VerboseOpt),
           inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=QuietOpt),
           inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOpt)]


def with_output_flags(fn: Callable) -> Callable:
    """`fn` with -v/-q/--debug added to its parameters; they configure the output, then `fn` runs."""
    signature = inspect.signature(fn, eval_str=True)

    @functools.wraps(fn)
    def wrapper(*a, verbose: int = 0, quiet: bool = False, debug: bool = False, **kw):
        set_output(verbose, quiet, debug)
        return fn(*a, **kw)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *_COMMON])
    return wrapper
