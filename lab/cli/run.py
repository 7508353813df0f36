"""`lab run`: one case, a backend ablation, or a matrix of versions x arches (with --repeat, a rate)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lab.cli import inputs, routing
from lab.cli.guard import guard
from lab.cli.options import (
    DepsOpt,
    EngineOpt,
    JobsOpt,
    JsonOpt,
    OutOpt,
    PythonEnvOpt,
    ScenarioArg,
    SetOpt,
    TrustOpt,
)
from lab.cli.output import COLOURS, Progress, err, log, print_json, print_outcome, say
from lab.core import exitcodes as codes
from lab.core.errors import RunLost
from lab.core.results import MatrixResult, read_document
from lab.drivers.ablate import run_ablation
from lab.drivers.matrix import matrix_result, run_matrix, write_matrix_folder
from lab.drivers.parallel import EngineGone, on_engine, remove_containers
from lab.drivers.run_request import RunOptions, RunPlan, RunRequest, plan_run


def run(
    scenario: ScenarioArg,
    torch: Annotated[str | None, typer.Option("--torch", help="torch version, or a comma-separated list for "
                                              "a matrix (default: the scenario's).")] = None,
    arch: Annotated[str | None, typer.Option("--arch", help="amd64, arm64, or both: amd64,arm64 "
                                             "(default: the scenario's).")] = None,
    backend: Annotated[str | None, typer.Option(help="eager, aot_eager or inductor (sets LAB_BACKEND).")] = None,
    out_dir: OutOpt = None,
    sets: SetOpt = None,
    mode: Annotated[str | None, typer.Option(help="inductor mode, e.g. max-autotune (sets LAB_MODE).")] = None,
    ablate: Annotated[bool, typer.Option("--ablate", help="Run eager, aot_eager, inductor (and max-autotune "
                                         "where allowed) on one image and name the failing layer.")] = False,
    diagnose: Annotated[bool | None, typer.Option(
        "--diagnose/--no-diagnose", help="Collect explain, recompiles, compile times and TORCH_TRACE in a "
        "second run: always, or never. Default: only when the run raised a Dynamo or Inductor exception "
        "or the scenario expects a graph-break count.", show_default=False)] = None,
    compile_debug: Annotated[bool, typer.Option("--compile-debug", help="Also run the diagnose step with "
                                                "TORCH_COMPILE_DEBUG=1 (output in diagnose/compile_debug/).")] = False,
    select_k: Annotated[str | None, typer.Option("-k", help="Run only the matrix cells whose name matches, "
                                                 'e.g. -k "arch=arm64 and not 2.5.1".')] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Run each case N times and report a reproduction "
                                        "rate (for flaky bugs).")] = 1,
    allow_network: Annotated[bool, typer.Option("--allow-network", help="Let the script use the network, "
                                                "for scenarios that ask for it (network: true).")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit with the verdict, as `git bisect run` reads it: "
                                        "0 not reproduced, 1 reproduced, 125 no verdict (infrastructure).")] = False,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    python_env: PythonEnvOpt = "venv",
    trust_script: TrustOpt = False,
    deps: DepsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build and run a scenario (or a matrix of versions x arches), analyse what happened and write a report."""
    verdict: list[str] = []

    def body() -> None:
        request = RunRequest(
            scenario=scenario, deps=deps, torch=torch, arch=arch, backend=backend, mode=mode,
            sets=inputs.parse_sets(sets or []), select=select_k, repeat=repeat, ablate=ablate, check=check,
            engines=tuple(engines or ()),
            options=RunOptions(diagnose=diagnose, compile_debug=compile_debug, allow_network=allow_network))
        plan = plan_run(request, inputs.load)
        runs_root = inputs.runs_root(out_dir)
        fleet = routing.fleet(engines, jobs, python_env, trust_script)
        if plan.single and repeat == 1:
            if found := _one(request, plan, fleet, runs_root, as_json):
                verdict.append(found)
        else:
            _matrix(request, plan, fleet, runs_root, as_json)
    guard(body, check)
    if check and verdict and (code := codes.verdict_exit(verdict[0], check)):
        raise typer.Exit(code)


