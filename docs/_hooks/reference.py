"""MkDocs hook: the reference parts of the docs, generated from the code at build time, so they cannot
drift from it.

A page asks for a generated part with a marker line of its own:

- `<!-- lab:commands -->`: every `lab` command's `--help`, exactly as `lab CMD --help` prints it (typer's
  own output, 100 columns), in the order `lab --help` lists them, sub-commands (`lab cache info`) included.
- `<!-- lab:modules -->`: every package and module of `lab/`, each with the first sentence of its
  docstring, read from the source tree (nothing is imported).
- `<!-- lab:scenario-fields -->`: the scenario YAML's fields from the scenario model (pydantic), with
  their defaults and the one-line rule the loader's errors quote.

mkdocs.yml names this file under `hooks:`; docs/ keeps it out of the site (`exclude_docs`).
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WIDTH = "100"


# --------------------------------------------------------------------------- lab commands

def _lab_app() -> Any:
    """The typer app behind the `lab` console script (whatever module the CLI lives in)."""
    for ep in entry_points(group="console_scripts"):
        if ep.name == "lab":
            return ep.load()
    return importlib.import_module("lab.cli").app   # not installed: the package's own CLI


def _command_paths(app: Any) -> list[list[str]]:
    import click  # noqa: F401  (typer brings it)
    import typer

    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    def walk(group: Any, ctx: Any, prefix: list[str]) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if cmd is None or getattr(cmd, "hidden", False):
                continue
            paths.append([*prefix, name])
            if hasattr(cmd, "list_commands"):
                walk(cmd, type(ctx)(cmd, info_name=name, parent=ctx), [*prefix, name])

    walk(root, root.make_context("lab", [], resilient_parsing=True), [])
    return paths


def _help(app: Any, args: list[str]) -> str:
    from typer.testing import CliRunner

    env = {"COLUMNS": WIDTH, "TERMINAL_WIDTH": WIDTH, "NO_COLOR": "1", "TERM": "dumb"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)   # rich reads the width when the console is made, from the process's environment
    try:
        result = CliRunner().invoke(app, [*args, "--help"], prog_name="lab", env=env)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if result.exit_code != 0:
        raise RuntimeError(f"`lab {' '.join(args)} --help` exited {result.exit_code}:\n{result.output}")
    lines = [line.rstrip() for line in result.output.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def commands_reference() -> str:
    app = _lab_app()
    parts = ["## `lab`", "", "```text", "$ lab --help", _help(app, []), "```", ""]
    for path in _command_paths(app):
        name = " ".join(path)
        parts += [f"## `lab {name}`", "", "```text", f"$ lab {name} --help", _help(app, path), "```", ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- modules of lab/

def _first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence.replace("|", "\\|").replace("<", "&lt;") or "(no docstring)"


def modules_reference() -> str:
    pkg = ROOT / "lab"
    rows = ["| module | what it is (its docstring's first sentence) |", "|---|---|"]
    for path in sorted(pkg.glob("*.py")):
        if path.name != "__main__.py":
            rows.append(f"| `lab/{path.name}` | {_first_sentence(path)} |")
    for init in sorted(pkg.glob("*/__init__.py")):
        folder = init.parent
        rows.append(f"| **`lab/{folder.name}/`** | **{_first_sentence(init)}** |")
        for path in sorted(folder.rglob("*.py")):
            if path.name == "__init__.py" and path.parent == folder:
                continue
            rel = path.relative_to(folder).as_posix()
            rows.append(f"| `{rel}` | {_first_sentence(path)} |")
    for folder in sorted(p for p in pkg.iterdir() if p.is_dir() and not (p / "__init__.py").exists()
                         and p.name != "__pycache__"):
        files = sorted(x.name for x in folder.rglob("*.py"))
        if files:
            rows.append(f"| `lab/{folder.name}/` | not imported by the lab: "
                        f"{', '.join(f'`{f}`' for f in files)} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- scenario fields

def _scenario_model() -> tuple[Any, dict[str, str]]:
    """The `Scenario` model and the loader's one-line rules (`_FIELD_HELP`), wherever in lab.scenario
    they live."""
    package = importlib.import_module("lab.scenario")
    modules = [package] + [importlib.import_module(f"lab.scenario.{m.name}")
                           for m in pkgutil.iter_modules(package.__path__)]
    model = next(m.Scenario for m in modules if hasattr(m, "Scenario"))
    help_ = next((m._FIELD_HELP for m in modules if hasattr(m, "_FIELD_HELP")), {})
    return model, help_


def _default(info: Any) -> str:
    from pydantic_core import PydanticUndefined

    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None or value == () or value == {}:
        return "none"
    if hasattr(value, "model_dump"):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is PydanticUndefined:
        return "required"
    return f"`{value}`"


def _rule(info: Any) -> str:
    """What a field without a loader rule accepts, from its type and bounds."""
    import typing

    args = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in args)
    metadata = list(info.metadata)
    kinds = set()
    for arg in (info.annotation, *args):
        if typing.get_origin(arg) is typing.Annotated:
            kinds.add(typing.get_args(arg)[0])
            metadata += [m for item in arg.__metadata__ for m in (item, *getattr(item, "metadata", ()))]
        elif arg is not type(None):
            kinds.add(arg)
    bounds = [f"{op} {getattr(m, op)}" for m in metadata for op in ("ge", "gt", "le", "lt")
              if getattr(m, op, None) is not None]
    if kinds == {bool}:
        return "true or false"
    if int in kinds:
        return "a whole number" + (f" ({', '.join(bounds)})" if bounds else "")
    if str in kinds:
        pattern = next((m.pattern for m in metadata if getattr(m, "pattern", None)), None)
        return "text" + (f" matching `{pattern}`" if pattern else "")
    return "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def scenario_fields() -> str:
    model, help_ = _scenario_model()
    out: list[str] = []

    def table(cls: Any, prefix: str, title: str) -> None:
        out.extend([f"### {title}", ""])
        if prefix:
            for paragraph in (cls.__doc__ or "").strip().split("\n\n"):
                out.extend([_cell(" ".join(paragraph.split())), ""])
        out.extend(["| field | default | what it must be |", "|---|---|---|"])
        nested = []
        for name, info in cls.model_fields.items():
            if name == "source" and not prefix:
                continue   # set by the loader: the file the scenario was read from
            key = f"{prefix}{name}"
            candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
            target = next((a for a in candidates if hasattr(a, "model_fields")), None)
            if target is not None:
                nested.append((target, f"{key}."))
            rule = help_.get(key) or ("see below" if target is not None else _rule(info))
            out.append(f"| `{key}` | {_default(info)} | {_cell(rule)} |")
        out.append("")
        for target, sub_prefix in nested:
            table(target, sub_prefix, f"`{sub_prefix.rstrip('.')}`")

    table(model, "", "Top-level fields")
    return "\n".join(out)


# --------------------------------------------------------------------------- the hook

_GENERATORS = {
    "<!-- lab:commands -->": commands_reference,
    "<!-- lab:modules -->": modules_reference,
    "<!-- lab:scenario-fields -->": scenario_fields,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, make in _GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
