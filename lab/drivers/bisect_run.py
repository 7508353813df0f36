"""The bisect driver: candidate releases from the index, one real run per probe, resumable.

`lab.bisect` decides which release to probe; this module runs it. Each probe is an
ordinary run folder, `<runs>/<scenario>/bisect-<arch>-<from>-<to>/torch<version>/`, so
an interrupted bisection resumes from the folders that already hold a verdict: the
same command, run again, asks for the same releases and reuses those answers, each only when its
result.json records the content key the probe has now (lab.image.casekey: the scenario, script,
expect, vars and `--set`, base, dependencies and the lab's templates and rules). A probe made from
something else runs again, and the progress says why.

Before it runs a release, a bisection looks for an earlier run of the very same case under the runs
root (a `lab run`, a matrix cell, a triage's runs, another bisection's probes: lab.history.earlier)
and takes its verdict, saying so in its notes and in the probe (`reused_from`). While a round runs,
the releases the next round may ask for are made ready (lab.drivers.bisect_ahead), and under
emulation two probes run at once on two cores. `collect_env` runs only for the boundary's two
releases, once the boundary is known (`probe_details` asks for it, and the diagnose step's default,
on every probe).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lab.cache_policy import inventory as cache_policy
from lab.cache_policy.room import CacheSpaceError
from lab.compare.diff import compare_runs
from lab.core import cancel
from lab.core.errors import EngineError, LabError, ResultError, ScenarioError
from lab.core.records import Events, no_events
from lab.core.results import (
    AMBIGUOUS,
    FOUND,
    RESULT_NAME,
    SKIP,
    BlameStep,
    FailureSignature,
    FailureSignatures,
    LocalizeResult,
    Record,
    RunResult,
    SourceBoundary,
    outcome_of,
    read_document,
    read_result,
)
from lab.drivers.bisect import BisectResult, Probe, bisect
from lab.drivers.bisect_ahead import Prefetcher, emulated_width
from lab.drivers.bisect_report import write_bisect_report
from lab.drivers.blame import blame_boundary
from lab.drivers.localize import is_compile_failure
from lab.drivers.localize import localize as localize_case
from lab.drivers.parallel import EngineGone, on_engine, remove_containers, run_all
from lab.engine.gpu import cpu_variant_hint
from lab.engine.protocol import Engine
from lab.engine.routing import Fleet, NoEngineError
from lab.history.earlier import earlier_verdicts
from lab.image import era, releases
from lab.image.casekey import content_key
from lab.image.crossinstall import target_for
from lab.image.hostpip import HostPip
from lab.image.resolve import base_python, parse_arch, resolve
from lab.pipeline import RunCase, collect_env_for
from lab.pipeline import make_ready as make_case_ready
from lab.pipeline import run_case as production
from lab.scenario.model import Scenario


class Releases(Protocol):
    """Where the candidate releases come from: torch versions, oldest first, that have a wheel for
    `python` on `arch`. `index_releases(host)` reads the host's package index; tests pass a list."""

    def __call__(self, *, python: str, arch: str, include_pre: bool) -> list[str]: ...


def index_releases(host: HostPip, refresh: bool = False) -> Releases:
    """The torch releases on the index (and find-links) that the host's pip uses."""
    def found(*, python: str, arch: str, include_pre: bool) -> list[str]:
        return releases.candidates("torch", host=host, python=python, arch=arch, include_pre=include_pre,
                                   refresh=refresh)
    return found


@dataclass(frozen=True)
class BisectRun:
    folder: Path
    result: BisectResult
    candidates: list[str]
    resume_command: str


def bisect_folder(runs_root: Path, scenario: Scenario, arch: str, old: str, new: str) -> Path:
    """`bisect-<arch>-<old>-<new>`, with `-deps-<setting>` when the dependencies are not `latest`."""
    deps = "" if scenario.deps == "latest" else "-deps-" + scenario.deps.replace(":", "")
    return runs_root / scenario.name / f"bisect-{arch}-{old}-{new}{deps}"


