"""The package's folders are the pipeline's stages, and imports go one way only: a stage imports
the stages before it, never one after it (ARCHITECTURE.md). Only the engine imports docker, and
nothing but the CLI prints (tests/test_cli.py::test_only_the_cli_prints)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"
# Earlier first. pipeline, doctor, schemas and cli are modules at the top of the package.
ORDER = ("core", "scenario", "build", "engine", "analyze", "report", "history", "cache_policy", "compare",
         "pipeline",
         "drivers", "bundle", "issue", "doctor", "schemas", "cli")


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "lab" and parts[1] in ORDER else None


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


def test_only_the_engine_imports_docker():
    users = {module for module, path in _modules()
             if any(name == "docker" or name.startswith("docker.") for name, _ in _imports(path))}
    assert users == {"lab.engine.docker_client", "lab.engine.docker_images", "lab.engine.docker_containers",
                     "lab.engine.docker_housekeeping", "lab.engine.docker_engine"}


def test_every_stage_is_a_folder():
    folders = {p.name for p in LAB.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"core", "scenario", "engine", "build", "analyze", "report", "drivers", "bundle"} <= folders
