"""One run, stage after stage: Case -> BuildPlan -> image -> RawRun -> Evidence -> Verdict -> run folder."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Protocol

from lab.analyze.dynamo import Diagnostics, load_diagnostics
from lab.analyze.evidence import Evidence, analyze, read_text
from lab.analyze.judge import Judgement, build_failed, judge
from lab.analyze.torchbuild import parse_version_file
from lab.cache_policy import inventory as cache_policy
from lab.cache_policy import room as cache_room
from lab.core.arch import with_emulated_env
from lab.core.background import beside, timed
from lab.core.cache import cache_dir
from lab.core.errors import BuildError, LabError, ScenarioError
from lab.core.records import BuiltImage, Events, RawRun, RunLimits, no_events
from lab.core.results import RunResult, StageTimes, TorchBuild
from lab.core.runmarker import mark_run
from lab.core.scrub import redact_secrets
from lab.engine.protocol import Engine, ImageRef, Pending, nothing_pending
from lab.history.index import record_run
from lab.image import era, layout
from lab.image.casekey import content_key
from lab.image.crossinstall import install_with_uv
from lab.image.hostpip import HostPip
from lab.image.render import BuildPlan, plan_build, write_context_folder
from lab.image.resolve import Case, base_python
from lab.report import run_folder as report

LD_DEBUG = "libs,files"
DEPS_LOCK = "deps.lock"  # an era's or a date's resolution: what uv pinned, with the cut
# Files the lab writes into diagnose/ itself: a diagnose run's /out may not bring them.
DIAGNOSE_RESERVED = frozenset({"stdout.txt", "stderr.txt", "diagnostics.json", "diagnostics.json.tmp"})
COLLECT_ENV_TIMEOUT_S = 900
# An exception from these modules (or raised through their frames) means the compiler stack was
# involved, so the diagnose step has something to say.
COMPILE_STACK = ("torch._dynamo.", "torch._inductor.", "torch._functorch.", "torch._export.")
COMPILE_FRAMES = ("/torch/_dynamo/", "/torch/_inductor/", "/torch/_functorch/")
DIAGNOSE_HOW = "`lab run --diagnose` collects explain, recompiles, compile times and TORCH_TRACE"


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    result: RunResult
    judgement: Judgement


class RunCase(Protocol):
    """What the drivers (bisect, matrix, ablation, replay) call to run one case: `run_case` below in
    production, a fake in unit tests."""

    def __call__(self, case: Case, engine: Engine, host: HostPip, runs_root: Path, events: Events = no_events,
                 *, run_dir: Path | None = None, diagnose: bool = True, compile_debug: bool = False,
                 allow_network: bool = False, collect_env: bool = True,
                 plan: BuildPlan | None = None) -> RunOutcome: ...


def plan_for(case: Case, engine: Engine, host: HostPip, events: Events = no_events) -> BuildPlan:
    """The case's BuildPlan as `engine` needs it: with the requirements cross-installed on the host
    where the engine puts them into its image as a layer (`cross_installs`), else as a record only."""
    return plan_build(case, host, events, installer=install_with_uv if engine.cross_installs else None)


def run_limits(case: Case, allow_network: bool = False) -> RunLimits:
    """The confinement of the case's containers: the scenario's limits (or the defaults), and network
    only when the scenario asks for it and the user confirmed with --allow-network."""
    if case.scenario.network and not allow_network:
        raise ScenarioError(
            f"{case.scenario.name} asks for network access while its script runs (network: true); the script "
            "comes from a bug report, so the lab runs it without network unless you confirm.",
            file=str(case.scenario.source), field="network",
            hint="Read the script, then rerun with --allow-network.")
    lim = case.scenario.limits
    return RunLimits(memory_bytes=lim.memory_bytes, pids=lim.pids, cpus=lim.cpus,
                     network=case.scenario.network and allow_network,
                     output_bytes=lim.output_bytes, stream_bytes=lim.logs_bytes, gpus=case.scenario.gpu)


def run_case(case: Case, engine: Engine, host: HostPip, runs_root: Path, events: Events = no_events,
             *, run_dir: Path | None = None, diagnose: bool | None = None, compile_debug: bool = False,
             allow_network: bool = False, collect_env: bool = True,
             plan: BuildPlan | None = None) -> RunOutcome:
    """Build (or reuse) the image, run the script, diagnose it, judge it and write the run folder.

    The diagnose step is a second container of the same image; the scenario's own run stays
    unchanged. `diagnose=None` (the default) runs it only when the run calls for it: an exception
    from the compiler stack, or an expectation that needs it (graph_breaks); True always, False never.
    """
    system = engine.check(case, events)  # what this engine refuses (GPU, arch, confinement, packages)
    elsewhere = engine.run_elsewhere(case, host, runs_root, events, run_dir=run_dir, diagnose=diagnose,
                                     compile_debug=compile_debug, allow_network=allow_network,
                                     collect_env=collect_env, plan=plan)
    if elsewhere is not None:  # a scheduler's engine (Slurm) ran the whole case on one of its nodes
        return elsewhere
    limits = run_limits(case, allow_network)
    cache_room.before_run(case, engine, events)  # room for what it adds, or said (refused: a full disk) first
    with cache_policy.lease():  # what this run uses is not evicted while it runs
        outcome = _run_case(case, engine, host, runs_root, events, run_dir=run_dir, diagnose=diagnose,
                            compile_debug=compile_debug, collect_env=collect_env, plan=plan, limits=limits,
                            system=system)
        cache_policy.enforce_cap(engine, events)  # after the run, under its lease: never fails the run
    return outcome


def _run_case(case: Case, engine: Engine, host: HostPip, runs_root: Path, events: Events, *,
              run_dir: Path | None, diagnose: bool | None, compile_debug: bool, collect_env: bool,
              plan: BuildPlan | None, limits: RunLimits, system: str | None = None) -> RunOutcome:
    clock = _Clock()
    content = content_key(case)  # before anything is made: an edit of the script during the run is not this run
    # `era` or a date: pinned on the host before the build, for the Python the environment has
    case, depset = era.apply(case, host, events, python=engine.environment_python())
    ready: Pending | None = None
    if plan is None:
        ready = engine.begin(case, events)  # (Docker: the base, made while uv works on the host)
        with clock("site"):
            try:
                plan = plan_for(case, engine, host, events)
            except Exception:  # (Ctrl-C stops at once: mmdebstrap gets the same signal)
                with contextlib.suppress(Exception):  # nothing started ahead is left running behind the error
                    ready()
                raise
    if plan.site is not None and plan.site.root is not None:
        cache_policy.note_use(paths=(plan.site.root,))
        cache_policy.note_wheels_used(plan.site.root)
    started = datetime.now(timezone.utc)
    run_dir = run_dir or report.new_run_dir(runs_root, case, started)
    if (note := mark_run(runs_root, run_dir)) is not None:  # a probe's or a rung's folder, made by its driver
        logging.getLogger("lab").warning(note)
    write_context_folder(run_dir, plan)  # `docker build .` works in the run folder
    report.write_site_readme(run_dir, plan)
    if depset is not None:
        (run_dir / DEPS_LOCK).write_text(depset.lock_text(case.torch))
    report.write_scenario(run_dir, case, None)
    emulated = case.arch not in engine.native_arches
    record = dict(case=case, run_dir=run_dir, engine_version=engine.version, engine_name=engine.name,
                  host_arch=engine.arch.uname, emulated=emulated, started=started, engine_kind=engine.kind,
                  content=content, depset=depset)
    try:
        try:
            with clock("build"):
                image = engine.prepare(case, plan, host, run_dir, events, ready=ready or nothing_pending)
        except BuildError as err:
            if err.log and not (run_dir / "build.log").exists():  # a failure before any docker build (the base)
                (run_dir / "build.log").write_text(redact_secrets(err.log))
            judgement = build_failed(err.message)
            rec = report.RunRecord(judgement=judgement, evidence=None, image=None, base=None,
                                   timings=clock.times(), **record)
            return RunOutcome(run_dir, report.write_results(rec), judgement)
        clock.spent["base"] = image.base_seconds
        if (where := engine.describe(image, limits, system)) is not None:
            record["local"] = where
        _note_use(image)
        cache_policy.settle_lease()  # what the script runs on is named: the lease covers only that now
        report.write_scenario(run_dir, case, image.recorded_base)
        _save_freeze(engine, image.ref, run_dir)
        torch_build = read_torch_build(engine, image.ref, case)
        collected_beside = None
        if collect_env and emulated:  # the emulated script keeps one core busy: collect_env takes the other
            collected_beside = beside(partial(_collect_env, engine, image, case, events, background=True))
        try:
            with clock("run"):
                raw = _run_script(case, engine, image.ref, run_dir, events, limits)
        except Exception:
            if collected_beside is not None:  # its container is not left running behind the error
                with contextlib.suppress(Exception):
                    collected_beside()
            raise
        with clock("analyze"):
            evidence = analyze(raw)
        diagnostics = None
        run_it, why = diagnose_decision(diagnose, compile_debug, case, evidence)
        if run_it:
            with clock("diagnose"):
                diagnostics = _diagnose(case, engine, image.ref, run_dir, events, limits, compile_debug)
        else:
            events("diagnose", f"not run: {why}")
        collected = None
        if collect_env:  # the time it adds to the run: emulated, what is left of it after the script
            with clock("collect_env"):
                collected = collected_beside() if collected_beside else _collect_env(engine, image, case, events)
        judgement = judge(evidence, case.scenario.expect, read_text(raw.stdout_path),
                          read_text(raw.stderr_path), diagnostics, script=case.scenario.script.name)
        rec = report.RunRecord(judgement=judgement, evidence=evidence, image=image, base=image.recorded_base,
                               collect_env=collected, diagnostics=diagnostics,
                               diagnose=("ran: " if run_it else "not run: ") + why,
                               timings=clock.times(), torch_build=torch_build, **record)
        return RunOutcome(run_dir, report.write_results(rec), judgement)
    except KeyboardInterrupt:
        report.mark_unfinished(run_dir, case, "interrupted", "interrupted by the user (Ctrl-C or SIGTERM)")
        raise
    except LabError as exc:
        report.mark_unfinished(run_dir, case, "failed", str(exc))
        raise
    finally:  # the run folder is written first; the history index only caches it
        if (note := record_run(runs_root, run_dir)) is not None:
            logging.getLogger("lab").warning(note)


def _note_use(image: BuiltImage) -> None:
    """Tell the cache policy what this run used: the image and its base, or the local engine's venv."""
    if image.local is None:
        cache_policy.note_use(image_ids=(image.image_id, image.base.image_id))
    elif image.local.kind == "venv":
        cache_policy.note_use(paths=(Path(image.local.where),))
        cache_policy.note_wheels_used(Path(image.local.where))


