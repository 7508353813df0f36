"""`lab engines`: the engines the lab can use, each with its facts or why it is unreachable."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import JsonOpt
from lab.cli.output import out, print_json
from lab.core.records import format_bytes
from lab.engine.engines import engine_specs, parse_spec, slurm_specs, survey


def engines(
    engines: Annotated[list[str] | None, typer.Option(
        "--engine", help="Also list this engine: a Docker context name or a DOCKER_HOST URL; repeatable.",
        show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the Docker engines the lab can use (the current one, the `engines` setting and --engine), with
    their architecture, CPUs, memory, GPU runtime, version, free disk and slots. Unreachable ones are shown
    with the reason."""
    def body() -> None:
        specs = engine_specs(engines or (), inputs.settings()["engines"])
        if not any(s.kind == "local" for s in specs):
            specs.append(parse_spec("local", "built-in"))
        specs += [s for s in slurm_specs() if s.name not in {t.name for t in specs}]  # a Slurm that answers here
        facts = [f for f, _ in survey(specs)]
        if as_json:
            print_json({"engines": [f.as_json() for f in facts]})
            return
        for f in facts:  # a paragraph per engine: readable in any terminal width
            head = f"[bold]{escape(f.name)}[/] ({escape(f.source)}, {escape(f.url or 'no address')})"
            if not f.reachable:
                out.print(f"{head}: [red]unreachable[/], skipped: {escape(f.reason or '')}", soft_wrap=True)
                continue
            disk = format_bytes(f.free_disk) if f.free_disk is not None else f"unknown ({f.free_disk_note})"
            if f.kind == "slurm":
                out.print(f"{head}: [green]available[/] (Slurm partition; `--engine {escape(f.name)}`)\n"
                          f"  {f.nodes} node(s): arch {f.arch}, {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                          f"{f.gpus or 0} GPU(s) per node; {escape(f.version or '?')}; {f.slots} slot(s)",
                          soft_wrap=True)
                continue
            if f.kind == "local":
                out.print(f"{head}: [green]available[/] (this host, no container; `--engine local`)\n"
                          f"  arch {f.arch} only (no emulation), {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                          f"NVIDIA devices {'yes' if f.gpu else 'no'}\n"
                          f"  confinement {escape(f.confinement or '?')}; free disk {escape(disk)} (cache); "
                          f"{f.slots} slot(s)", soft_wrap=True)
                continue
            emulates = ", ".join(f.emulates) or "nothing" if f.emulates is not None else "unknown (remote)"
            out.print(f"{head}: [green]reachable[/]\n"
                      f"  arch {f.arch}, {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                      f"GPU runtime {'yes' if f.gpu else 'no'}, Docker {escape(f.version or '?')}\n"
                      f"  free disk {escape(disk)}; emulates {escape(emulates)}; {f.slots} slot(s)",
                      soft_wrap=True)
    guard(body)