def resume_command(scenario_ref: str, old: str, new: str, arch: str, runs_root: Path, pre: bool,
                   engine_words: tuple[str, ...] = (), sets: dict[str, str] | None = None) -> str:
    """The command that resumes the bisection: the same releases, arch, runs folder and `--set`
    values, so that its probes have the same content key and are reused."""
    words = ["lab", "bisect", scenario_ref, "--from", old, "--to", new, "--arch", arch, "--out", str(runs_root)]
    for name, value in sorted((sets or {}).items()):
        words += ["--set", f"{name}={value}"]
    return shlex.join(words + (["--pre"] if pre else []) + list(engine_words))


def choose_arch(scenario: Scenario, arch: str | None) -> str:
    chosen = parse_arch(arch)
    if chosen:
        return chosen
    if len(scenario.arch) == 1:
        return scenario.arch[0].value
    raise ScenarioError(f"the scenario pins several arches ({', '.join(a.value for a in scenario.arch)}); "
                        "choose one with --arch.", file=str(scenario.source), field="arch")


def find_candidates(scenario: Scenario, arch: str, old: str, new: str, source: Releases, pre: bool,
                    python: str | None = None) -> list[str]:
    """The releases from `old` to `new` with a wheel for `python` (default: the base image's)."""
    python = python or base_python(scenario.base)
    if python is None:
        raise ScenarioError(f"the lab cannot tell which Python the base image {scenario.base} has, so it "
                            "cannot pick the releases that have a wheel for it.", file=str(scenario.source),
                            field="base", hint="Bisect a scenario on a Debian or Ubuntu base.")
    found = source(python=python, arch=arch, include_pre=pre)
    return releases.between(found, old, new, what=releases.describe(python, arch))


@dataclass(frozen=True)
class BisectRequest:
    """What to bisect (`lab bisect`'s arguments): the scenario as loaded and as the user named it (for
    the resume command), the two releases, the arch (None: the scenario's, lab.drivers.bisect_run.
    choose_arch), `--set` values, and the options below."""
    scenario: Scenario
    scenario_ref: str
    old: str
    new: str
    arch: str | None = None
    pre: bool = False
    sets: dict[str, str] | None = None
    keep_images: bool = False
    failed_differently: str = SKIP
    localize: bool = True
    blame: bool = True
    # issue 34: take verdicts of earlier runs with the same content key; make the next round ready
    # while one runs; under emulation, one probe per core when --jobs is not given (`emulated_slots`);
    # collect_env and the diagnose step's default on every probe, not only at the boundary
    reuse: bool = True
    prefetch: bool = True
    emulated_slots: bool = True
    probe_details: bool = False
    # with several slots, start each probe as soon as a slot is free, and stop one no longer needed
    # (lab.drivers.bisect_eager), instead of k-ary rounds that wait for their slowest probe
    eager: bool = True


