"""`lab schema` and `lab config`: the published JSON Schemas, and the effective settings with where
each came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import JsonOpt
from lab.cli.output import out, print_json
from lab.schemas import json_schema, names, render, write_schemas


def schema(
    name: Annotated[str | None, typer.Argument(help="run, evidence, bisect, matrix, ablation or bundle-manifest "
                                               "(default: all of them).", show_default=False)] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write <name>.schema.json files into this "
                                                 "folder instead of printing.")] = None,
) -> None:
    """Print (or write) the JSON Schemas of result.json, the --json outputs and the bundle manifest."""
    def body() -> None:
        if out_dir is not None:
            for path in write_schemas(out_dir, [name] if name else None):
                out.print(str(path), markup=False)
        elif name:
            sys.stdout.write(render(name))
        else:
            sys.stdout.write(json.dumps({n: json_schema(n) for n in names()}, indent=2) + "\n")
    guard(body)


def config(as_json: JsonOpt = False) -> None:
    """Print the effective settings and where each came from (environment, project file, user file, default)."""
    def body() -> None:
        settings = inputs.settings()
        rows = settings.describe()
        dirs = [{"origin": d.origin, "path": str(d.path)} for d in settings.scenario_dirs()]
        files = {"user": str(settings.user_file), "user_exists": settings.user_file.is_file(),
                 "project": str(settings.project_file) if settings.project_file else None}
        if as_json:
            print_json({"settings": rows, "files": files, "scenario_dirs": dirs})
            return
        table = Table("key", "value", "from", "variable")
        for r in rows:
            table.add_row(r["key"], escape(r["display"]), escape(r["source"]), r["env"])
        out.print(table)
        out.print(f"user file:    {settings.user_file}" + ("" if files["user_exists"] else " (absent)"), markup=False)
        out.print(f"project file: {settings.project_file or '(none: no lab.toml from here up)'}", markup=False)
        for d in dirs:
            out.print(f"scenarios ({d['origin']}): {d['path']}", markup=False)
        for r in rows:
            if not r["used"]:
                out.print(f"note: {r['key']} is accepted and validated, for {r['later']}", markup=False)
    guard(body)
