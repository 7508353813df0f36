"""`lab list`, `lab show` and `lab render`: the scenarios, one as the lab reads it, its Dockerfile."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from rich.markup import escape
from rich.table import Table

from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import ArchOpt, JsonOpt, ScenarioArg, TorchOpt
from lab.cli.output import err, out, print_json
from lab.core.errors import ScenarioError
from lab.image.render import render_dockerfile
from lab.scenario.lookup import list_scenarios


def list_cmd(as_json: JsonOpt = False) -> None:
    """List the scenarios: the project's (scenarios/ found upward, or scenarios_dir), then the shipped ones."""
    def body() -> None:
        rows, seen = [], set()
        for folder in inputs.settings().scenario_dirs():
            for item in list_scenarios(folder.path):
                if isinstance(item, ScenarioError):
                    row = {"name": Path(item.file or "?").stem, "error": str(item)}
                else:
                    row = {"name": item.source.stem, "title": item.title, "torch": list(item.torch),
                           "arch": [a.value for a in item.arch], "gpu": item.gpu, "base": item.base,
                           "file": str(item.source)}
                row.update(origin=folder.origin, shadowed=row["name"] in seen)
                seen.add(row["name"])
                rows.append(row)
        if as_json:
            print_json({"scenarios": rows})
            return
        table = Table("name", "torch", "arch", "gpu", "from", "title")
        for r in rows:
            origin = r["origin"] + (" (shadowed)" if r["shadowed"] else "")
            if "error" in r:
                table.add_row(r["name"], "", "", "", origin, f"[red]{escape(r['error'])}[/]")
            else:
                table.add_row(r["name"], ", ".join(r["torch"]), ", ".join(r["arch"]),
                              "yes" if r["gpu"] else "", origin, escape(r["title"] or ""))
        out.print(table)
        for folder in inputs.settings().scenario_dirs():
            err.print(f"{folder.origin}: {escape(str(folder.path))}")
    guard(body)


def show(scenario: ScenarioArg) -> None:
    """Show a scenario as the lab understands it."""
    def body() -> None:
        s = inputs.load(scenario)
        data = s.model_dump(mode="json")
        data["source"] = str(s.source)
        out.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip(), markup=False)
    guard(body)


def render(scenario: ScenarioArg, torch: TorchOpt = None, arch: ArchOpt = None) -> None:
    """Print the Dockerfile for a scenario (the build's dry run; the same bytes every time)."""
    def body() -> None:
        sys.stdout.write(render_dockerfile(inputs.case(scenario, torch, arch)))
    guard(body)
