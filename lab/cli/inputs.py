"""From the command line to the lab's inputs: the settings, the runs folder, a scenario (with --deps),
a case. The engines are in lab.cli.routing."""

from __future__ import annotations

from pathlib import Path

from lab.core.config import Settings, current
from lab.core.errors import ScenarioError
from lab.image.resolve import check_deps, resolve
from lab.scenario.lookup import load_scenario
from lab.scenario.model import Scenario


def settings() -> Settings:
    return current()


def runs_root(out_dir: Path | None) -> Path:
    return settings().with_flag("runs_dir", out_dir, "--out").runs_dir


def scenario_dirs() -> list[Path]:
    return [d.path for d in settings().scenario_dirs()]


def load(ref: str, deps: str | None = None) -> Scenario:
    return with_deps(load_scenario(ref, scenario_dirs()), deps)


def with_deps(scenario: Scenario, deps: str | None) -> Scenario:
    """The scenario with `--deps` in place of its own `deps` (checked: a clear error names --deps)."""
    if deps is None:
        return scenario
    return scenario.model_copy(update={"deps": check_deps(deps)})


def arch_for(scenario: Scenario, arch: str | None) -> str | None:
    """--arch, else the default_arch setting where the scenario lists several arches and that one."""
    if arch is not None or len(scenario.arch) < 2:
        return arch
    default = settings().default_arch
    return default.value if default is not None and default in scenario.arch else None


def case(ref: str, torch: str | None, arch: str | None, backend: str | None = None,
         sets: list[str] | None = None, mode: str | None = None):
    scenario = load(ref)
    return resolve(scenario, torch=torch, arch=arch_for(scenario, arch), backend=backend,
                   sets=parse_sets(sets or []), mode=mode)


def parse_sets(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"--set expects NAME=VALUE, got {item!r}.", field="--set")
        pairs[key] = value
    return pairs