def run_bisect(request: BisectRequest, host: HostPip, runs_root: Path, events: Events = no_events, *,
               engine: Engine | None = None, fleet: Fleet | None = None,
               on_probe: Callable[[Probe, bool], None] | None = None,
               on_start: Callable[[list[str], Path, str], None] | None = None,
               run_case: RunCase | None = None, candidates: Releases | None = None,
               make_ready: Callable[[str], None] | None = None,
               boundary_env: Callable[[Probe], None] | None = None) -> BisectRun:
    """Bisect `request.scenario` between the torch releases `request.old` and `request.new` on
    `request.arch`.

    `run_case` runs one probe (default: lab.pipeline.run_case) and `candidates` lists the releases
    (default: the host's package index). `make_ready(version)` makes a release ready ahead of its
    probe and `boundary_env(probe)` collects a boundary probe's environment into its folder (default:
    the engine's, with the default `run_case`; nothing with another one, unless given).
    `on_start(candidates, folder, resume)` is called once the releases are known; `on_probe(probe,
    reused)` after each probe. Raises LabError for bad input or when the engine itself fails.

    With a `fleet`, each round probes as many releases as the fleet has slots, each on the best
    engine that fits (k-ary bisection; see lab.drivers.bisect); a probe whose engine dies goes to
    another engine. Without one, the probes run one after another on `engine`.

    A bisection never probes a release twice, so the images its probes built are removed after
    each probe unless `keep_images` (aarch64 torch from 2.11.0 makes images of about 7 GB).

    A probe that fails, but not with the scenario's signature (`failed_differently`), is a skip by
    default, so it is never the boundary; `failed_differently` ("reproduced" or "not_reproduced")
    counts it on that side instead. The result pins the boundary to PyTorch's source (the two
    releases' commits, a compare link, a `git bisect start` line) and carries `lab compare`'s
    summary of the boundary pair. With `localize`, a boundary release that reproduces a compile
    failure is localized (lab.drivers.localize: the ablation's layer, compiler_bisector's subsystem)
    into `<folder>/localize/`. With `blame` (the default), the boundary pair is rebuilt with each
    other's and its own era's dependencies (lab.drivers.blame, runs under `<folder>/blame/`) to name
    the package that flips the verdict, or torch alone."""
    scenario, scenario_ref, old, new, arch = (request.scenario, request.scenario_ref, request.old, request.new,
                                              request.arch)
    pre, sets, keep_images, localize, blame = (request.pre, request.sets, request.keep_images, request.localize,
                                               request.blame)
    failed_differently = request.failed_differently
    real = run_case is None
    if run_case is None:
        run_case = production

    arch = choose_arch(scenario, arch)
    if scenario.gpu and fleet is not None:  # stop before any build where no engine gives the GPUs
        fleet.routes(arch, True, f"a bisection of {scenario.name}",
                     cpu_variant_hint(scenario.cpu_variant).strip() or None)
    found = find_candidates(scenario, arch, old, new, candidates or index_releases(host), pre,
                            python=local_python(fleet))
    folder = bisect_folder(runs_root, scenario, arch, found[0], found[-1])
    folder.mkdir(parents=True, exist_ok=True)
    resume = resume_command(scenario_ref, old, new, arch, runs_root, pre, _local_words(fleet), sets)
    if scenario.deps != "latest":
        resume += " --deps " + shlex.quote(scenario.deps)
    if not blame:
        resume += " --no-blame"
    if failed_differently != SKIP:
        resume += " --failed-differently " + failed_differently.replace("_", "-")
    if on_start:
        on_start(found, folder, resume)

    def stale(version: str, previous: RunResult) -> str | None:
        """None when a finished probe was made from what this probe would run (lab.image.casekey)."""
        wanted = content_key(resolve(scenario, torch=version, arch=arch, sets=sets))
        return wanted.differs(previous.content_key, previous.content_parts)

    if fleet is not None and request.emulated_slots:  # one emulated probe per core (--jobs not given)
        emulated_width(fleet, arch, scenario.gpu)
    parallel = fleet is not None and fleet.slots > 1
    earlier, refused = {}, []
    if request.reuse:
        wanted = {v: content_key(resolve(scenario, torch=v, arch=arch, sets=sets)).digest for v in found}
        earlier, refused = earlier_verdicts(runs_root, scenario.name, arch, wanted, exclude=folder)
    lock = threading.Lock()  # the cache cap and the callbacks, one probe at a time
    keeper = None
    if scenario.expect.exit_code_only:
        made_from = content_key(resolve(scenario, torch=old, arch=arch, sets=sets)).scenario_part
        keeper = SignatureKeeper(folder, made_from)
        if keeper.dropped:
            events("bisect", f"{SIGNATURE_NAME} was recorded from another version of the scenario; "
                             "the first probe that reproduces now records it again")

    def attempt(version: str, run_dir: Path, on: Engine, emulated: bool | None, say: Events) -> Probe:
        if run_dir.exists():  # interrupted or failed before a verdict: start it again
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        case = resolve(scenario, torch=version, arch=arch, sets=sets)
        name = getattr(on, "name", None)
        say("bisect", f"probing torch {version} ({case.name})" + (f" on engine {name}" if fleet else ""))
        try:
            outcome = run_case(case, on, host, runs_root, say, run_dir=run_dir,
                               diagnose=None if request.probe_details else False,
                               collect_env=request.probe_details)
            if outcome.result.verdict.value in ("error", "timeout") and fleet is not None and not on.alive():
                raise EngineGone(f"the engine {on.name} stopped answering ({outcome.result.reason})")
            p = _probe_from(version, outcome.result, run_dir, failed_differently=failed_differently)
            if keeper is not None:
                with lock:
                    p = keeper.check(p, outcome.result, failed_differently)
            image = outcome.result.image
            with lock:
                ahead_image = made_ahead.pop(version, None)
            ours = image is not None and (not image.cached or (ahead_image is not None and ahead_image[1] == image.tag))
            if not keep_images and image is not None and ours and outcome.result.local is None:
                say("bisect", f"removing the probe's image {image.tag} (keep it with --keep-images)")
                on.discard(image.tag)  # (Docker: the apt and venv layers serve the next probe)
            with lock:
                cache_policy.enforce_cap(on, say, force=True)  # never raises: a problem is an event
        except (EngineError, CacheSpaceError):
            raise  # the engine itself is gone, or the disk is full: no later probe could run either
        except LabError as exc:  # this release cannot be set up here: a skip, never a boundary
            p = Probe.judged(version, "error", reason=str(exc).split("\n")[0][:300], run_dir=str(run_dir),
                             engine=name, emulated=emulated)
        return p

    def probe(version: str) -> Probe:
        run_dir = folder / f"torch{version}"
        previous = _finished(run_dir)
        if previous is not None:
            why = stale(version, previous)
            if why is None:
                p = _probe_from(version, previous, run_dir, failed_differently=failed_differently)
                if keeper is not None:
                    with lock:
                        p = keeper.check(p, previous, failed_differently)
                if on_probe:
                    with lock:
                        on_probe(p, True)
                return p
            events("bisect", f"probe {version} runs again: {why}")
        if version in earlier:
            took = earlier[version]
            if run_dir.exists():  # a stale or unfinished probe of its own: the earlier run stands for it
                shutil.rmtree(run_dir)
            p = _probe_from(version, took.result, took.run_dir, failed_differently=failed_differently)
            p = p.model_copy(update={"reused_from": str(took.run_dir)})
            if keeper is not None:
                with lock:
                    p = keeper.check(p, took.result, failed_differently)
            events("bisect", f"torch {version}: {p.verdict}, taken from the earlier run {took.run_dir} "
                             "(the same content key); not run again")
            if on_probe:
                with lock:
                    on_probe(p, True)
            return p
        if ahead is not None:
            ahead.forget(version)
        try:
            if fleet is None:
                assert engine is not None
                p = attempt(version, run_dir, engine, None, events)
            else:
                def say(stage: str, message: str) -> None:
                    events(stage, f"[torch {version}] {message}" if parallel else message)
                try:
                    p = on_engine(fleet, arch, scenario.gpu, f"the probe of torch {version}",
                                  lambda on, emulated: attempt(version, run_dir, on, emulated, say), say)
                except NoEngineError as exc:  # every engine that fits is gone: say so, never a boundary
                    p = Probe.judged(version, "error", reason=exc.message[:300], run_dir=str(run_dir))
        except cancel.Cancelled:  # an eager search no longer needs it: no verdict, no folder
            events("bisect", f"torch {version}: stopped, the other probes' answers made it unnecessary")
            shutil.rmtree(run_dir, ignore_errors=True)
            let_go(version)
            raise
        let_go(version)  # its run held what it used; what was made ahead for it may now go
        if on_probe:
            with lock:
                on_probe(p, False)
        return p

    width = fleet.slots if parallel else 1
    engines = fleet.live_engines() if fleet is not None else [engine]

    # each probe started as soon as a slot is free (lab.drivers.bisect_eager), except on an engine
    # that gathers the probes started together into one job (Slurm: one array per round)
    eager = request.eager and parallel and not any(getattr(e, "gathers", False) for e in engines)

    def probe_many(versions: list[str]) -> list[Probe]:
        return run_all(versions, probe, workers=width, on_interrupt=lambda: remove_containers(engines))

    held: dict[str, cache_policy.Hold] = {}  # what was made ahead, by release, until its probe has run
    made_ahead: dict[str, tuple[Engine, str]] = {}  # case images built ahead: removed like the probe's own

    def made_ready(version: str) -> None:
        """What the probe of `version` needs before it runs (lab.drivers.bisect_ahead): on Docker the
        base, the site tree from uv on the host and the case image; on the local engine its venv."""
        on = engine if fleet is None else fleet.engine(fleet.routes(arch, scenario.gpu)[0].engine)
        assert on is not None
        case = resolve(scenario, torch=version, arch=arch, sets=sets)
        say = _prefixed(events, f"[ahead: torch {version}] ")
        with tempfile.TemporaryDirectory(prefix="lab-ahead-") as scratch:
            image, plan = make_case_ready(case, on, host, Path(scratch), say)
        paths = (plan.site.root,) if plan.site is not None and plan.site.root is not None else ()
        images = (image.image_id, image.base.image_id) if image.local is None else ()
        with lock:  # kept until its probe has run
            if version not in held and (paths or images):  # (the local engine's venv: nothing to hold)
                held[version] = cache_policy.hold(paths, images, f"made ahead for the probe of torch {version}")
            if image.local is None and not image.cached:
                made_ahead[version] = (on, image.tag)

    def env_at_boundary(p: Probe) -> None:
        case = resolve(scenario, torch=p.version, arch=arch, sets=sets)
        say = _prefixed(events, f"[torch {p.version}] " if width > 1 else "")

        def go(on: Engine, emulated: bool | None = None) -> None:
            collect_env_for(case, on, host, Path(str(p.run_dir)), say, keep_image=keep_images)
        go(engine) if fleet is None else on_engine(fleet, arch, scenario.gpu, f"collect_env of torch {p.version}",
                                                   go, say)

    if make_ready is None and real:
        make_ready = made_ready
    if boundary_env is None and real:
        boundary_env = env_at_boundary

    def ahead_of(versions: list[str]) -> None:
        todo = [v for v in versions if v not in earlier and _finished(folder / f"torch{v}") is None]
        if ahead is not None:
            ahead.ask(todo)

    def let_go(version: str | None = None) -> None:
        """Release what was made ahead for `version` (its probe has run), or for every release; at
        the end, a case image made ahead for a release no probe ran goes too (unless --keep-images)."""
        with lock:
            for v in [version] if version is not None else list(held):
                kept = held.pop(v, None)
                if kept is not None:
                    kept.release()
            unused = list(made_ahead.items()) if version is None else []
            if version is None:
                made_ahead.clear()
        for v, (on, tag) in unused if not keep_images else ():
            try:
                on.discard(tag)
                events("bisect", f"removed the image made ahead for torch {v}, which no probe needed: {tag}")
            except Exception as exc:  # noqa: BLE001 - only tidying: the cap evicts it later
                events("bisect", f"could not remove the image made ahead for torch {v} ({tag}): {exc}")

    ahead = Prefetcher(make_ready, events) if request.prefetch and make_ready is not None else None
    # No lease over the whole bisection (it kept every probe's tree and image "in use" to the end):
    # each probe's run holds its own, so what a finished probe used can go before the next one
    # starts; a tree made ahead is held by name until its probe has run (`held`); the runs leave
    # the cap to the probe loop above.
    try:
        with cache_policy.deferred():
            searched = bisect(found, probe, width=width, probe_many=probe_many,
                              prepare=ahead_of if ahead is not None else None, eager=eager,
                              on_interrupt=lambda: remove_containers(engines))
            if not request.probe_details and boundary_env is not None:
                searched = _boundary_env(searched, folder, boundary_env, events, width)
    except BaseException:
        if ahead is not None:  # Ctrl-C or an error: not held up by a release being made ahead
            ahead.close(wait=False)
        let_go()
        raise
    if ahead is not None:
        ahead.close()
    let_go()
    reused = [p for p in searched.steps if p.reused_from]
    if reused or refused:
        searched = searched.model_copy(update={"notes": (*searched.notes, *(
            f"torch {p.version}: {p.verdict}, taken from {p.reused_from} (an earlier run with the same content "
            "key); not run again" for p in reused), *(
            f"not reused: {why}" for why in refused[:10]))})
    if fleet is not None and fleet.down:
        searched = searched.model_copy(update={"notes": (*searched.notes, *(
            f"engine {name} {why}" for name, why in fleet.down.items()))})
    result = searched.model_copy(update={
        "scenario": scenario.name, "arch": arch, "candidates": tuple(found), "folder": str(folder),
        "resume": resume, "failed_differently": failed_differently})
    if keeper is not None and keeper.signature is not None:
        result = result.model_copy(update={
            "signature": keeper.signature, "signature_from": keeper.source, "notes": (*result.notes, (
                f"the scenario expects only an exit code, so every failing probe was held to the failure "
                f"torch {keeper.source} recorded first ({keeper.signature.words()}, in {SIGNATURE_NAME}); "
                "pin it in the scenario as expect.signature"))})
    result = at_the_boundary(result).model_copy(update={"deps": scenario.deps})
    if blame and result.status == FOUND:
        result = result.model_copy(update=_blame(result, scenario, arch, sets, host, runs_root, folder,
                                                 engine, fleet, run_case, events, keep_images,
                                                 failed_differently))
    elif not blame:
        result = result.model_copy(update={"blame_summary": "not run (--no-blame)"})
    bad = _bad_release(result) if localize else None
    if bad is not None:
        case = resolve(scenario, torch=bad, arch=arch, sets=sets)
        where = folder / "localize"

        def examine(on: Engine, emulated: bool | None = None):
            return localize_case(case, on, host, runs_root, where, events, run_case=run_case)
        try:
            found_out = earlier_localization(where, case)
            if found_out is not None:  # the same bisection run again (a resume): its answer stands
                events("bisect", f"localization of torch {bad}: {found_out.conclusion} (from an earlier run of "
                                 "this bisection, the same content key)")
            else:
                found_out = examine(engine) if fleet is None else on_engine(
                    fleet, arch, scenario.gpu, f"the localization of torch {bad}", examine, events)
            result = result.model_copy(update={"localization": f"torch {bad}: {found_out.conclusion}",
                                               "localize_dir": str(where)})
        except LabError as exc:  # the bisection stands; say why it was not localized
            result = result.model_copy(update={"localization": f"torch {bad} was not localized: {exc}"})
    write_bisect_report(folder, scenario.name, arch, result, found, resume)
    return BisectRun(folder, result, found, resume)


