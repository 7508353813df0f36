"""Finding a scenario: by name in the scenario folders (the project's, then the shipped ones) or by
path, loading it, and listing a folder's scenarios."""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Sequence
from pathlib import Path

from lab.core.config import current
from lab.core.errors import ScenarioError
from lab.core.resources import shipped_scenarios_dir
from lab.scenario.errors import display_path, is_file, scenario_error
from lab.scenario.loader import read_yaml, validate_scenario
from lab.scenario.model import Scenario


def default_scenarios_dir() -> Path:
    """The shipped scenarios (package data, lab.scenarios). The CLI searches the project's
    `scenarios/` first (lab.config); library calls without a folder use this one."""
    return shipped_scenarios_dir(current().cache_dir)


# The folder library calls use without one: the shipped scenarios, found on first use (reading the
# settings at import would turn a bad config file into an import error). Tests may set it.
SCENARIOS_DIR: Path | None = None


def _default_dir() -> Path:
    return SCENARIOS_DIR if SCENARIOS_DIR is not None else default_scenarios_dir()
ScenarioDirs = Path | Sequence[Path]


def _load_file(path: Path) -> Scenario:
    data, lines = read_yaml(path)
    return validate_scenario(data, lines, source=path)


def _scenario_files(scenarios_dir: Path) -> list[Path]:
    files = [p for p in scenarios_dir.iterdir() if p.suffix in (".yaml", ".yml") and is_file(p)]
    return sorted(files, key=lambda p: p.name)


def _available_names(scenarios_dirs: Sequence[Path]) -> list[str]:
    names: set[str] = set()
    for folder in scenarios_dirs:
        with contextlib.suppress(OSError):
            names |= {p.stem for p in _scenario_files(folder)}
    return sorted(names)


def _unknown_scenario(name: str, scenarios_dirs: Sequence[Path]) -> ScenarioError:
    folders = " and ".join(str(d) for d in scenarios_dirs)
    names = _available_names(scenarios_dirs)
    if not names:
        return scenario_error(
            f"unknown scenario {name!r}: there are no scenario files in {folders}",
            hint="Pass the path of a YAML file, or set scenarios_dir (LAB_SCENARIOS_DIR) to the scenarios folder.",
        )
    ranked = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)
    close = difflib.get_close_matches(name, names, n=1)
    ranked += [n for n in names if n not in ranked]
    return scenario_error(
        f"unknown scenario {name!r}; available in {folders}: {', '.join(ranked)}",
        hint=f"Did you mean {close[0]}?" if close else "Pass one of these names or the path of a YAML file.",
    )


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith((".yaml", ".yml"))


def _as_dirs(scenarios_dir: ScenarioDirs | None) -> list[Path]:
    if scenarios_dir is None:
        return [_default_dir()]
    return [scenarios_dir] if isinstance(scenarios_dir, Path) else list(scenarios_dir)


def find_by_name(name: str, scenarios_dirs: Sequence[Path]) -> Path | None:
    """The file a scenario name stands for: `<name>.yaml`/`.yml` in the first folder that has one."""
    for folder in scenarios_dirs:
        for suffix in (".yaml", ".yml"):
            if is_file(folder / f"{name}{suffix}"):
                return folder / f"{name}{suffix}"
    return None


def _resolve_ref(ref: str | Path, scenarios_dirs: Sequence[Path]) -> Path:
    text = str(ref)
    if isinstance(ref, Path) or _looks_like_path(text):
        path = Path(text).expanduser()
        if is_file(path):
            return path
        if not isinstance(ref, Path) and "/" not in text:
            for folder in scenarios_dirs:
                if is_file(folder / text):
                    return folder / text
        problem = "is not a file" if os.path.lexists(text) else "does not exist"
        raise scenario_error(f"the scenario file {problem}", file=display_path(path),
                            hint="Check the path, or pass a scenario name instead.")
    found = find_by_name(text, scenarios_dirs)
    if found is not None:
        return found
    raise _unknown_scenario(text, scenarios_dirs)


def load_scenario(ref: str | Path, scenarios_dir: ScenarioDirs | None = None) -> Scenario:
    """Load a scenario by name (`<name>.yaml`/`.yml` in the first of the folders that has it) or by
    path to a YAML file.

    `scenarios_dir` is one folder or a list searched in order (the CLI passes the project's, then
    the shipped one); it defaults to `SCENARIOS_DIR`.  Every failure is a `ScenarioError`.
    """
    return _load_file(_resolve_ref(ref, _as_dirs(scenarios_dir)))


def list_scenarios(scenarios_dir: Path | None = None) -> list[Scenario | ScenarioError]:
    """Every `*.yaml`/`*.yml` in the folder, sorted by file name; a broken file yields its error.

    Raises ScenarioError only when the folder itself cannot be read.
    """
    directory = _default_dir() if scenarios_dir is None else scenarios_dir
    try:
        files = _scenario_files(directory)
    except OSError as exc:
        raise scenario_error(
            f"cannot list the scenarios folder {directory}: {exc.strerror or exc}",
            hint="Create it, or set scenarios_dir (LAB_SCENARIOS_DIR) to the folder that holds the scenario files.",
        ) from None
    results: list[Scenario | ScenarioError] = []
    for path in files:
        try:
            results.append(_load_file(path))
        except ScenarioError as exc:
            results.append(exc)
    return results
