"""`lab bisect`: the torch release where a scenario's verdict changes, probe by probe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.cli import inputs, routing
from lab.cli.guard import guard
from lab.cli.options import ArchOpt, DepsOpt, EngineOpt, JobsOpt, JsonOpt, OutOpt, ScenarioArg, SetOpt, TrustOpt
from lab.cli.output import COLOURS, Progress, err, print_json
from lab.compare.diff import boundary_lines, counting
from lab.drivers.bisect_run import BisectRequest, choose_arch, run_bisect
from lab.image.hostpip import discover
from lab.image.resolve import resolve
from lab.scenario.model import check_version


def bisect(
    scenario: ScenarioArg,
    old: Annotated[str, typer.Option("--from", help="The older torch release (one end).", show_default=False)],
    new: Annotated[str, typer.Option("--to", help="The newer torch release (the other end).", show_default=False)],
    arch: ArchOpt = None,
    out_dir: OutOpt = None,
    sets: SetOpt = None,
    pre: Annotated[bool, typer.Option("--pre", help="Include pre-releases among the candidates.")] = False,
    keep_images: Annotated[bool, typer.Option("--keep-images", help="Keep the images the probes build "
                                              "(by default each is removed after its probe).")] = False,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    failed_differently: Annotated[str, typer.Option(
        "--failed-differently", help="How a probe that fails, but not with the scenario's signature, counts: "
        "skip (never a boundary), reproduced or not-reproduced.")] = "skip",
    localize: Annotated[bool, typer.Option("--localize/--no-localize", help="Localize a compile failure at the "
                                           "boundary (ablation, then compiler_bisector where torch ships it).")] = True,
    blame: Annotated[bool, typer.Option("--blame/--no-blame", help="At the boundary, rebuild each side with the "
                                        "other side's and its own era's dependencies and name the package that "
                                        "flips the verdict, or torch alone (default: when they differ).")] = True,
    trust_script: TrustOpt = False,
    deps: DepsOpt = None,
    reuse: Annotated[bool, typer.Option("--reuse/--no-reuse", help="Take the verdicts of earlier runs of the "
                                        "same case (same content key) under the runs folder: a `lab run`, a "
                                        "matrix, a triage, another bisection.")] = True,
    probe_details: Annotated[bool | None, typer.Option(
        "--probe-details/--no-probe-details", help="Run collect_env and the diagnose step's default on every "
        "probe (default: collect_env only for the boundary's two releases; config bisect.probe_details).",
        show_default=False)] = None,
    rounds: Annotated[bool, typer.Option(
        "--rounds", help="With several slots: k-ary rounds, whose probes start together and wait for the "
        "slowest, so the order of probes depends only on their answers (default: each probe starts as soon "
        "as a slot is free, and one no longer needed is stopped).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the torch release where a scenario's verdict changes (a regression or a fix). With several
    slots (--jobs, or engines), that many probes run at once: each starts as soon as a slot is free,
    and a probe the others' answers made unnecessary is stopped (--rounds: k-ary rounds instead)."""
    def body() -> None:
        old_v, new_v = check_version(old, "--from"), check_version(new, "--to")
        counted = counting(failed_differently)
        loaded = inputs.load(scenario, deps)
        request = BisectRequest(loaded, scenario, old_v, new_v, inputs.arch_for(loaded, arch), pre=pre,
                                sets=inputs.parse_sets(sets or []), keep_images=keep_images,
                                failed_differently=counted, localize=localize, blame=blame, reuse=reuse,
                                emulated_slots=jobs is None, eager=not rounds,
                                probe_details=bool(inputs.settings()["bisect.probe_details"] if probe_details is None
                                                   else probe_details))
        runs_root = inputs.runs_root(out_dir)
        fleet = routing.fleet(engines, jobs, "venv", trust_script)
        if len(fleet.engines) == 1:  # one engine: its refusals before the first probe
            (only,) = fleet.engines
            routing.check_engine(resolve(loaded, torch=old_v, arch=choose_arch(loaded, request.arch),
                                         sets=request.sets), fleet.engine(only))
        resume: list[str] = []

        def on_start(candidates: list[str], folder: Path, command: str) -> None:
            resume.append(command)
            err.print(f"[bold]bisect {escape(loaded.name)}[/]: {len(candidates)} candidate releases "
                      f"({escape(', '.join(candidates))})")
            err.print(f"folder: {folder}")
            err.print(f"resume after an interruption with: [bold]{escape(command)}[/]")

        def on_probe(probe, reused: bool) -> None:
            colour = COLOURS.get(probe.verdict, "bold")
            note = (f" (from {escape(probe.reused_from)})" if probe.reused_from else
                    " (from an earlier run)" if reused else "")
            why = probe.evidence or probe.reason
            took = (f" ({probe.total_s:.0f} s: build {probe.build_s or 0:.0f} s, run {probe.run_s or 0:.0f} s)"
                    if probe.total_s is not None and not reused else "")
            where = f" on {escape(probe.engine)}" if probe.engine and len(fleet.engines) > 1 and not reused else ""
            err.print(f"  torch {escape(probe.version)}: [{colour}]{probe.verdict}[/]{note}{where}{took}"
                      + (f" - {escape(why[:140])}" if why else ""))

        try:
            with Progress() as progress:
                run = run_bisect(request, discover(), runs_root, progress, fleet=fleet, on_probe=on_probe,
                                 on_start=on_start)
        except KeyboardInterrupt:
            if resume:
                err.print(f"resume with: [bold]{escape(resume[0])}[/]")
            raise
        result = run.result
        if result.width > 1:
            err.print(f"{len(result.steps)} probes, up to {result.width} at once, each started as soon as a slot "
                      "was free" if result.eager else
                      f"{len(result.steps)} probes in {result.rounds} rounds, up to {result.width} at once")
        colour = "bold" if result.status == "found" else "bold yellow"
        err.print(f"[{colour}]{result.status}[/]: {escape(result.summary)}")
        for line in boundary_lines(result):
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        if result.signature is not None:  # an exit-code-only scenario: every failure held to the first one's
            err.print(f"failures held to the signature torch {result.signature_from} recorded first: "
                      f"{result.signature.words()} ({run.folder / 'signature.json'})", markup=False, soft_wrap=True)
        err.print(f"report: {run.folder / 'bisect.md'}")
        if as_json:
            print_json(result.to_json())
    guard(body)
