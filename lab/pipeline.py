"""One run, stage after stage: Case -> BuildPlan -> image -> RawRun -> Evidence -> Verdict -> run folder."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from lab.analyze.dynamo import Diagnostics, load_diagnostics
from lab.analyze.evidence import Evidence, analyze, read_text
from lab.analyze.judge import Judgement, build_failed, judge
from lab.analyze.torchbuild import parse_version_file
from lab.build import era
from lab.build.base import ensure_base
from lab.build.casekey import content_key
from lab.build.crossinstall import VENV_IN_IMAGE, install_with_uv
from lab.build.hostpip import HostPip
from lab.build.image import build_image
from lab.build.localenv import check_system_packages, prepare_local
from lab.build.render import RUNNER_IN_IMAGE, BuildPlan, plan_build, system_packages, write_context_folder
from lab.build.resolve import Case, base_python
from lab.cache_policy import inventory as cache_policy
from lab.core.arch import with_emulated_env
from lab.core.cache import cache_dir
from lab.core.errors import BuildError, LabError, NoGpuRuntimeError, ScenarioError
from lab.core.records import Events, RawRun, RunLimits, no_events
from lab.core.results import LocalRef, RunResult, StageTimes, TorchBuild
from lab.core.runmarker import mark_run
from lab.engine import gpu
from lab.engine.docker_engine import Engine
from lab.history.index import record_run
from lab.report import run_folder as report

R = TypeVar("R")

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


def is_local(engine) -> bool:
    """Whether `engine` is the local engine (this host, no container: lab.engine.local_engine)."""
    return getattr(engine, "kind", "docker") == "local"


def check_gpu(case: Case, engine: Engine) -> None:
    """Refuse a GPU scenario before its build where it cannot get the GPUs. On Docker the engine
    answers a test container that requests them all (lab.engine.gpu), so what stops the run is the
    engine's own refusal; the local engine needs the NVIDIA device nodes."""
    if not case.scenario.gpu:
        return
    variant = case.scenario.cpu_variant
    if is_local(engine):
        if not engine.has_gpu_runtime():
            hint = (f"Run its CPU variant instead: `lab run {variant}`." if variant else
                    "Run it on an engine with the NVIDIA container runtime (see `lab doctor`).")
            raise NoGpuRuntimeError(f"{case.scenario.name} needs a GPU, and this host has no NVIDIA device "
                                    "(/dev/nvidiactl, /dev/nvidia0).", hint=hint)
        return
    answer = gpu.check(engine, make_image=True)
    if answer.ok is None and not engine.has_gpu_runtime():  # no test container could be started
        answer = replace(answer, ok=False, answer=f"{answer.answer}; and it lists no nvidia runtime")
    if answer.ok is False:
        raise gpu.refusal(case.scenario.name, engine, answer, variant)


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
    if hasattr(engine, "run_elsewhere"):  # a scheduler's engine (Slurm): the case runs whole on one of its nodes
        engine.check(case, events)
        return engine.run_elsewhere(case, host, runs_root, events, run_dir=run_dir, diagnose=diagnose,
                                    compile_debug=compile_debug, allow_network=allow_network,
                                    collect_env=collect_env, plan=plan)
    check_gpu(case, engine)
    limits = run_limits(case, allow_network)
    system = check_local(case, engine, events) if is_local(engine) else None
    with cache_policy.lease():  # what this run uses is not evicted while it runs
        outcome = _run_case(case, engine, host, runs_root, events, run_dir=run_dir, diagnose=diagnose,
                            compile_debug=compile_debug, collect_env=collect_env, plan=plan, limits=limits,
                            system=system)
        cache_policy.enforce_cap(engine, events)  # after the run, under its lease: never fails the run
    return outcome


def check_local(case: Case, engine, events: Events = no_events) -> str:
    """What the local engine refuses before anything is made: another arch, a script it cannot
    confine (without --trust-script), system packages the host lacks. Returns where the system
    packages came from, in words."""
    engine.check_native(case.arch, case.name)
    engine.check_confinement()
    return check_system_packages(case, events)