class _Clock:
    """Wall time of each stage of one run, for result.json's `timings`."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.spent: dict[str, float] = {}

    def __call__(self, stage: str) -> _Clock:
        self._stage = stage
        return self

    def __enter__(self) -> None:
        self._t0 = time.monotonic()

    def __exit__(self, *exc) -> None:
        self.spent[self._stage] = self.spent.get(self._stage, 0.0) + time.monotonic() - self._t0

    def times(self) -> StageTimes:
        return StageTimes(**{f"{k}_s": round(v, 2) for k, v in self.spent.items()},
                          total_s=round(time.monotonic() - self.start, 2))


def compile_exception(evidence: Evidence):
    """The first exception that came from (or through) Dynamo, AOTAutograd or Inductor, or None."""
    for exc in evidence.exceptions:
        if (exc.type.startswith(COMPILE_STACK) or exc.graph_break is not None
                or any(part in frame for frame in exc.frames for part in COMPILE_FRAMES)):
            return exc
    return None


def diagnose_decision(asked: bool | None, compile_debug: bool, case: Case, evidence: Evidence) -> tuple[bool, str]:
    """Whether the diagnose step runs, and why (the words go into result.json and report.md)."""
    if evidence.timed_out:
        return False, "the script timed out, and a second run would hang too"
    if asked is False and not case.scenario.expect.needs_graph_breaks:
        return False, "`--no-diagnose`"
    if asked:
        return True, "asked for (`--diagnose`)"
    if compile_debug:
        return True, "asked for (`--compile-debug`)"
    if case.scenario.expect.needs_graph_breaks:
        return True, "the scenario expects a graph-break count, which only the diagnose step counts"
    exc = compile_exception(evidence)
    if exc is not None:
        return True, f"the run raised {exc.name} in the compiler stack"
    return False, f"skipped by default (no Dynamo or Inductor exception, no graph-break expectation); {DIAGNOSE_HOW}"


def _command(case: Case, through_runner: bool) -> list[str]:
    script = [case.scenario.script.name, *case.scenario.args]
    return ["python", layout.RUNNER, *script] if through_runner else ["python", *script]


def emulated_env(env: dict[str, str], case: Case, engine: Engine) -> dict[str, str]:
    """`env` with lab.core.arch.EMULATED_ENV's defaults when `engine` emulates the case's arch."""
    return with_emulated_env(env, case.arch not in engine.native_arches)


def _run_script(case: Case, engine: Engine, tag: ImageRef, run_dir: Path, events: Events, limits: RunLimits):
    env = emulated_env(case.run_env(), case, engine)
    env.update({"LD_DEBUG": LD_DEBUG, "LD_DEBUG_OUTPUT": layout.LOADER_LOG})
    command = _command(case, through_runner=case.hooked)
    events("run", f"running {' '.join(command)} (timeout {case.scenario.timeout} s, {limits.describe()}"
                  f"{', emulated' if case.arch not in engine.native_arches else ''})")
    raw = engine.run(tag, command, env, out_dir=run_dir / "out", logs_dir=run_dir, arch=case.arch,
                     timeout=case.scenario.timeout, labels={"org.torch-repro-lab.case": case.name},
                     events=events, limits=limits)
    _output_events(raw, events, "run")
    return raw


def _output_events(raw: RawRun, events: Events, stage: str) -> None:
    """Say what the lab cut or refused while taking the run's outputs (also in the report)."""
    for line in raw.output_words():
        events(stage, line)


