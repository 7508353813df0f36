"""`lab replay`: check a bundle, show what it would build and run, ask, rebuild it with this lab's
templates, rerun it and compare the verdict and evidence with the bundled ones."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.bundle.replay import Built, discard_replay, execute_replay, limit_lines, prepare_replay
from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import JsonOpt, OutOpt
from lab.cli.output import COLOURS, Progress, err, print_json
from lab.core import exitcodes as codes
from lab.core.records import format_bytes
from lab.engine.docker_engine import Engine
from lab.image.hostpip import discover

DECLINED = codes.DECLINED  # `lab replay` answered no, or no TTY and no --yes: nothing was built or run


def replay(
    bundle: Annotated[Path, typer.Argument(help="A bundle made by `lab bundle`.", show_default=False)],
    out_dir: OutOpt = None,
    allow_network: Annotated[bool, typer.Option("--allow-network", help="Let the script use the network, "
                                                "if the bundled scenario asks for it.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Build and run without asking (the summary is "
                                      "still printed). Without a terminal and without --yes, replay refuses "
                                      "(exit 4).")] = False,
    bundled_dockerfile: Annotated[bool, typer.Option(
        "--bundled-dockerfile", help="UNSAFE: build the bundle's own Dockerfile instead of this lab's "
        "re-render of its scenario. Its RUN steps run at build time, as root, without network.")] = False,
    allow_source_builds: Annotated[bool, typer.Option(
        "--allow-source-builds", help="UNSAFE: let pip inside the build install what is not a wheel resolved "
        "on this host (a direct URL, a VCS or path reference, an sdist), with the engine's default network "
        "and no credentials. Their build code runs at build time.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a bundle, show what it would build and run, ask, then rebuild it with this lab's templates,
    rerun it and compare the verdict and evidence with the bundled ones. Exit 4 when you decline, or when
    there is no terminal to ask on and no --yes."""
    def body() -> None:
        runs_root = inputs.runs_root(out_dir)
        engine = Engine.connect()
        plan = prepare_replay(bundle, runs_root, engine.arch, allow_network=allow_network,
                              bundled_dockerfile=bundled_dockerfile, allow_source_builds=allow_source_builds)
        try:
            _show_replay_plan(plan)
            if not _confirm_replay(yes):
                raise typer.Exit(DECLINED)
            with Progress() as progress:
                outcome = execute_replay(plan, engine, discover(), progress)
        finally:
            discard_replay(plan)
        original, result = outcome.original, outcome.result
        err.print(f"original: {original.verdict.value} ({escape(original.reason)})")
        colour = COLOURS.get(result.verdict.value, "bold")
        err.print(f"replay:   [{colour}]{result.verdict.value}[/] ({escape(result.reason)})")
        if outcome.comparison.same:
            err.print("[bold green]same verdict, same signature[/]")
        else:
            err.print("[bold yellow]different:[/]")
            for line in outcome.comparison.lines:
                err.print(f"  - {escape(line)}")
        err.print(f"report:   {outcome.run_dir / 'report.md'}")
        if as_json:
            print_json({**result.to_json(), "replay": {
                "same": outcome.comparison.same, "differences": [] if outcome.comparison.same else
                list(outcome.comparison.lines), "original_verdict": original.verdict.value,
                "dockerfile_same_as_this_lab": outcome.dockerfile_same_as_this_lab,
                "dockerfile_built": outcome.built.value}})
    guard(body)


