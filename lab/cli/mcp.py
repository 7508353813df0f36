"""`lab mcp`: serve the lab to an agent over MCP (stdio). The server and its policy are lab.agent."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lab.agent.policy import Policy
from lab.agent.server import build_server
from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import OutOpt


def mcp(
    out_dir: OutOpt = None,
    allow_network: Annotated[bool, typer.Option(
        "--allow-network", help="Let scripts of scenarios that ask for it (network: true) use the network. "
        "Off by default: a caller can never turn it on.")] = False,
    allow_base: Annotated[list[str] | None, typer.Option(
        "--allow-base", help="Also allow this base image (besides the shipped scenarios' bases and the ones issue "
        "pages map to); repeatable. A scenario on any other base is refused.", show_default=False)] = None,
) -> None:
    """Serve the lab to an agent over MCP (stdio): list/show scenarios, scenario_from_issue, run, bisect,
    compare, comment, triage, read_report. Callers name scenarios and folders under the runs folder only."""
    def body() -> None:
        settings = inputs.settings()
        policy = Policy(runs_root=Path(inputs.runs_root(out_dir)).resolve(),
                        scenario_dirs=tuple(d.path for d in settings.scenario_dirs()),
                        engines=tuple(str(e) for e in settings["engines"] or ()),
                        allow_network=allow_network, extra_bases=tuple(allow_base or ()))
        policy.runs_root.mkdir(parents=True, exist_ok=True)
        build_server(policy).run("stdio")
    guard(body)