def _run_case(case: Case, engine: Engine, host: HostPip, runs_root: Path, events: Events, *,
              run_dir: Path | None, diagnose: bool | None, compile_debug: bool, collect_env: bool,
              plan: BuildPlan | None, limits: RunLimits, system: str | None = None) -> RunOutcome:
    clock = _Clock()
    local = is_local(engine)
    content = content_key(case)  # before anything is made: an edit of the script during the run is not this run
    case, depset = era.apply(case, host, events)  # `era` or a date: pinned on the host before the build
    base_ready = None
    if plan is None:
        if not local:  # the base (a bootstrap under QEMU takes minutes) is made while uv works on the host
            base_ready = _beside(partial(_timed, ensure_base, engine, case.scenario.base, case.arch, events,
                                         system_packages(case)))
        with clock("site"):  # the local engine needs the Dockerfile and context only as a record
            try:
                plan = plan_build(case, host, events, installer=None if local else install_with_uv)
            except Exception:  # (Ctrl-C stops at once: mmdebstrap gets the same signal)
                if base_ready is not None:  # no bootstrap is left running behind the error
                    with contextlib.suppress(Exception):
                        base_ready()
                raise
    if plan.site is not None and plan.site.root is not None:
        cache_policy.note_use(paths=(plan.site.root,))
        cache_policy.note_wheels_used(plan.site.root)
    started = datetime.now(timezone.utc)
    run_dir = run_dir or report.new_run_dir(runs_root, case, started)
    if (note := mark_run(runs_root, run_dir)) is not None:  # a probe's or a rung's folder, made by its driver
        logging.getLogger("lab").warning(note)
    write_context_folder(run_dir, plan)  # `docker build .` works in the run folder
    if depset is not None:
        (run_dir / DEPS_LOCK).write_text(depset.lock_text(case.torch))
    report.write_scenario(run_dir, case, None)
    emulated = case.arch != engine.arch
    record = dict(case=case, run_dir=run_dir, engine_version=engine.version, engine_name=engine.name,
                  host_arch=engine.arch.uname, emulated=emulated, started=started,
                  engine_kind="local" if local else "docker",
                  content=content, depset=depset)
    try:
        try:
            with clock("build"):
                if local:
                    image = prepare_local(case, host, run_dir, python_env=engine.options.python_env,
                                          python=engine.options.python, gpu=case.scenario.gpu, events=events,
                                          log=run_dir / "build.log")
                else:
                    base_s = base_ready()[1] if base_ready is not None else 0.0
                    image = build_image(plan, engine, host, events, run_dir / "build.log")
                    image = replace(image, base_seconds=image.base_seconds + base_s)
        except BuildError as err:
            judgement = build_failed(err.message)
            rec = report.RunRecord(judgement=judgement, evidence=None, image=None, base=None,
                                   timings=clock.times(), **record)
            return RunOutcome(run_dir, report.write_results(rec), judgement)
        clock.spent["base"] = image.base_seconds
        if image.local is not None:
            record["local"] = _local_ref(engine, image, limits, system or "")
            if image.local.kind == "venv":
                cache_policy.note_use(paths=(Path(image.local.where),))
                cache_policy.note_wheels_used(Path(image.local.where))
        else:
            cache_policy.note_use(image_ids=(image.image_id, image.base.image_id))
        report.write_scenario(run_dir, case, None if local else image.base)
        _save_freeze(engine, _image_ref(image), run_dir)
        torch_build = read_torch_build(engine, _image_ref(image), case)
        collected_beside = None
        if collect_env and emulated:  # the emulated script keeps one core busy: collect_env takes the other
            collected_beside = _beside(partial(_collect_env, engine, image, case, events, background=True))
        try:
            with clock("run"):
                raw = _run_script(case, engine, _image_ref(image), run_dir, events, limits)
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
                diagnostics = _diagnose(case, engine, _image_ref(image), run_dir, events, limits, compile_debug)
        else:
            events("diagnose", f"not run: {why}")
        collected = None
        if collect_env:  # the time it adds to the run: emulated, what is left of it after the script
            with clock("collect_env"):
                collected = collected_beside() if collected_beside else _collect_env(engine, image, case, events)
        judgement = judge(evidence, case.scenario.expect, read_text(raw.stdout_path),
                          read_text(raw.stderr_path), diagnostics, script=case.scenario.script.name)
        rec = report.RunRecord(judgement=judgement, evidence=evidence, image=image,
                               base=None if local else image.base,
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


def _image_ref(image):
    """What the engine runs: the image's tag, or the local engine's environment."""
    local = getattr(image, "local", None)
    return local if local is not None else image.tag


def _local_ref(engine, image, limits: RunLimits, system: str) -> LocalRef:
    from lab.engine.local_engine import host_libc, host_os
    env = image.local
    confinement = engine.confinement
    return LocalRef(os=host_os(), libc=host_libc(), python=env.python_version, python_env=env.kind,
                    environment=env.where, system_packages=system, confined=confinement.confined,
                    confinement=confinement.words(limits.network))


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
    return ["python", RUNNER_IN_IMAGE, *script] if through_runner else ["python", *script]


def emulated_env(env: dict[str, str], case: Case, engine: Engine) -> dict[str, str]:
    """`env` with lab.core.arch.EMULATED_ENV's defaults when `engine` emulates the case's arch."""
    return with_emulated_env(env, case.arch != engine.arch)


def _run_script(case: Case, engine: Engine, tag, run_dir: Path, events: Events, limits: RunLimits):
    env = emulated_env(case.run_env(), case, engine)
    env.update({"LD_DEBUG": LD_DEBUG, "LD_DEBUG_OUTPUT": "/out/ld/ld"})
    command = _command(case, through_runner=case.hooked)
    events("run", f"running {' '.join(command)} (timeout {case.scenario.timeout} s, {limits.describe()}"
                  f"{', emulated' if case.arch != engine.arch else ''})")
    raw = engine.run(tag, command, env, out_dir=run_dir / "out", logs_dir=run_dir, arch=case.arch,
                     timeout=case.scenario.timeout, labels={"org.torch-repro-lab.case": case.name},
                     events=events, limits=limits)
    _output_events(raw, events, "run")
    return raw


def _output_events(raw: RawRun, events: Events, stage: str) -> None:
    """Say what the lab cut or refused while taking the run's outputs (also in the report)."""
    for line in raw.output_words():
        events(stage, line)


def _diagnose(case: Case, engine: Engine, tag, run_dir: Path, events: Events, limits: RunLimits,
              compile_debug: bool = False) -> Diagnostics:
    """What the torch.compile FAQ says to collect: explain's graph breaks, recompile reasons,
    compile time by phase, and a TORCH_TRACE folder (for tlparse); with `compile_debug`, also
    TORCH_COMPILE_DEBUG=1's folder."""
    folder = run_dir / "diagnose"
    env = emulated_env(case.run_env(), case, engine)
    env.update({"LAB_DIAG_DIR": "/out/diag", "TORCH_TRACE": "/out/trace", "TORCH_LOGS": "recompiles"})
    if compile_debug:
        env.update({"TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": "/out/compile_debug"})
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


def _timed(fn: Callable[..., R], *args) -> tuple[R, float]:
    started = time.monotonic()
    return fn(*args), time.monotonic() - started


def _beside(fn: Callable[[], R]) -> Callable[[], R]:
    """Start `fn` in a thread now; the function returned waits for its answer (or raises its error).
    The thread is a daemon: a run stopped by Ctrl-C does not wait for it."""
    done: list = []

    def work() -> None:
        try:
            done.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.append((False, exc))

    thread = threading.Thread(target=work, daemon=True, name="lab-beside")
    thread.start()

    def answer() -> R:
        thread.join()
        ok, value = done[0]
        if not ok:
            raise value
        return value
    return answer


def _collect_env(engine: Engine, image, case: Case, events: Events, background: bool = False) -> str:
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
    code, output = engine.output_of(_image_ref(image), ["python", "-m", "torch.utils.collect_env"], case.arch,
                                    COLLECT_ENV_TIMEOUT_S, {"org.torch-repro-lab.case": case.name},
                                    background=background, env=emulated_env({}, case, engine),
                                    **({"gpus": True} if case.scenario.gpu and not is_local(engine) else {}))
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


def read_torch_build(engine: Engine, tag: str, case: Case) -> TorchBuild | None:
    """torch/version.py of the image's venv (release, git commit, CUDA), read without starting a
    container; None when the image has no torch there."""
    data = read_torch_file(engine, tag, case, "torch/version.py")
    return None if data is None else parse_version_file(data.decode("utf-8", "replace"))


def read_torch_file(engine: Engine, tag: str, case: Case, relpath: str) -> bytes | None:
    """A file of the image's venv site-packages (`torch/version.py`), or None when it is absent. The
    base's Python is known for Debian and Ubuntu bases; otherwise the usual ones are tried."""
    known = base_python(case.scenario.base)
    for python in (known,) if known else _PYTHONS:
        data = engine.read_file(tag, f"{VENV_IN_IMAGE}/lib/python{python}/site-packages/{relpath}")
        if data is not None:
            return data
    return None


def _save_freeze(engine: Engine, tag, run_dir: Path) -> None:
    data = engine.read_file(tag, "/lab/pip-freeze.txt")
    if data is not None:
        (run_dir / "pip-freeze.txt").write_bytes(data)
