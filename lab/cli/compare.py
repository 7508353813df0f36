"""`lab compare`, `lab comment` and `lab localize`: what changed between two runs, a comment to paste
upstream, and where in the compiler a failure lives."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.cli import inputs, routing
from lab.cli.guard import guard
from lab.cli.options import ArchOpt, EngineOpt, JsonOpt, OutOpt, ScenarioArg, TorchOpt
from lab.cli.output import Progress, err, out, print_json
from lab.compare.comment import render_comment
from lab.compare.diff import compare_runs, resolve_pair
from lab.core.results import BisectResult, read_document
from lab.drivers.localize import localize
from lab.image.hostpip import discover
from lab.report.run_folder import new_run_dir


def compare(
    a: Annotated[Path, typer.Argument(help="A run folder, or a bisect folder (its boundary pair).")],
    b: Annotated[Path | None, typer.Argument(help="The other run folder.", show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """What changed between two runs of one scenario, most telling first: verdict and exception, graph
    breaks, loaded libraries, pip packages, environment, Dockerfile."""
    def body() -> None:
        c = compare_runs(*resolve_pair(a, b))
        first: list[str] = []
        if b is None and (a / "bisect.json").is_file():  # dependencies first when they are the cause
            first = read_document(a / "bisect.json", BisectResult).blame_lines()
        for line in [*first, *c.summary]:
            (err if as_json else out).print(line, markup=False, highlight=False, soft_wrap=True)
        if as_json:
            print_json(c.to_json())
    guard(body)


def comment(
    folder: Annotated[Path, typer.Argument(help="A run folder or a bisect folder.")],
) -> None:
    """Print a Markdown comment ready to paste into a GitHub issue (secrets scrubbed as in bundles)."""
    def body() -> None:
        out.print(render_comment(folder).rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    guard(body)


def localize_cmd(
    scenario: ScenarioArg,
    torch: TorchOpt = None,
    arch: ArchOpt = None,
    out_dir: OutOpt = None,
    engines: EngineOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Localize a compile bug on one release: the backend ablation names the layer, then
    torch._inductor.compiler_bisector (where the release ships it) names the subsystem or pass."""
    def body() -> None:
        case = inputs.case(scenario, torch, arch)
        host = discover()
        engine = routing.engine_for(routing.fleet(engines, None), case)
        runs_root = inputs.runs_root(out_dir)
        with Progress() as progress:
            result = localize(case, engine, host, runs_root, new_run_dir(runs_root, case, suffix="localize"),
                              progress)
        err.print(f"localize: [bold]{escape(result.conclusion)}[/]")
        if as_json:
            print_json(result.to_json())
    guard(body)