def _blame(result: BisectResult, scenario: Scenario, arch: str, sets, host: HostPip, runs_root: Path, folder: Path,
           engine: Engine | None, fleet: Fleet | None, run_case: RunCase, events: Events, keep_images: bool,
           failed_differently: str) -> dict:
    """lab.drivers.blame with real runs (under `<folder>/blame/`, reused while their content key holds)."""

    where = folder / "blame"
    steps = {p.version: p for p in result.steps}

    def ran_with(version: str | None) -> dict[str, str] | None:
        probe = steps.get(version or "")
        freeze = Path(probe.run_dir) / "pip-freeze.txt" if probe and probe.run_dir else None
        return era.freeze_versions(freeze.read_text(errors="replace")) if freeze and freeze.is_file() else None

    def era_set(version: str) -> dict[str, str] | None:
        case = resolve(scenario, torch=version, arch=arch, sets=sets)
        target = target_for(case)
        if target is None:
            return None
        found = era.resolve_set((f"torch=={version}", *scenario.pip), setting=era.ERA, torch=version, host=host,
                                python=local_python(fleet) or target.python, arch=target.arch,
                                platform=target.uv_platform)  # for the Python the probes' environments have
        return found.versions()

    def run_with(version: str, pins: dict[str, str], label: str, changed: tuple[str, ...]) -> BlameStep:
        run_dir = where / f"torch{version}-{label}"
        case = resolve(scenario, torch=version, arch=arch, sets=sets, pins=era.versions_to_pins(pins))
        previous = _finished(run_dir)
        if previous is not None and content_key(case).differs(previous.content_key, previous.content_parts) is None:
            return BlameStep(torch=version, label=label, changed=changed, verdict=previous.verdict.value,
                             run_dir=str(run_dir), total_s=previous.timings.total_s if previous.timings else None,
                             reused=True)
        started = time.monotonic()

        def go(on: Engine, emulated: bool | None = None) -> str:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
            outcome = run_case(case, on, host, runs_root, events, run_dir=run_dir, diagnose=False, collect_env=False)
            image = outcome.result.image
            if not keep_images and image is not None and not image.cached and outcome.result.local is None:
                on.discard(image.tag)
            return outcome.result.verdict.value
        try:
            verdict = go(engine) if fleet is None else on_engine(
                fleet, arch, scenario.gpu, f"the blame run of torch {version}", go, events)
        except EngineError:
            raise
        except LabError as exc:
            events("blame", f"torch {version} ({label}): no verdict: {exc}")
            verdict = "error"
        return BlameStep(torch=version, label=label, changed=changed, verdict=verdict, run_dir=str(run_dir),
                         total_s=round(time.monotonic() - started, 2))

    found = blame_boundary(result, (ran_with(result.last_old), ran_with(result.first_new)), run_with, era_set,
                           events, failed_differently)
    if found.get("blame_summary"):
        events("blame", found["blame_summary"])
    return found


