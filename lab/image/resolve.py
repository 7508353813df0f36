"""Scenario -> Case: pick one torch version, one architecture and one backend."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from functools import cached_property

from packaging.tags import Tag, compatible_tags, cpython_tags

from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.scenario.bases import DEFAULT_GLIBC, base_glibc, base_python  # noqa: F401 - (re-exported: their old home)
from lab.scenario.model import Scenario, check_version, parse_deps

BACKENDS = ("eager", "aot_eager", "inductor")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

def wheel_tags(python: str, arch: Arch | str) -> frozenset[Tag]:
    """The wheel tags a Linux CPython `python` ("3.11") on `arch` accepts, the legacy
    `manylinux2010`/`manylinux1` names included (PyPI's x86_64 torch up to 2.6.0 has them)."""
    major, minor = (int(x) for x in python.split(".")[:2])
    machine = Arch.parse(arch).uname
    platforms = [f"manylinux_2_{n}_{machine}" for n in range(40, 4, -1)]
    platforms += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}",
                  f"linux_{machine}"]
    return frozenset([*cpython_tags((major, minor), platforms=platforms),
                      *compatible_tags((major, minor), platforms=platforms)])


def parse_arch(value: str | None, option: str = "--arch") -> str | None:
    """An architecture given on the command line, as `amd64`/`arm64`; a clear error otherwise."""
    if value is None:
        return None
    try:
        return Arch.parse(value).value
    except ValueError as exc:
        raise ScenarioError(f"{exc}.", field=option) from None


def host_arch() -> Arch:
    return Arch.parse(platform.machine())


@dataclass(frozen=True)
class Case:
    """One concrete thing to build and run: a scenario at one torch version, arch and backend."""

    scenario: Scenario
    torch: str
    arch: Arch
    backend: str | None = None
    vars: tuple[tuple[str, str], ...] = field(default=())
    mode: str | None = None
    # How everything but torch resolves (lab.image.era): `latest`, `era` or a date. Part of the key.
    deps: str = "latest"
    # `name==version` pins the lab chose itself (a bisection's blame step, a replay): part of the key.
    pins: tuple[str, ...] = ()
    # The era's resolved pins (lab.image.era.apply, on the host before the build): derived from
    # `deps`, so not part of the content key; part of the requirements and so of the site key.
    resolved: tuple[str, ...] = field(default=(), compare=False)
    # The era's or date's cut (an RFC 3339 time), set with `resolved`: what the local engine's venv seeds
    # (pip, setuptools) is taken as of it too, so torch 2.0's Inductor meets a setuptools that still has
    # pkg_resources (removed in setuptools 81). None for `latest`.
    deps_cut: str | None = field(default=None, compare=False)
    # `name==version` constraints on what the requirements pull in (a replay: every version the
    # original run had, from its freeze). Not requirements: the Dockerfile does not change, uv on the
    # host resolves the same requirements to exactly these versions. Part of the key and the site key.
    constraints: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        parts = [f"torch={self.torch}", f"arch={self.arch.value}"]
        if self.backend:
            parts.append(f"backend={self.backend}")
        if self.mode:
            parts.append(f"mode={self.mode}")
        return f"{self.scenario.name}[{','.join(parts)}]"

    @property
    def hooked(self) -> bool:
        """Whether the lab's runner must override the script's torch.compile backend/mode."""
        return self.scenario.ablation.via == "hook" and bool(self.backend or self.mode)

    @property
    def python(self) -> str | None:
        return base_python(self.scenario.base)

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"torch=={self.torch}", *self.scenario.pip, *self.pins, *self.resolved)

    @cached_property
    def wheel_tags(self) -> frozenset[Tag]:
        """Wheel tags the image's Python accepts (used to pick host-local wheels)."""
        return frozenset() if self.python is None else wheel_tags(self.python, self.arch)

    def run_env(self) -> dict[str, str]:
        """Environment for the repro script: scenario env, then variables, then the backend."""
        env = dict(self.scenario.env)
        env.update(dict(self.vars))
        if self.backend:
            env["LAB_BACKEND"] = self.backend
        if self.mode:
            env["LAB_MODE"] = self.mode
        if self.hooked:
            env["LAB_COMPILE_HOOK"] = "1"
        return env


def resolve(scenario: Scenario, torch: str | None = None, arch: str | None = None,
            backend: str | None = None, sets: dict[str, str] | None = None,
            mode: str | None = None, deps: str | None = None, pins: tuple[str, ...] = (),
            constraints: tuple[str, ...] = ()) -> Case:
    """Choose the case to run. A scenario that pins several versions or arches needs a choice.

    Every value given here is checked as strictly as the scenario file's: `torch` must be a PEP 440
    version (it reaches the Dockerfile), `arch`, `backend` and `mode` one of their known values."""
    version = _pick(scenario, "torch", scenario.torch, None if torch is None else check_version(torch))
    chosen_arch = _pick(scenario, "arch", tuple(a.value for a in scenario.arch), parse_arch(arch))
    _check_backend(scenario, backend, mode)
    if sets:
        scenario = scenario.with_vars(sets)
    setting = scenario.deps if deps is None else check_deps(deps)
    return Case(scenario=scenario, torch=version, arch=Arch(chosen_arch), backend=backend,
                vars=tuple(sorted(scenario.vars.items())), mode=mode, deps=setting, pins=tuple(pins),
                constraints=tuple(constraints))


def check_deps(value: str, option: str = "--deps") -> str:
    """A deps setting from the command line, canonical; a clear error otherwise."""
    try:
        return parse_deps(value)
    except ValueError as exc:
        raise ScenarioError(f"{exc}.", field=option) from None


def _check_backend(scenario: Scenario, backend: str | None, mode: str | None) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ScenarioError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.",
                            field="--backend")
    if mode is not None and mode not in MODES:
        raise ScenarioError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}.", field="--mode")
    if mode is not None and backend not in (None, "inductor"):
        raise ScenarioError(f"--mode {mode} needs the inductor backend, not {backend}.", field="--mode")
    if backend or mode:
        check_ablatable(scenario)


def check_ablatable(scenario: Scenario) -> None:
    """Refuse to choose the backend of a script that hard-codes it as part of the bug."""
    if scenario.ablation.via == "none":
        raise ScenarioError(
            "this scenario's script hard-codes its torch.compile backend (ablation.via: none), "
            "so --backend, --mode and --ablate do not apply.", file=str(scenario.source), field="ablation.via",
            hint="Set `ablation: {via: hook}` to let the lab override it, or `via: env` if the script "
                 "reads LAB_BACKEND.")


def _pick(scenario: Scenario, key: str, pinned: tuple[str, ...], wanted: str | None) -> str:
    if wanted is not None:
        return wanted
    if len(pinned) == 1:
        return pinned[0]
    raise ScenarioError(
        f"the scenario pins several values ({', '.join(pinned)}); choose one with --{key}.",
        file=str(scenario.source), field=key)
