"""The bisect driver: candidate releases from the index, one real run per probe, resumable.

`lab.bisect` decides which release to probe; this module runs it. Each probe is an
ordinary run folder, `<runs>/<scenario>/bisect-<arch>-<from>-<to>/torch<version>/`, so
an interrupted bisection resumes from the folders that already hold a verdict: the
same command, run again, asks for the same releases and reuses those answers.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import releases
from .bisect import BisectResult, Probe, bisect
from .engine import Engine
from .errors import EngineError, LabError, ScenarioError
from .hostpip import HostPip
from .records import Events, no_events
from .resolve import base_python, parse_arch, resolve
from .scenario import Scenario

_RESUMABLE = ("reproduced", "not_reproduced", "error", "timeout")


@dataclass(frozen=True)
class BisectRun:
    folder: Path
    result: BisectResult
    candidates: list[str]
    resume_command: str


def bisect_folder(runs_root: Path, scenario: Scenario, arch: str, old: str, new: str) -> Path:
    return runs_root / scenario.name / f"bisect-{arch}-{old}-{new}"


def resume_command(scenario_ref: str, old: str, new: str, arch: str, runs_root: Path, pre: bool) -> str:
    words = ["lab", "bisect", scenario_ref, "--from", old, "--to", new, "--arch", arch, "--out", str(runs_root)]
    return shlex.join(words + (["--pre"] if pre else []))


def choose_arch(scenario: Scenario, arch: str | None) -> str:
    chosen = parse_arch(arch)
    if chosen:
        return chosen
    if len(scenario.arch) == 1:
        return scenario.arch[0].value
    raise ScenarioError(f"the scenario pins several arches ({', '.join(a.value for a in scenario.arch)}); "
                        "choose one with --arch.", file=str(scenario.source), field="arch")


def find_candidates(scenario: Scenario, arch: str, old: str, new: str, host: HostPip, pre: bool,
                    refresh: bool = False) -> list[str]:
    python = base_python(scenario.base)
    if python is None:
        raise ScenarioError(f"the lab cannot tell which Python the base image {scenario.base} has, so it "
                            "cannot pick the releases that have a wheel for it.", file=str(scenario.source),
                            field="base", hint="Bisect a scenario on a Debian or Ubuntu base.")
    found = releases.candidates("torch", host=host, python=python, arch=arch, include_pre=pre, refresh=refresh)
    return releases.between(found, old, new, what=releases.describe(python, arch))


def run_bisect(scenario: Scenario, scenario_ref: str, old: str, new: str, arch: str | None, engine: Engine,
               host: HostPip, runs_root: Path, events: Events = no_events, *, pre: bool = False,
               sets: dict[str, str] | None = None, on_probe: Callable[[Probe, bool], None] | None = None,
               on_start: Callable[[list[str], Path, str], None] | None = None,
               keep_images: bool = False) -> BisectRun:
    """Bisect `scenario` between the torch releases `old` and `new` on `arch`.

    `on_start(candidates, folder, resume)` is called once the releases are known; `on_probe(probe,
    reused)` after each probe. Raises LabError for bad input or when the engine itself fails.

    A bisection never probes a release twice, so the images its probes built are removed after
    each probe unless `keep_images` (aarch64 torch from 2.11.0 makes images of about 7 GB)."""
    from .bisect_report import write_bisect_report
    from .pipeline import run_case

    arch = choose_arch(scenario, arch)
    candidates = find_candidates(scenario, arch, old, new, host, pre)
    folder = bisect_folder(runs_root, scenario, arch, candidates[0], candidates[-1])
    folder.mkdir(parents=True, exist_ok=True)
    resume = resume_command(scenario_ref, old, new, arch, runs_root, pre)
    if on_start:
        on_start(candidates, folder, resume)

    def probe(version: str) -> Probe:
        run_dir = folder / f"torch{version}"
        previous = _finished(run_dir)
        if previous is not None:
            p = _probe_from(version, previous, run_dir)
            if on_probe:
                on_probe(p, True)
            return p
        if run_dir.exists():  # interrupted or failed before a verdict: start it again
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        case = resolve(scenario, torch=version, arch=arch, sets=sets)
        events("bisect", f"probing torch {version} ({case.name})")
        try:
            outcome = run_case(case, engine, host, runs_root, events, run_dir=run_dir, diagnose=False,
                               collect_env=False)
            p = _probe_from(version, outcome.result, run_dir)
            image = outcome.result.get("image") or {}
            if not keep_images and image.get("cached") is False:
                events("bisect", f"removing the probe's image {image['tag']} (keep it with --keep-images)")
                engine.anchor_shared_layers(image["tag"])  # the apt and venv layers serve the next probe
                engine.remove_image(image["tag"])
        except EngineError:
            raise  # the engine itself is gone: nothing else can run either
        except LabError as exc:  # this release cannot be set up here: a skip, never a boundary
            p = Probe.judged(version, "error", reason=str(exc).split("\n")[0][:300], run_dir=str(run_dir))
        if on_probe:
            on_probe(p, False)
        return p

    result = bisect(candidates, probe)
    write_bisect_report(folder, scenario.name, arch, result, candidates, resume)
    return BisectRun(folder, result, candidates, resume)


def _finished(run_dir: Path) -> dict | None:
    """The result.json of a probe that reached a verdict, if the folder has one."""
    try:
        data = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("verdict") in _RESUMABLE else None


def _probe_from(version: str, result: dict, run_dir: Path) -> Probe:
    summary = result.get("summary") or []
    evidence = "; ".join(summary[:2]) if summary else ""
    return Probe.judged(version, result["verdict"], reason=result.get("reason", ""), evidence=evidence,
                        run_dir=str(run_dir))
