"""What `lab run` asks for, typed: `RunRequest` (the scenario, the matrix's lists, -k, --repeat,
--ablate, --check) and `RunOptions` (how each run goes), and `plan_run`, which turns a request into
the cases to run, refusing bad combinations and unrunnable cases before anything is built or any
engine is asked."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab.core.errors import ScenarioError
from lab.core.records import Events
from lab.drivers.matrix import expand, select, split_list
from lab.image.builder import check_release
from lab.image.hostpip import HostPip, discover
from lab.image.resolve import Case, parse_arch
from lab.pipeline import RunOutcome, run_case, run_limits
from lab.scenario.model import Scenario

LOCAL_ENGINE_NAMES = frozenset({"local", "local://"})


@dataclass(frozen=True)
class RunOptions:
    """How each run of a case goes: lab.pipeline.run_case's options."""
    diagnose: bool | None = None
    compile_debug: bool = False
    allow_network: bool = False

    def later_run(self) -> RunOptions:
        """The options of a repeat's second and later runs: the diagnose step says the same thing every time."""
        return replace(self, diagnose=False, compile_debug=False)

    def run(self, case: Case, engine, host: HostPip, runs_root: Path, events: Events) -> RunOutcome:
        return run_case(case, engine, host, runs_root, events, diagnose=self.diagnose,
                        compile_debug=self.compile_debug, allow_network=self.allow_network)


@dataclass(frozen=True)
class RunRequest:
    """`lab run`: a scenario (a name or a path, and --deps), one version or a comma-separated list of
    them and of arches (a matrix), and what to do with the cases."""
    scenario: str
    deps: str | None = None
    torch: str | None = None
    arch: str | None = None
    backend: str | None = None
    mode: str | None = None
    sets: Mapping[str, str] = field(default_factory=dict)
    select: str | None = None
    repeat: int = 1
    ablate: bool = False
    check: bool = False
    engines: tuple[str, ...] = ()
    options: RunOptions = field(default_factory=RunOptions)

    @property
    def only_local(self) -> bool:
        """Whether --engine names the local engine alone (its Python is the host's, not a base image's)."""
        return bool(self.engines) and {e.strip() for e in self.engines} <= LOCAL_ENGINE_NAMES


@dataclass(frozen=True)
class RunPlan:
    cases: list[Case]
    host: HostPip

    @property
    def single(self) -> bool:
        return len(self.cases) == 1


def plan_run(request: RunRequest, load: Callable[[str, str | None], Scenario]) -> RunPlan:
    """The cases of `request` (its scenario read with `load(ref, deps)`), each checked: its limits
    (network), and, on an engine with a base image, that the release has a wheel for it."""
    if request.ablate and (request.backend or request.mode):
        raise ScenarioError("--ablate runs every backend; leave out --backend and --mode.", field="--ablate")
    versions = split_list(request.torch, "--torch")
    arches = [parse_arch(a) for a in split_list(request.arch, "--arch") or []] or None
    loaded = load(request.scenario, request.deps)
    cases = select(expand(loaded, versions, arches, request.backend, dict(request.sets), request.mode),
                   request.select)
    if not cases:
        raise ScenarioError(f"-k {request.select!r} matches no cell.", field="-k")
    if request.repeat < 1:
        raise ScenarioError(f"--repeat must be 1 or more, not {request.repeat}.", field="--repeat")
    if request.ablate and (len(cases) > 1 or request.repeat > 1):
        raise ScenarioError("--ablate runs one case: choose one torch version and one arch.", field="--ablate")
    if request.check and (len(cases) > 1 or request.repeat > 1 or request.ablate):
        raise ScenarioError("--check judges one run: choose one torch version and one arch, without "
                            "--repeat or --ablate.", field="--check")
    host = discover()
    for c in cases:  # refuse before anything is built, or any engine is asked
        run_limits(c, request.options.allow_network)
        if not request.only_local:  # the local engine's Python is the host's, not the base image's: uv says
            check_release(c, host)
    return RunPlan(cases, host)
