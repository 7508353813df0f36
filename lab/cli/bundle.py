"""`lab bundle`: a run folder packed into one .tar.gz (secrets scrubbed), or a bundle's manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lab.bundle.archive import inspect_bundle, write_bundle
from lab.cli.guard import guard
from lab.cli.options import JsonOpt
from lab.cli.output import err, log, out, print_json
from lab.core.records import format_bytes
from lab.history.index import note_bundle


def bundle(
    path: Annotated[Path, typer.Argument(help="A run folder (or, with --inspect, a bundle).", show_default=False)],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The .tar.gz to write "
                                                "(default: <run folder name>.tar.gz here).")] = None,
    slim: Annotated[bool, typer.Option("--slim", help="Leave out the raw loader logs (out/ld/).")] = False,
    inspect: Annotated[bool, typer.Option("--inspect", help="Show a bundle's manifest without unpacking it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace the -o file if it exists.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Pack a run folder into one .tar.gz to attach to an upstream issue (secrets scrubbed), or --inspect one."""
    def body() -> None:
        if inspect:
            _show_manifest(path, as_json)
            return
        info = write_bundle(path, output, slim=slim, force=force)
        if (note := note_bundle(path, info.path)) is not None:
            log.warning(note)
        err.print(f"bundle: {info.path} ({format_bytes(info.size)}, {info.file_count} files"
                  + (", slim" if slim else "") + ")")
        for item in info.left_out:
            err.print(f"  left out: {escape(item.path)} ({escape(item.why)})")
        err.print(f"replay it with: [bold]lab replay {escape(str(info.path))}[/]")
        if as_json:
            print_json({"bundle": str(info.path), "size": info.size, "files": info.file_count,
                        "left_out": [e.model_dump(mode="json") for e in info.left_out]})
        else:
            out.print(str(info.path), markup=False)
    guard(body)


def _show_manifest(path: Path, as_json: bool) -> None:
    manifest = inspect_bundle(path)
    if as_json:
        print_json(manifest.model_dump(mode="json"))
        return
    total = sum(f.size for f in manifest.files)
    out.print(f"{path}: {manifest.format} v{manifest.format_version}, made "
              f"{manifest.created} by lab {manifest.lab_version}", markup=False)
    out.print(f"case:    {manifest.case}", markup=False)
    out.print(f"verdict: {manifest.verdict} ({manifest.reason})", markup=False)
    for sentence in manifest.summary:
        out.print(f"  - {sentence}", markup=False)
    kinds = {k: sum(1 for f in manifest.files if f.kind == k) for k in ("meta", "data")}
    out.print(f"files:   {len(manifest.files)} ({kinds['meta']} metadata, {kinds['data']} data), "
              f"{format_bytes(total)} unpacked" + (", slim" if manifest.slim else ""), markup=False)
    for item in manifest.left_out:
        out.print(f"left out: {item.path} ({item.why})", markup=False)