def _diagnose(case: Case, engine: Engine, tag: ImageRef, run_dir: Path, events: Events, limits: RunLimits,
              compile_debug: bool = False) -> Diagnostics:
    """What the torch.compile FAQ says to collect: explain's graph breaks, recompile reasons,
    compile time by phase, and a TORCH_TRACE folder (for tlparse); with `compile_debug`, also
    TORCH_COMPILE_DEBUG=1's folder."""
    folder = run_dir / "diagnose"
    env = emulated_env(case.run_env(), case, engine)
    env.update({"LAB_DIAG_DIR": layout.DIAG_DIR, "TORCH_TRACE": layout.TRACE_DIR, "TORCH_LOGS": "recompiles"})
    if compile_debug:
        env.update({"TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": layout.COMPILE_DEBUG_DIR})
    events("diagnose", "explain, recompiles, compile times and TORCH_TRACE (a second run of the script)")
    raw = engine.run(tag, _command(case, through_runner=True), env, out_dir=folder, logs_dir=folder,
                     arch=case.arch, timeout=case.scenario.timeout,
                     labels={"org.torch-repro-lab.case": case.name, "org.torch-repro-lab.step": "diagnose"},
                     events=events, limits=limits, reserved=DIAGNOSE_RESERVED)
    _output_events(raw, events, "diagnose")
    diagnostics = load_diagnostics(folder / "diag", folder / "trace", read_text(raw.stderr_path))
    notes = ["the diagnose run timed out; what it wrote before that is kept"] if raw.timed_out else []
    notes += [f"diagnose run: {line}" for line in raw.output_words()]
    if compile_debug:
        written = sum(1 for p in (folder / "compile_debug").rglob("*") if p.is_file())
        files = f"{written} file" + ("s" if written != 1 else "")
        notes.append(f"TORCH_COMPILE_DEBUG=1 wrote {files} to diagnose/compile_debug/" if written else
                     "TORCH_COMPILE_DEBUG=1 wrote nothing: this torch ignores TORCH_COMPILE_DEBUG_DIR, "
                     "or nothing reached Inductor")
    return replace(diagnostics, notes=(*diagnostics.notes, *notes)) if notes else diagnostics


