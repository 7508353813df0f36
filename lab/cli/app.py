"""The `lab` typer app: every command module's commands registered in the order `lab --help` lists
them, each with -v/-q/--debug added to its own options (they may also come before the command name).

Messages go through `logging` with rich's handler on stderr, so stdout holds only results and, with
--json, ends with one JSON object. Exit codes are in lab.core.exitcodes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated

import typer

from lab import __version__
from lab.cli import bisect, build, bundle, cache, compare, doctor, engines, history, issue, replay, run, scenarios
from lab.cli import settings as settings_cmds
from lab.cli.guard import fail
from lab.cli.options import DebugOpt, QuietOpt, VerboseOpt
from lab.cli.output import out, set_output
from lab.core import exitcodes as codes
from lab.core.errors import EngineError

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A containerized reproduction lab for PyTorch bugs.")
cache_app = typer.Typer(no_args_is_help=True, help="The lab's cache: what it holds, its cap, and pruning it.")

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


def _show_version(value: bool) -> None:
    if value:
        out.print(f"torch-repro-lab {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: VerboseOpt = 0, quiet: QuietOpt = False, debug: DebugOpt = False,
) -> None:
    """A containerized reproduction lab for PyTorch bugs."""
    set_output(verbose, quiet, debug)


COMMANDS: list[tuple[str, Callable]] = [
    ("list", scenarios.list_cmd),
    ("show", scenarios.show),
    ("render", scenarios.render),
    ("build", build.build),
    ("run", run.run),
    ("bisect", bisect.bisect),
    ("compare", compare.compare),
    ("comment", compare.comment),
    ("localize", compare.localize_cmd),
    ("engines", engines.engines),
    ("bundle", bundle.bundle),
    ("replay", replay.replay),
    ("runs", history.runs),
    ("report", history.report),
    ("build-base", build.build_base),
    ("doctor", doctor.doctor),
    ("clean", doctor.clean),
    ("schema", settings_cmds.schema),
    ("config", settings_cmds.config),
    ("new", issue.new),
    ("triage", issue.triage),
]
CACHE_COMMANDS: list[tuple[str, Callable]] = [("info", cache.info), ("prune", cache.prune)]

for _name, _fn in COMMANDS:
    app.command(_name)(with_output_flags(_fn))
for _name, _fn in CACHE_COMMANDS:
    cache_app.command(_name)(with_output_flags(_fn))
app.add_typer(cache_app, name="cache")


def main() -> None:  # pragma: no cover
    try:
        app(prog_name="lab")
    except EngineError as e:
        fail(e, codes.INFRASTRUCTURE)
