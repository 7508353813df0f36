"""`lab cache info` and `lab cache prune`: what the cache holds, its cap, and freeing space."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lab.cache_policy.inventory import pins, set_pins, take_inventory
from lab.cache_policy.inventory import prune as prune_cache
from lab.cache_policy.policy import PART_TITLES, parse_duration
from lab.cli.guard import guard
from lab.cli.options import JsonOpt, with_output_flags
from lab.cli.output import Progress, err, out, print_json
from lab.core.errors import EngineError
from lab.engine.docker_engine import Engine


def _cache_engine():
    """The engine, or None (and a warning) when it does not answer: disk parts are still shown."""
    try:
        return Engine.connect()
    except EngineError as e:
        err.print(f"[yellow]warning:[/] images left out: {escape(str(e))}")
        return None


BIG = 64 * 1024**2   # `lab cache info` names the entries in use from this size on


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def info(as_json: JsonOpt = False) -> None:
    """Show each part of the cache (images, bases, site trees, uv's wheels, release index), its size, and the cap."""
    def body() -> None:
        inv = take_inventory(_cache_engine(), with_runs=True)
        if as_json:
            print_json(inv.as_json())
            return
        table = Table("part", "size", "entries", "in use")
        sizes = inv.part_sizes()
        for part, size in sizes.items():
            entries = [e for e in inv.entries if e.part == part]  # none for `linked`: no entry frees it alone
            title = PART_TITLES[part] + (f" (engine {inv.engine})" if part == "images" and inv.engine else "")
            table.add_row(escape(title), _gib(size), str(len(entries)), str(sum(bool(e.in_use) for e in entries)))
        out.print(table)
        state = "[red]over the cap[/]" if inv.total > inv.cap else "under the cap"
        out.print(f"total {_gib(inv.total)} of a cap of {_gib(inv.cap)} ({escape(inv.cap_source)}): {state}; "
                  f"{_gib(inv.free)} free at {escape(str(inv.root))} (a run must leave {_gib(inv.margin)}: "
                  "disk_margin)")
        for folder, size in inv.runs:
            out.print(f"run folders: {_gib(size)} at {escape(folder)} (results: outside the cap, never pruned)")
        kept = [e for e in inv.entries if e.in_use and e.part != "other" and e.size >= BIG]
        for e in sorted(kept, key=lambda e: -e.size):
            name = f"{e.name} [{e.label}]" if e.label else e.name
            out.print(f"kept: {escape(e.part)} {escape(name)} ({_gib(e.size)}): {escape(e.in_use or '')}")
        out.print("sizes: what removing each part's entries frees, files once per inode; `linked`: files hard-linked "
                  "from entries of several parts (a site tree or venv and the uv wheels it was installed from); "
                  f"images by what removing each frees, plus {_gib(inv.shared_image_bytes)} of layers they share, "
                  "counted once", markup=False)
        for note in inv.notes:
            out.print(f"note: {escape(note)}")
    guard(body)


def prune(
    everything: Annotated[bool, typer.Option("--all", help="Remove everything of the lab's that is not in "
                                             "use, not only what exceeds the cap.")] = False,
    older_than: Annotated[str | None, typer.Option("--older-than", help="Remove what was not used for this "
                                                   "long (such as 7d, 12h, 90m).", show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Free space, least recently used first (never what is in use or what the lab did not make)."""
    def body() -> None:
        age = parse_duration(older_than) if older_than is not None else None
        engine = _cache_engine()
        with Progress() as progress:
            pruned = prune_cache(engine, everything=everything, older_than=age, events=progress)
        for e in pruned.removed:
            err.print(f"removed {e.part} {escape(e.name)} ({_gib(e.size)})")
        for note in pruned.notes:
            err.print(f"note: {escape(note)}")
        left = pruned.before.total - pruned.freed
        err.print(f"freed {_gib(pruned.freed)}; the cache holds about {_gib(left)} of a cap of "
                  f"{_gib(pruned.before.cap)}")
        if as_json:
            print_json({"removed": [{"part": e.part, "name": e.name, "bytes": e.size}
                                              for e in pruned.removed],
                                  "freed_bytes": pruned.freed, "total_bytes": left,
                                  "cap_bytes": pruned.before.cap, "notes": list(pruned.notes)})
    guard(body)


def pin(
    words: Annotated[list[str], typer.Argument(help="An entry's name, or a word of its name or label (such as "
                                               "torch==2.5.1, or an image tag), as `lab cache info --json` lists "
                                               "them.", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Keep matching cache entries: neither the cap nor `lab cache prune --all` removes them."""
    def body() -> None:
        now = sorted(set(pins()) | set(words))
        set_pins(now)
        err.print("pinned: " + escape(", ".join(now)))
        if as_json:
            print_json({"pins": now})
    guard(body)


def unpin(
    words: Annotated[list[str], typer.Argument(help="What `lab cache pin` was given.", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Let the cap remove entries pinned before."""
    def body() -> None:
        now = [w for w in pins() if w not in set(words)]
        set_pins(now)
        err.print("pinned: " + (escape(", ".join(now)) or "nothing"))
        if as_json:
            print_json({"pins": now})
    guard(body)


app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="The lab's cache: what it holds, its cap, and pruning it.")
app.command("info")(with_output_flags(info))
app.command("prune")(with_output_flags(prune))
app.command("pin")(with_output_flags(pin))
app.command("unpin")(with_output_flags(unpin))
