"""`lab build` and `lab build-base`: a scenario's image, a base image."""

from __future__ import annotations

from typing import Annotated

import typer

from lab.cli import inputs, routing
from lab.cli.guard import guard
from lab.cli.options import ArchOpt, EngineOpt, ScenarioArg, TorchOpt
from lab.cli.output import Progress, err, out
from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.engine.docker_engine import Engine
from lab.image import era
from lab.image.base import ensure_base
from lab.image.builder import build_image, check_release
from lab.image.hostpip import discover
from lab.image.render import BASE_PACKAGES, plan_build
from lab.image.resolve import parse_arch
from lab.scenario.model import is_debian_package


def build(scenario: ScenarioArg, torch: TorchOpt = None, arch: ArchOpt = None, engines: EngineOpt = None) -> None:
    """Build the image for a scenario (bootstrapping its base if no registry answers)."""
    def body() -> None:
        case = inputs.case(scenario, torch, arch)
        host = discover()
        check_release(case, host)  # before anything is built
        engine = routing.engine_for(routing.fleet(engines, None), case)
        with Progress() as progress:
            case = era.apply(case, host, progress)[0]  # `deps: era` or a date: pinned as a run pins them
            # an image to use on its own (`docker run` it): torch is in it, never mounted from the lab's cache
            image = build_image(plan_build(case, host, progress), engine, host, progress, for_runs=False)
        err.print(f"{'cached' if image.cached else 'built'} {image.tag} "
                  f"({image.base.origin} base {image.base.ref})")
        out.print(image.tag, markup=False)
    guard(body)


def build_base(
    image: Annotated[str, typer.Argument(help="Base image, e.g. debian:bookworm.")] = "debian:bookworm",
    arch: Annotated[str | None, typer.Option("--arch", help="amd64 or arm64 (default: the default_arch "
                                             "setting, else amd64).", show_default=False)] = None,
    packages: Annotated[str | None, typer.Option(
        "--packages", help="A scenario's system_packages, comma-separated (e.g. g++,python3-dev): a "
        "bootstrapped base then includes them with the lab's own, as that scenario's runs get it.",
        show_default=False)] = None,
) -> None:
    """Make sure a base image is on the engine (present, pulled, or bootstrapped); print its tag."""
    def body() -> None:
        default = inputs.settings().default_arch
        chosen = Arch(parse_arch(arch) or (default.value if default else "amd64"))
        wanted = tuple(p.strip() for p in (packages or "").split(",") if p.strip())
        for name in wanted:
            if not is_debian_package(name):
                raise ScenarioError(f"{name!r} is not a Debian package name.", field="--packages",
                                    hint="Give names such as g++,python3-dev, separated by commas.")
        include = tuple(sorted(set(BASE_PACKAGES) | set(wanted))) if wanted else ()
        with Progress() as progress:
            base = ensure_base(Engine.connect(), image, chosen, progress, include)
        err.print(f"{base.origin}: {base.ref} ({base.image_id[:19]})")
        out.print(base.ref, markup=False)
    guard(body)
