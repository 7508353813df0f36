"""The package's folders are the pipeline's stages, and imports go one way only: a stage imports
the stages before it, never one after it (ARCHITECTURE.md). Only the engine imports docker, and
nothing but the CLI prints (tests/test_cli.py::test_only_the_cli_prints)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"
# Earlier first. pipeline, doctor, schemas and cli are modules at the top of the package.
ORDER = ("core", "scenario", "image", "engine", "analyze", "report", "history", "cache_policy", "compare",
         "pipeline",
         "drivers", "bundle", "issue", "agent", "doctor", "schemas", "cli", "__main__")
SAME_STAGE: dict[str, str] = {}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    stage = SAME_STAGE.get(parts[1], parts[1]) if len(parts) > 1 and parts[0] == "lab" else None
    return stage if stage in ORDER else None


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(LAB.rglob("*.py")):
        rel = path.relative_to(LAB.parent).with_suffix("")
        if "probe" in rel.parts or rel.parts[1:2] in (("dockerfiles",), ("scenarios",)):
            continue  # the in-image runner, package data
        found.append((".".join(rel.parts), path))
    return found


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import (the package uses absolute imports)"
            if node.module == "lab":
                out += [(f"lab.{alias.name}", node.lineno) for alias in node.names]
            else:
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
    return out


@pytest.mark.parametrize("module,path", _modules(), ids=[m for m, _ in _modules()])
def test_imports_go_one_way(module, path):
    mine = _stage(module)
    if mine is None:
        return
    later = [(name, line) for name, line in _imports(path)
             if (theirs := _stage(name)) is not None and ORDER.index(theirs) > ORDER.index(mine)]
    assert not later, f"{module} imports later stages: {later}"


def test_every_module_has_a_stage():
    """Every module is checked: each belongs to a stage (the CLI's and `python -m lab`'s included)."""
    assert [m for m, _ in _modules() if m != "lab.__init__" and _stage(m) is None] == []


def test_only_the_engine_imports_docker():
    users = {module for module, path in _modules()
             if any(name == "docker" or name.startswith("docker.") for name, _ in _imports(path))}
    assert users == {"lab.engine.docker_client", "lab.engine.docker_images", "lab.engine.docker_containers",
                     "lab.engine.docker_housekeeping", "lab.engine.docker_engine"}


def test_every_stage_is_a_folder():
    folders = {p.name for p in LAB.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"core", "scenario", "engine", "image", "analyze", "report", "drivers", "bundle"} <= folders


# --- circles and imports hidden in functions ---------------------------------------------------
NOT_YET: set[str] = set()  # every module is checked
# A function may import a heavy optional dependency, with a comment on its line (or the line above)
# that says so: `# optional: ...`.
OPTIONAL = "# optional:"


def _module_names() -> set[str]:
    return {m[:-len(".__init__")] if m.endswith(".__init__") else m for m, _ in _modules()}


def _resolve(name: str, known: set[str]) -> str | None:
    """The lab module an import names (`lab.engine.gpu` for `from lab.engine import gpu`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    known = _module_names()
    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        me = module[:-len(".__init__")] if module.endswith(".__init__") else module
        edges = graph.setdefault(me, set())
        for name, _ in _imports(path):
            target = _resolve(name, known) if name.startswith("lab.") else None
            if target is not None and target != me and target not in me.split(".")[0:1]:
                edges.add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    graph = {m: {t for t in edges if t not in NOT_YET} for m, edges in _graph().items() if m not in NOT_YET}
    assert _cycles(graph) == []


def _hidden_imports(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    lines = text.splitlines()
    hidden = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                here = lines[child.lineno - 1]
                above = lines[child.lineno - 2] if child.lineno > 1 else ""
                if OPTIONAL not in here and OPTIONAL not in above:
                    hidden.append((child.lineno, here.strip()))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(text), False)
    return hidden


def test_no_import_is_hidden_in_a_function_without_saying_why():
    hidden = {module: found for module, path in _modules()
              if module not in NOT_YET and (found := _hidden_imports(path))}
    assert hidden == {}, f"{sum(map(len, hidden.values()))} imports inside functions: {hidden}"
