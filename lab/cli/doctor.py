"""`lab doctor` and `lab clean`: the host's checks with their fixes, and removing what the lab made."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.markup import escape

from lab.cli import inputs
from lab.cli.guard import guard
from lab.cli.options import JsonOpt
from lab.cli.output import err, out, print_json
from lab.doctor import run_checks
from lab.engine.docker_engine import Engine


def doctor(as_json: JsonOpt = False) -> None:
    """Check the engine, arm64 emulation, the GPU runtime, disk space and the CA bundle."""
    def body() -> None:
        checks = run_checks(inputs.settings().runs_dir)
        if as_json:
            print_json({"checks": [asdict(c) for c in checks]})
        else:
            marks = {"ok": "[green]ok[/]  ", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
            for c in checks:
                out.print(f"{marks[c.status]} {c.name}: {escape(c.detail)}")
                if c.fix and c.status != "ok":
                    out.print(f"      fix: {escape(c.fix)}")
        if any(c.status == "fail" for c in checks):
            raise typer.Exit(1)
    guard(body)


def clean() -> None:
    """Remove every container and image the lab created (and only those)."""
    def body() -> None:
        containers, images = Engine.connect().remove_managed()
        err.print(f"removed {containers} containers and {images} images labelled by the lab")
    guard(body)
