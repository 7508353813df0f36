"""The `lab` typer app. Each command lives in a command module; the app knows each command's name
and where it is (COMMANDS, in the order `lab --help` lists them) and imports a command's module
only when that command is asked for (its help included), so `lab --version` or `lab show` does not
load the Docker SDK, the pipeline and every driver. Every command gets -v/-q/--debug, which may
also come before the command name.

Messages go through `logging` with rich's handler on stderr, so stdout holds only results and, with
--json, ends with one JSON object. Exit codes are in lab.core.exitcodes.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from lab import __version__
from lab.cli.options import DebugOpt, QuietOpt, VerboseOpt, with_output_flags
from lab.cli.output import fail, out, set_output
from lab.core import exitcodes as codes
from lab.core.errors import EngineError

# name -> (module in lab/cli/, its function; `app` for a group of commands)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("scenarios", "list_cmd"),
    "show": ("scenarios", "show"),
    "render": ("scenarios", "render"),
    "build": ("build", "build"),
    "run": ("run", "run"),
    "bisect": ("bisect", "bisect"),
    "compare": ("compare", "compare"),
    "comment": ("compare", "comment"),
    "localize": ("compare", "localize_cmd"),
    "engines": ("engines", "engines"),
    "bundle": ("bundle", "bundle"),
    "replay": ("replay", "replay"),
    "runs": ("history", "runs"),
    "report": ("history", "report"),
    "build-base": ("build", "build_base"),
    "doctor": ("doctor", "doctor"),
    "clean": ("doctor", "clean"),
    "schema": ("settings", "schema"),
    "config": ("settings", "config"),
    "new": ("issue", "new"),
    "triage": ("issue", "triage"),
    "mcp": ("mcp", "mcp"),
    "cache": ("cache", "app"),
}


def load_command(name: str) -> TyperCommand | TyperGroup:
    """The click command for `name`, its module imported now (importlib, not an import statement: the
    point is to import it only when it is used)."""
    module, attr = COMMANDS[name]
    target = getattr(importlib.import_module(f"lab.cli.{module}"), attr)
    if isinstance(target, typer.Typer):  # a group of commands (lab cache ...)
        command = typer.main.get_command(target)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(with_output_flags(target))
        command = typer.main.get_command(single)
    command.name = name
    return command  # type: ignore[return-value]


class _Commands(TyperGroup):
    """typer's group, with each command made from its module on first use."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*COMMANDS, *(n for n in super().list_commands(ctx) if n not in COMMANDS)]

    def get_command(self, ctx: typer.Context, cmd_name: str):
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(cls=_Commands, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A containerized reproduction lab for PyTorch bugs.")


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


def main() -> None:  # pragma: no cover
    try:
        app(prog_name="lab")
    except EngineError as e:
        fail(e, codes.INFRASTRUCTURE)
