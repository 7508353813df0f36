"""The loader graph of a run: which object needed (or dlopen()ed) which library, drawn by Graphviz.

The nodes and edges come from the LD_DEBUG log the run left in `out/ld/` (lab.analyze.loader); the
process shown is the one with a duplicate runtime, else the one that mapped the most objects. The
copies of a duplicate runtime, and the chains that pulled them in, are drawn in red. `dot` (Debian's
`graphviz`) lays the graph out as SVG; without it the report says so and lists the edges instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lab.analyze.loader import ProcessLoads, canonical_path, describe, find_duplicate_runtimes, parse_dir

DUPLICATE_FILL, DUPLICATE_LINE = "#f8d0d0", "#c0392b"
_DOT_TIMEOUT_S = 30
NO_DOT = ("Graphviz `dot` is not installed, so the loader graph is listed as edges, not drawn. Install it "
          "(Debian: apt-get install graphviz, or bin/setup-host), then run `lab report RUN_DIR` again.")


@dataclass(frozen=True)
class Edge:
    parent: str        # the program or object that asked
    child: str         # the object it got
    how: str           # needed | dlopen | preload
    duplicate: bool    # on a chain that leads to a duplicate runtime


@dataclass(frozen=True)
class LoaderGraph:
    pid: int
    program: str | None
    duplicates: tuple[str, ...]        # paths of the duplicate runtime's copies (canonical)
    family: str | None
    edges: tuple[Edge, ...]
    words: tuple[str, ...] = ()        # every duplicate runtime of the run, in plain words

    @property
    def nodes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for e in self.edges:
            seen.setdefault(e.parent)
            seen.setdefault(e.child)
        return tuple(seen)


@dataclass(frozen=True)
class GraphPicture:
    svg: str | None         # inline <svg>, or None when it could not be drawn
    note: str | None        # why not, in one sentence with the fix


def loader_graph(procs: Mapping[int, ProcessLoads]) -> LoaderGraph | None:
    """The graph of the process worth showing, or None when the log names no object."""
    if not procs:
        return None
    dups = find_duplicate_runtimes(procs)
    if dups:
        proc = procs[dups[0].pid]
        copies = tuple(canonical_path(o.path) for o in dups[0].objects)
        family = dups[0].family
    else:
        proc = max(procs.values(), key=lambda p: (len(p.objects), -p.pid))
        copies, family = (), None
    if not proc.objects:
        return None
    program = proc.program or "program"
    parent_of = {canonical_path(o.path): (canonical_path(o.needed_by) if o.needed_by and o.needed_by.startswith("/")
                                          else (o.needed_by or program)) for o in proc.objects}
    on_chain: set[str] = set()
    for path in copies:
        node, hops = path, 0
        while node in parent_of and node not in on_chain and hops < 64:
            on_chain.add(node)
            node, hops = parent_of[node], hops + 1
    edges = tuple(Edge(parent_of[canonical_path(o.path)], canonical_path(o.path), o.how or "needed",
                       canonical_path(o.path) in on_chain) for o in proc.objects)
    return LoaderGraph(proc.pid, proc.program, copies, family, edges, tuple(describe(d) for d in dups))


def graph_of_run(run_dir: Path) -> LoaderGraph | None:
    ld = run_dir / "out" / "ld"
    return loader_graph(parse_dir(ld)) if ld.is_dir() else None


def _label(path: str) -> str:
    return os.path.basename(path) or path


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: LoaderGraph) -> str:
    """DOT text: left to right, one box per object (its file name; the full path as tooltip)."""
    lines = [f"digraph {_quote(f'loader pid {graph.pid}')} {{",
             '  graph [rankdir=LR, bgcolor="white", fontname="Helvetica", fontsize=10, nodesep=0.15, ranksep=0.6];',
             '  node [shape=box, style="rounded,filled", fillcolor="#eef3fa", color="#5b7aa8", fontname="Helvetica",'
             ' fontsize=10, height=0.25];',
             '  edge [color="#9aa7b8", arrowsize=0.6];']
    dups, chain = set(graph.duplicates), {e.child for e in graph.edges if e.duplicate}
    for node in graph.nodes:
        attrs = [f"label={_quote(_label(node))}", f"tooltip={_quote(node)}"]
        if node in dups:
            attrs += [f'fillcolor="{DUPLICATE_FILL}"', f'color="{DUPLICATE_LINE}"', "penwidth=2",
                      'fontname="Helvetica-Bold"']
        elif node in chain:
            attrs += [f'color="{DUPLICATE_LINE}"']
        elif not node.startswith("/"):
            attrs += ['shape=ellipse', 'fillcolor="#ffffff"']
        lines.append(f"  {_quote(node)} [{', '.join(attrs)}];")
    for e in graph.edges:
        attrs = [f"tooltip={_quote(f'{e.parent} {e.how} {e.child}')}"]
        if e.how == "dlopen":
            attrs += ['style=dashed', 'label="dlopen"', "fontsize=8", 'fontname="Helvetica"']
        if e.duplicate:
            attrs += [f'color="{DUPLICATE_LINE}"', "penwidth=2"]
        lines.append(f"  {_quote(e.parent)} -> {_quote(e.child)} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


_PROLOG = re.compile(r"^.*?(?=<svg\b)", re.S)


def draw(graph: LoaderGraph, dot: str | None = None) -> GraphPicture:
    """The graph as inline SVG, laid out by Graphviz `dot`; a note instead when it cannot run."""
    exe = dot or shutil.which("dot")
    if exe is None:
        return GraphPicture(None, NO_DOT)
    try:
        done = subprocess.run([exe, "-Tsvg"], input=to_dot(graph), capture_output=True, text=True,
                              timeout=_DOT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GraphPicture(None, f"Graphviz `dot` failed ({exc}); the loader graph is listed as edges.")
    if done.returncode != 0 or "<svg" not in done.stdout:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return GraphPicture(None, f"Graphviz `dot` failed ({why}); the loader graph is listed as edges.")
    return GraphPicture(_PROLOG.sub("", done.stdout, count=1).strip(), None)