_timed = timed    # (the names tests and older callers use)
_beside = beside


def collect_env_for(case: Case, engine: Engine, host: HostPip, run_dir: Path, events: Events = no_events, *,
                    keep_image: bool = False) -> str:
    """`python -m torch.utils.collect_env` for a run that finished without it (a bisection's probe at the
    boundary, issue 34), written into its folder's collect_env.txt. The case's image (or local venv) is
    made again from what the run left in the cache (its site tree, uv's wheels), then removed again unless
    `keep_image` or it was there before; the run folder's other files stay as they are."""
    with cache_policy.lease(), tempfile.TemporaryDirectory(prefix="lab-collect-env-") as scratch:
        # (the local engine's run reads the case's folder: it stays until collect_env has run)
        image, plan = make_ready(case, engine, host, Path(scratch), events)
        text = _collect_env(engine, image, plan.case, events)
        if not keep_image and not image.cached and image.local is None:
            engine.discard(image.tag)
    (run_dir / "collect_env.txt").write_text(text)
    return text


def make_ready(case: Case, engine: Engine, host: HostPip, where: Path,
               events: Events = no_events) -> tuple[BuiltImage, BuildPlan]:
    """Everything a run of `case` needs before its script, made now: the base, the site tree or venv,
    the case image, with `where` (a scratch folder, not a run folder) as its build context. A later run
    of the same case finds them cached (a bisection's next round made ready while one runs, issue 34;
    collect_env at a boundary). On the local engine the image runs from `where`: keep it while it runs."""
    case, _ = era.apply(case, host, events, python=engine.environment_python())
    ready = engine.begin(case, events)
    try:
        plan = plan_for(case, engine, host, events)
    except Exception:
        with contextlib.suppress(Exception):
            ready()
        raise
    write_context_folder(where, plan)  # what a run folder holds before its build
    return engine.prepare(case, plan, host, where, events, ready=ready), plan