def _show_replay_plan(plan) -> None:
    """What a replay will build and run, on stderr, before anything happens."""
    m, case, script = plan.manifest, plan.case, plan.script

    def row(name: str, value: str) -> None:
        err.print(f"  {name:<16} ", end="")
        err.print(value, markup=False, emoji=False, highlight=False, soft_wrap=True)

    err.print(f"[bold]replay of {escape(str(plan.bundle))}[/]", soft_wrap=True)
    row("bundle", f"made {m.created} by torch-repro-lab {m.lab_version}, {len(m.files)} files")
    row("original", f"{case.name}: {plan.original.verdict.value}")
    row("base", f"{case.scenario.base} ({case.arch.platform}"
        + (", emulated with QEMU)" if plan.emulated else ", native)"))
    row("torch", case.torch + (f", backend {case.backend}" if case.backend else "")
        + (f", mode {case.mode}" if case.mode else ""))
    row("system packages", (", ".join(plan.system_packages) or "none")
        + (f" (and the lab's {', '.join(plan.lab_packages)})" if plan.lab_packages else ""))
    row("pip", ", ".join(plan.requirements))
    if plan.case.constraints:
        row("versions", f"exactly the original run's {len(plan.case.constraints)} (its pip freeze): "
            + ", ".join(plan.case.constraints))
    if plan.allow_source_builds:
        named = "; ".join(f"{r.requirement} ({r.kind})" for r in plan.source_requirements)
        err.print(f"  {'source builds':<16} [bold red]ALLOWED (--allow-source-builds): pip inside the build may "
                  f"fetch and build what is not a wheel resolved on this host{': ' + escape(named) if named else ''}"
                  "; that step gets the engine's default network, never this host's credentials[/]",
                  soft_wrap=True)
    else:
        row("build", "wheels resolved on this host from your indexes only; no network, no credentials"
            + (" (the system packages step gets the default network when the base lacks them)"
               if plan.built is Built.RENDERED else ""))
    row("GPU", "yes (all GPUs of the engine)" if plan.gpu else "no")
    for limit in limit_lines(plan):
        _limit_row(limit)
    row("environment", ", ".join(f"{k}={v}" for k, v in plan.env) or "none")
    row("script", f"{script.name} ({format_bytes(script.size)}, sha256 {script.sha256[:16]}...)"
        + (f", args: {' '.join(plan.args)}" if plan.args else ""))
    for note in script.notes:
        row("", f"note: {note}")
    width = len(str(len(script.lines)))
    for number, line in enumerate(script.lines, 1):
        err.print(f"    {number:>{width}} | {line}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    if script.more_lines:
        err.print(f"    ... and {script.more_lines} more line{'s' if script.more_lines != 1 else ''} "
                  f"(all of it: tar xzf {plan.bundle} {plan.script_in_bundle})",
                  markup=False, emoji=False, soft_wrap=True)
    if plan.masked:
        row("secrets", f"{', '.join(plan.masked)} were scrubbed by the bundle's author and are '***' here")
    if plan.bundled is None:
        row("Dockerfile", "the bundle has none; this lab's re-render of the scenario is built")
    elif plan.dockerfile_same:
        row("Dockerfile", "this lab's re-render of the scenario, identical to the bundled one")
    else:
        err.print("  [bold yellow]the bundled Dockerfile differs from this lab's re-render of its scenario:[/]")
        for line in plan.diff:
            err.print(f"    {line}", markup=False, emoji=False, highlight=False, soft_wrap=True)
        if plan.diff_cut:
            err.print(f"    ... and {plan.diff_cut} more diff lines", markup=False, soft_wrap=True)
        row("Dockerfile", "the bundle's own (--bundled-dockerfile)" if plan.built is Built.BUNDLED
            else "this lab's re-render is built, not the bundled one")
    if plan.built is Built.BUNDLED:
        err.print("[bold red]WARNING:[/] --bundled-dockerfile builds the bundle's own Dockerfile. Whoever made or "
                  "edited the bundle wrote its RUN steps, and they run NOW, at build time, as root in a build "
                  "container (without network and without this host's credentials, but with its CA bundle in "
                  "the build context), before any of the lab's confinement applies. Read the Dockerfile above "
                  "before you go on.", soft_wrap=True)


def _limit_row(limit) -> None:
    """One limit of the summary; a value above this lab's default in bold red, saying so."""
    err.print(f"  {limit.name:<16} ", end="")
    if limit.above is None:
        err.print(limit.value, markup=False, emoji=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"[bold red]{escape(limit.value)} (above this lab's default {escape(limit.above)})[/]",
                  emoji=False, highlight=False, soft_wrap=True)


def _confirm_replay(yes: bool) -> bool:
    """Whether to go on: --yes, or the user's answer on a terminal (no by default). Without a
    terminal and without --yes, no: a stranger's bundle is built only when someone said so."""
    if yes:
        err.print("--yes: building and running without asking.")
        return True
    if not sys.stdin.isatty():
        err.print(f"no terminal to ask on (stdin is not a TTY) and no --yes, so nothing was built or run, and "
                  f"nothing was kept (exit {DECLINED}): a replay builds and runs a stranger's bundle only when you "
                  "say so. Read the summary above, then run the same command again with --yes to build and run "
                  "it.", soft_wrap=True)
        return False
    try:
        agreed = typer.confirm("Build this image and run the script?", default=False, err=True)
    except typer.Abort:
        agreed = False
    if not agreed:
        err.print(f"declined: nothing was built or run, and nothing was kept (exit {DECLINED}).")
    return agreed