def _prefixed(events: Events, prefix: str) -> Events:
    def say(stage: str, message: str) -> None:
        events(stage, prefix + message)
    return say


ENV_NAME = "collect_env.txt"


def _boundary_env(result: BisectResult, folder: Path, collect: Callable[[Probe], None], events: Events,
                  width: int) -> BisectResult:
    """collect_env for the boundary's two releases only (issue 34: the probes run without it), into the
    probe folders this bisection made (an earlier run it reused keeps its own); both at once when the
    bisection had two slots. A release whose environment cannot be collected is a note: the boundary
    stands."""
    if result.status not in (FOUND, AMBIGUOUS) or not result.last_old or not result.first_new:
        return result
    steps = {p.version: p for p in result.steps}
    todo = [steps[v] for v in (result.last_old, result.first_new) if v in steps and steps[v].run_dir
            and not steps[v].reused_from and Path(str(steps[v].run_dir)).parent == folder
            and not (Path(str(steps[v].run_dir)) / ENV_NAME).exists()]
    notes: list[str] = []

    def one(p: Probe) -> None:
        events("bisect", f"torch {p.version}: collect_env, at the boundary")
        try:
            collect(p)
        except LabError as exc:
            notes.append(f"collect_env of torch {p.version} at the boundary failed: {str(exc).splitlines()[0][:200]}")
    run_all(todo, one, workers=min(max(width, 1), 2))
    return result.model_copy(update={"notes": (*result.notes, *notes)}) if notes else result


