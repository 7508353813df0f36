"""From the command line to the lab's inputs: the settings, the runs folder, a scenario (with --deps),
a case, the engines (a fleet). Nothing here prints but the local engine's "not confined" warning."""

from __future__ import annotations

from pathlib import Path

from lab.build.resolve import check_deps, resolve
from lab.cli.output import log
from lab.core.config import Settings, current
from lab.core.errors import ScenarioError
from lab.engine.gpu import cpu_variant_hint
from lab.engine.local_engine import LocalOptions
from lab.engine.routing import Fleet, NoEngineError, open_fleet
from lab.pipeline import check_gpu, check_local, is_local
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


def fleet(engines: list[str] | None, jobs: int | None, python_env: str = "venv",
          trust_script: bool = False) -> Fleet:
    """The engines this command may use (see lab.engine.routing.open_fleet), the local engine with
    its options."""
    if python_env not in ("venv", "current"):
        raise ScenarioError(f"--python-env {python_env!r}: choose venv or current.", field="--python-env")
    return open_fleet(engines or (), settings()["engines"], jobs, warn=log.warning,
                      local=local_options(python_env, trust_script))


def local_options(python_env: str = "venv", trust_script: bool = False) -> LocalOptions:
    chosen = settings()
    python = chosen["local.python"]
    return LocalOptions(python_env=python_env, python=str(python) if python else None,
                        bwrap=chosen["local.bwrap"], trust_script=trust_script)


def engine_for(fleet: Fleet, case):
    """The best engine for one case: native before QEMU, a GPU case only where the NVIDIA runtime is."""
    try:
        route = fleet.routes(case.arch.value, case.scenario.gpu, case.name, gpu_hint(case.scenario))[0]
    except NoEngineError:
        live = fleet.live_engines()
        if case.scenario.gpu and len(live) == 1:  # one engine: its own answer, its fix, the CPU variant
            check_gpu(case, live[0])
        raise
    return fleet.engine(route.engine)


def gpu_hint(scenario: Scenario) -> str | None:
    """A GPU scenario's way out where no engine gives containers GPUs: its CPU variant."""
    return cpu_variant_hint(scenario.cpu_variant).strip() or None


def refuse_local(case, engine) -> None:
    """The local engine's refusals (another arch, no sandbox without --trust-script, missing system
    packages), before anything is made; a warning when it will run the script not confined."""
    if is_local(engine):
        check_local(case, engine)
        if not engine.confinement.confined:
            log.warning("the local engine runs the script NOT CONFINED (--trust-script): "
                        f"{engine.confinement.problem}")
