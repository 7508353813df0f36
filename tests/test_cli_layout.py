"""The CLI stays a package of small command modules: each parses, builds the typed request of the
work, calls one function outside the CLI and prints. Shared pieces (the app, options, output, error
guard, inputs, routing) are imported by the command modules; no command module imports another,
and none hides an import inside a function (lab/cli/app.py imports a command's module with
importlib when that command is used, so `lab --version` stays fast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[1] / "lab" / "cli"
SHARED = {"__init__", "app", "options", "output", "guard", "inputs", "routing"}
MAX_LINES = 300
MODULES = sorted(CLI.glob("*.py"))
COMMANDS = [p for p in MODULES if p.stem not in SHARED]


def _lab_cli_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "lab.cli":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("lab.cli."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("lab.cli.")}
    return found


def test_the_cli_is_a_package_of_command_modules():
    assert not (CLI.parent / "cli.py").exists() and not (CLI.parent / "cli_issue.py").exists()
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_every_cli_module_is_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines; split it (at most {MAX_LINES})"


@pytest.mark.parametrize("path", COMMANDS, ids=[p.stem for p in COMMANDS])
def test_no_command_module_imports_another(path):
    assert _lab_cli_imports(path) <= SHARED - {"__init__", "app"}, path.name


def test_the_shared_modules_import_no_command_module():
    for path in MODULES:
        if path.stem in SHARED - {"app", "__init__"}:
            assert _lab_cli_imports(path) <= SHARED, path.name


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_imports_sit_at_the_top_of_the_module(path):
    hidden = [node.lineno for fn in ast.walk(ast.parse(path.read_text()))
              if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert hidden == [], f"{path.name}: imports inside functions at lines {hidden}"


def test_every_command_module_is_registered_and_every_command_loads():
    from lab.cli.app import COMMANDS as REGISTERED
    from lab.cli.app import load_command
    assert {module for module, _ in REGISTERED.values()} == {p.stem for p in COMMANDS}
    for name in REGISTERED:
        assert load_command(name).name == name