def at_the_boundary(result: BisectResult) -> BisectResult:
    """The result with its boundary pinned to source and `lab compare`'s summary of the boundary pair
    (left out, with a note, when the pair cannot be compared)."""
    if result.status not in (FOUND, AMBIGUOUS) or not result.last_old or not result.first_new:
        return result
    steps = {p.version: p for p in result.steps}
    old, new = steps.get(result.last_old), steps.get(result.first_new)
    source = SourceBoundary.of(result.last_old, result.first_new, old.git_version if old else None,
                               new.git_version if new else None, result.direction)
    lines: tuple[str, ...] = ()
    if old is not None and new is not None and old.run_dir and new.run_dir:
        try:
            lines = compare_runs(Path(old.run_dir), Path(new.run_dir)).summary
        except LabError as exc:
            lines = (f"the boundary pair could not be compared: {exc}",)
    return result.model_copy(update={"source": source, "compare": lines})


def earlier_localization(where: Path, case) -> LocalizeResult | None:
    """The localization in `where` (a bisection's localize/ folder) when an earlier run of the bisection
    made it from this very case (same torch, same content key: the script, the scenario, the
    dependencies); else None, and the localization runs."""
    try:
        earlier = read_document(where / "localize.json", LocalizeResult)
    except (OSError, ResultError):
        return None
    if earlier.torch != case.torch or earlier.key != content_key(case).digest:
        return None
    return earlier