def _one(request: RunRequest, plan: RunPlan, fleet, runs_root: Path, as_json: bool) -> str | None:
    """One case (or its ablation); its verdict (none for an ablation)."""
    case = plan.cases[0]
    engine = routing.engine_for(fleet, case)
    routing.check_engine(case, engine)
    on = f" on engine {engine.name}" if len(fleet.engines) > 1 or request.engines else ""
    say(f"[bold]{escape(case.name)}[/]" + (" (emulated with QEMU)" if case.arch != engine.arch else "") + on)
    if request.ablate:
        _ablate(case, engine, plan.host, runs_root, as_json)
        return None
    with Progress() as progress:
        outcome = request.options.run(case, engine, plan.host, runs_root, progress)
    print_outcome(outcome)
    if as_json:
        print_json(outcome.result.to_json())
    return outcome.result.verdict.value


def _matrix(request: RunRequest, plan: RunPlan, fleet, runs_root: Path, as_json: bool) -> None:
    cases, repeat = plan.cases, request.repeat
    workers = max(1, min(fleet.slots, len(cases) * repeat))
    if all(fleet.queues(name) for name in fleet.engines):  # Slurm queues the cells itself: one array
        workers = len(cases) * repeat
    err.print(f"[bold]{len(cases)} cell(s)[/]" + (f" x {repeat} runs" if repeat > 1 else "")
              + (f", {workers} at once on {len(fleet.live_engines())} engine(s)" if workers > 1 else "") + ":")
    for c in cases:
        first = fleet.routes(c.arch.value, c.scenario.gpu, c.name, routing.gpu_hint(c.scenario))[0]
        err.print(f"  {escape(c.name)}" + (" (emulated)" if first.emulated else ""))

    def run_one(case, i: int):
        label = escape(case.name) + (f" run {i + 1}/{repeat}" if repeat > 1 else "")
        options = request.options if i == 0 else request.options.later_run()

        def on(engine, emulated: bool):
            err.print(f"[bold]{label}[/]" + (f" on engine {escape(engine.name)}" if len(fleet.engines) > 1 else ""))
            if workers > 1:  # one status line cannot show several runs: their steps go to -v
                def quiet(stage: str, message: str) -> None:
                    say(f"[dim]{label}[/] {escape(message[:160])}", logging.DEBUG)
                outcome = options.run(case, engine, plan.host, runs_root, quiet)
            else:
                with Progress() as progress:
                    outcome = options.run(case, engine, plan.host, runs_root, progress)
            if outcome.result.verdict.value in ("error", "timeout") and not engine.alive():
                raise EngineGone(f"the engine {engine.name} stopped answering")
            print_outcome(outcome)
            return outcome.result

        try:
            return on_engine(fleet, case.arch.value, case.scenario.gpu, f"cell {case.name}", on,
                             lambda st, m: log.warning(m) if st == "engine" else None)
        except RunLost as exc:  # recorded as the cell's error by run_matrix; the other cells go on
            err.print(f"[bold]{label}[/]: [yellow]error[/] (no verdict): {escape(exc.message)}", soft_wrap=True)
            raise

    cells = run_matrix(cases, run_one, repeat, workers=workers,
                       on_interrupt=lambda: remove_containers(fleet.live_engines()))
    table = Table("cell", "verdict", *(["rate"] if repeat > 1 else []), "run folder")
    for cell in cells:
        colour = COLOURS.get(cell.verdict, "bold")
        last = cell.results[-1].run_dir if cell.results else ""
        table.add_row(escape(cell.name), f"[{colour}]{cell.verdict}[/]",
                      *([cell.rate_words()] if repeat > 1 else []), escape(str(last)))
    err.print(table)
    if repeat > 1:  # the rates on lines of their own, whatever the terminal's width
        for cell in cells:
            err.print(f"{escape(cell.name)}: {cell.rate_words()}", soft_wrap=True)
    folder = write_matrix_folder(runs_root, matrix_result(cases[0].scenario, cells))
    err.print(f"matrix: {escape(str(folder / 'report.html'))}", soft_wrap=True)
    if as_json:
        print_json(read_document(folder / "matrix.json", MatrixResult).to_json())


def _ablate(case, engine, host, runs_root: Path, as_json: bool) -> None:
    with Progress() as progress:
        ablation = run_ablation(case, engine, host, runs_root, progress)
    folder, steps, conclusion = ablation.folder, ablation.steps, ablation.conclusion
    table = Table("backend", "mode", "verdict", "run folder")
    for s in steps:
        colour = COLOURS.get(s.verdict.value, "bold")
        table.add_row(s.rung.backend, s.rung.mode or "", f"[{colour}]{s.verdict.value}[/]",
                      s.run_dir.name if s.run_dir else "")
    err.print(table)
    err.print(f"ablation: [bold]{escape(conclusion.words)}[/]")
    err.print(f"report:   {folder / 'ablation.md'}")
    if as_json:
        print_json(ablation.result.to_json())
