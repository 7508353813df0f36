"""The "How to replay" section that ends a bundle's report.md."""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from lab.core.arch import with_emulated_env
from lab.core.results import RunResult, UnfinishedRun
from lab.report.writer import render
from lab.scenario.bases import DEFAULT_BASE

REPLAY_HEADING = "## How to replay"



AnyResult = RunResult | UnfinishedRun


@dataclass(frozen=True)
class ReplayView:
    """What the section (lab/report/templates/replay-instructions.md.j2) is laid out from."""

    heading: str
    platform: str
    arch: str
    bundle: str      # shell-quoted, as every value below that goes on a command line
    folder: str
    note: str | None
    base: str
    run: str
    emulated: bool


def verdict_text(result: AnyResult) -> str | None:
    """The run's verdict as a string, or None when it has none."""
    return None if result.verdict is None else result.verdict.value


def _base(result: AnyResult, scenario: Mapping[str, Any]) -> tuple[str, str | None]:
    base = result.base if isinstance(result, RunResult) else None
    requested = (base.requested if base else None) or scenario.get("base") or DEFAULT_BASE
    note = None
    if base is not None and base.origin == "bootstrapped":
        note = (f"# The original engine had no registry and built {requested} from Debian's archive "
                "(scenario.yaml: resolved.base.recipe); with a registry, docker pulls it.")
    return str(requested), note


def _run_env(scenario: Mapping[str, Any], result: AnyResult) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in (scenario.get("env"), (scenario.get("resolved") or {}).get("vars")
                   if isinstance(scenario.get("resolved"), dict) else None):
        if isinstance(source, dict):
            env.update({str(k): str(v) for k, v in source.items()})
    if result.backend:
        env["LAB_BACKEND"] = result.backend
    if result.mode:
        env["LAB_MODE"] = result.mode
    return with_emulated_env(env, getattr(result, "emulated", False))


def replay_instructions(bundle_name: str, result: AnyResult, *, scenario: Mapping[str, Any] | None = None,
                        folder: str | None = None) -> str:
    """The "How to replay" section that ends a bundle's report.md (markdown).

    `result` is the run's result.json, `scenario` its scenario.yaml (for the script's environment,
    GPU and limits), `folder` the bundle's top folder (default: the run folder named in result.json).
    """
    scenario = scenario or {}
    folder = folder or PurePosixPath(result.run_dir).name or bundle_name.removesuffix(".tar.gz").removesuffix(".tgz")
    platform = f"linux/{result.arch}"
    base, note = _base(result, scenario)
    run = ["docker", "run", "--rm", "--platform", platform]
    if scenario.get("gpu") is True:
        run += ["--gpus", "all"]
    if scenario.get("network") is not True:
        run += ["--network", "none"]
    limits = scenario.get("limits")
    if isinstance(limits, dict):
        if limits.get("memory"):
            run += ["--memory", str(limits["memory"])]
        if limits.get("pids"):
            run += ["--pids-limit", str(limits["pids"])]
        if limits.get("cpus"):
            run += ["--cpus", str(limits["cpus"])]
    for key, value in sorted(_run_env(scenario, result).items()):
        run += ["-e", f"{key}={value}"]
    run += ["-e", "LD_DEBUG=libs,files", "repro"]
    return render("replay-instructions.md.j2", ReplayView(
        heading=REPLAY_HEADING, platform=platform, arch=platform.split("/")[1], bundle=shlex.quote(bundle_name),
        folder=shlex.quote(folder), note=note, base=shlex.quote(base), run=shlex.join(run),
        emulated=isinstance(result, RunResult) and result.emulated))