def _collect_env(engine: Engine, image: BuiltImage, case: Case, events: Events, background: bool = False) -> str:
    """`python -m torch.utils.collect_env` in the image. Its answer depends only on the image and the
    engine's host, so it is kept per (engine, image ID): a warm run of a cached image reads it back.
    `background`: beside an emulated script, at the lowest CPU weight. Emulated, the script uses one
    core most of the time (measured on libgomp-aarch64: one core idle, except while the kernel
    runs on two threads), and collect_env needs about 20 s of one; the script still gets the CPU first."""
    key = f"{engine.engine_id}-{image.image_id}".replace(":", "_").replace("/", "_")
    cached = cache_dir("collect_env") / f"{key}.txt"
    try:
        text = cached.read_text()
        events("collect_env", "python -m torch.utils.collect_env: kept from an earlier run of this image")
        return text
    except OSError:
        pass
    events("collect_env", "python -m torch.utils.collect_env")
    code, output = engine.output_of(image.ref, ["python", "-m", "torch.utils.collect_env"], case.arch,
                                    COLLECT_ENV_TIMEOUT_S, {"org.torch-repro-lab.case": case.name},
                                    background=background, env=emulated_env({}, case, engine),
                                    gpus=case.scenario.gpu)
    if code != 0:
        return f"Could not collect (exit {code}):\n{output}"
    try:
        tmp = cached.with_suffix(f".{time.monotonic_ns()}.tmp")
        tmp.write_text(output)
        tmp.replace(cached)
    except OSError:
        pass  # a cache that cannot be written costs time, never the run
    return output


_PYTHONS = ("3.11", "3.12", "3.10", "3.13", "3.9", "3.8", "3.14")


def read_torch_build(engine: Engine, tag: ImageRef, case: Case) -> TorchBuild | None:
    """torch/version.py of the image's venv (release, git commit, CUDA), read without starting a
    container; None when the image has no torch there."""
    data = read_torch_file(engine, tag, case, "torch/version.py")
    return None if data is None else parse_version_file(data.decode("utf-8", "replace"))


def read_torch_file(engine: Engine, tag: ImageRef, case: Case, relpath: str) -> bytes | None:
    """A file of the image's venv site-packages (`torch/version.py`), or None when it is absent. The
    base's Python is known for Debian and Ubuntu bases; otherwise the usual ones are tried."""
    known = base_python(case.scenario.base)
    for python in (known,) if known else _PYTHONS:
        data = engine.read_file(tag, layout.site_file(python, relpath))
        if data is not None:
            return data
    return None


def _save_freeze(engine: Engine, tag: ImageRef, run_dir: Path) -> None:
    data = engine.read_file(tag, layout.FREEZE_FILE)
    if data is not None:
        (run_dir / "pip-freeze.txt").write_bytes(data)
