"""The engines a command may use: a fleet of the Docker engines and the local one (with its options),
the best engine for a case, and the local engine's refusals. Nothing here prints but the local
engine's "not confined" warning."""

from __future__ import annotations

from lab.cli import inputs
from lab.cli.output import log
from lab.core.errors import ScenarioError
from lab.engine.gpu import cpu_variant_hint
from lab.engine.local_engine import LocalOptions
from lab.engine.routing import Fleet, NoEngineError, open_fleet
from lab.scenario.model import Scenario


def fleet(engines: list[str] | None, jobs: int | None, python_env: str = "venv",
          trust_script: bool = False) -> Fleet:
    """The engines this command may use (see lab.engine.routing.open_fleet), the local engine with
    its options."""
    if python_env not in ("venv", "current"):
        raise ScenarioError(f"--python-env {python_env!r}: choose venv or current.", field="--python-env")
    return open_fleet(engines or (), inputs.settings()["engines"], jobs, warn=log.warning,
                      local=local_options(python_env, trust_script))


def local_options(python_env: str = "venv", trust_script: bool = False) -> LocalOptions:
    chosen = inputs.settings()
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
            live[0].check(case)
        raise
    return fleet.engine(route.engine)


def gpu_hint(scenario: Scenario) -> str | None:
    """A GPU scenario's way out where no engine gives containers GPUs: its CPU variant."""
    return cpu_variant_hint(scenario.cpu_variant).strip() or None


def check_engine(case, engine) -> None:
    """The engine's refusals (a GPU it lacks; the local engine: another arch, no sandbox without
    --trust-script, missing system packages), before anything is made; a warning when it will run the
    script not confined."""
    engine.check(case)
    if not engine.confined:
        log.warning(f"the {engine.name} engine runs the script NOT CONFINED (--trust-script): "
                    f"{engine.unconfined_reason}")