def _bad_release(result: BisectResult) -> str | None:
    """The boundary release that reproduces, when its failure came from the compiler stack."""
    if result.status != FOUND:
        return None
    bad = result.first_new if result.to_verdict == "reproduced" else result.last_old
    probe = next((p for p in result.steps if p.version == bad), None)
    if probe is None or probe.verdict != "reproduced" or not probe.run_dir:
        return None
    return bad if is_compile_failure(Path(probe.run_dir)) else None


def _only_engine(fleet: Fleet | None) -> Engine | None:
    """The one engine of a bisection that runs on one engine only."""
    return next(iter(fleet.engines.values())) if fleet is not None and len(fleet.engines) == 1 else None


def _local_words(fleet: Fleet | None) -> tuple[str, ...]:
    """The flags that pick the bisection's one engine again in its resume command (`--engine local`
    and `--trust-script` for the local engine; nothing for the default Docker engine)."""
    engine = _only_engine(fleet)
    return engine.resume_args() if engine is not None else ()


def local_python(fleet: Fleet | None) -> str | None:
    """The Python (X.Y) of a bisection that runs on one engine whose environments are made with a
    Python of its own (the local engine: the host's), whatever the scenario's base image has."""
    engine = _only_engine(fleet)
    return engine.environment_python() if engine is not None else None


def _finished(run_dir: Path) -> RunResult | None:
    """The result of a probe that reached a verdict, if the folder has one. A folder without
    result.json, or with an unfinished run's, is run again; one whose result.json this lab cannot
    read is an error (ResultError), not a reason to delete it."""
    if not (run_dir / RESULT_NAME).exists():
        return None
    result = read_result(run_dir)
    return result if isinstance(result, RunResult) else None


def _probe_from(version: str, result: RunResult, run_dir: Path, engine: str | None = None, *,
                failed_differently: str = SKIP) -> Probe:
    evidence = "; ".join(result.summary[:2])
    t = result.timings
    return Probe.judged(version, result.verdict, reason=result.reason, evidence=evidence, run_dir=str(run_dir),
                        build_s=t.build_s if t else None, run_s=t.run_s if t else None,
                        total_s=t.total_s if t else None, engine=engine or result.engine.name,
                        emulated=result.emulated, failed_differently=failed_differently,
                        git_version=result.torch_build.git_version if result.torch_build else None,
                        different_failure=result.different_failure)


SIGNATURE_NAME = "signature.json"


class SignatureKeeper:
    """The failure signature of a bisection whose scenario expects only an exit code (any failure would
    hold). The first probe that reproduces writes its signature into the bisection's folder
    (`signature.json`, with the release it came from); every probe after it, resumed ones included,
    that reproduces with another signature is `failed_differently`, which the bisection skips (or counts
    as `--failed-differently` says), as PyTorch's minifier rejects a candidate that fails with another
    error. The file is the bisection's own, shown in bisect.md and bisect.json, never a global state."""

    def __init__(self, folder: Path, made_from: str) -> None:
        """`made_from`: the scenario's content key without its torch, arch, backend and mode
        (`ContentKey.scenario_part`): a signature recorded from another script, expect or vars is
        dropped, as the probes made from them are run again."""
        self.path = folder / SIGNATURE_NAME
        self.made_from = made_from
        self.signature: FailureSignature | None = None
        self.source: str | None = None
        self.dropped = False
        if self.path.is_file():
            kept = KeptSignature.model_validate_json(self.path.read_text(encoding="utf-8"))
            if kept.made_from == made_from:
                self.signature, self.source = kept.signature, kept.torch
            else:
                self.path.unlink()
                self.dropped = True

    def check(self, probe: Probe, result: RunResult, failed_differently: str) -> Probe:
        if probe.verdict != "reproduced" or result.signature is None and self.signature is None:
            return probe
        if self.signature is None:
            self.signature, self.source = result.signature, probe.version
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(KeptSignature(signature=result.signature, torch=probe.version, made_from=self.made_from)
                           .model_dump_json(indent=2) + "\n", encoding="utf-8")
            tmp.replace(self.path)
            return probe
        if self.signature.matches(result.signature):
            return probe
        seen = "no exception and no signal" if result.signature is None else result.signature.words()
        pair = FailureSignatures(expected=f"{self.signature.words()} (recorded from torch {self.source})",
                                 observed=seen)
        return probe.model_copy(update={
            "verdict": "failed_differently", "outcome": outcome_of("failed_differently", failed_differently),
            "different_failure": pair,
            "reason": (f"failed differently: exit code as expected, but {seen}, not the failure torch "
                       f"{self.source} recorded ({self.signature.words()})")})


class KeptSignature(Record):
    """signature.json of a bisection folder."""

    signature: FailureSignature
    torch: str
    made_from: str | None = None   # ContentKey.scenario_part of the scenario it was recorded from
