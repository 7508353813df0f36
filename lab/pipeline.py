"""One run, stage after stage: Case -> BuildPlan -> image -> RawRun -> Evidence -> Verdict -> run folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from lab.analyze.dynamo import Diagnostics, load_diagnostics
from lab.analyze.evidence import analyze, read_text
from lab.analyze.judge import Judgement, build_failed, judge
from lab.build.hostpip import HostPip
from lab.build.image import build_image
from lab.build.render import RUNNER_IN_IMAGE, BuildPlan, plan_build, write_context_folder
from lab.build.resolve import Case
from lab.core.errors import BuildError, LabError, NoGpuRuntimeError, ScenarioError
from lab.core.records import Events, RawRun, RunLimits, no_events
from lab.core.results import RunResult
from lab.engine.docker_engine import Engine
from lab.history.index import record_run
from lab.report import run_folder as report

LD_DEBUG = "libs,files"
# Files the lab writes into diagnose/ itself: a diagnose run's /out may not bring them.
DIAGNOSE_RESERVED = frozenset({"stdout.txt", "stderr.txt", "diagnostics.json", "diagnostics.json.tmp"})
COLLECT_ENV_TIMEOUT_S = 900


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


def check_gpu(case: Case, engine: Engine) -> None:
    if case.scenario.gpu and not engine.has_gpu_runtime():
        variant = case.scenario.cpu_variant
        hint = (f"Run its CPU variant instead: `lab run {variant}`." if variant else
                "Run it on an engine with the NVIDIA container runtime (see `lab doctor`).")
        raise NoGpuRuntimeError(
            f"{case.scenario.name} needs a GPU, and this Docker engine has no NVIDIA runtime "
            f"(runtimes: {', '.join(sorted(engine.info().get('Runtimes') or {})) or 'none'}).", hint=hint)


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
                     output_bytes=lim.output_bytes, stream_bytes=lim.logs_bytes)


def run_case(case: Case, engine: Engine, host: HostPip, runs_root: Path, events: Events = no_events,
             *, run_dir: Path | None = None, diagnose: bool = True, compile_debug: bool = False,
             allow_network: bool = False, collect_env: bool = True,
             plan: BuildPlan | None = None) -> RunOutcome:
    """Build (or reuse) the image, run the script, diagnose it, judge it and write the run folder.

    The diagnose step is a second container of the same image; the scenario's own run stays
    unchanged. It runs when asked, and always when an expectation needs it (graph_breaks).
    """
    check_gpu(case, engine)
    limits = run_limits(case, allow_network)
    plan = plan or plan_build(case, host, events)
    started = datetime.now(timezone.utc)
    run_dir = run_dir or report.new_run_dir(runs_root, case, started)
    write_context_folder(run_dir, plan)  # `docker build .` works in the run folder
    report.write_scenario(run_dir, case, None)
    emulated = case.arch != engine.arch
    record = dict(case=case, run_dir=run_dir, engine_version=engine.version,
                  host_arch=engine.arch.uname, emulated=emulated, started=started)
    try:
        try:
            image = build_image(plan, engine, host, events, run_dir / "build.log")
        except BuildError as err:
            judgement = build_failed(err.message)
            rec = report.RunRecord(judgement=judgement, evidence=None, image=None, base=None, **record)
            return RunOutcome(run_dir, report.write_results(rec), judgement)
        report.write_scenario(run_dir, case, image.base)
        _save_freeze(engine, image.tag, run_dir)
        raw = _run_script(case, engine, image.tag, run_dir, events, limits)
        diagnostics = None
        wanted = diagnose or compile_debug or case.scenario.expect.graph_breaks is not None
        if wanted and not raw.timed_out:  # a hung script would only hang a second time
            diagnostics = _diagnose(case, engine, image.tag, run_dir, events, limits, compile_debug)
        if collect_env:
            events("collect_env", "python -m torch.utils.collect_env")
            collected = _collect_env(engine, image.tag, case)
        else:
            collected = None
        evidence = analyze(raw)
        judgement = judge(evidence, case.scenario.expect, read_text(raw.stdout_path),
                          read_text(raw.stderr_path), diagnostics)
        rec = report.RunRecord(judgement=judgement, evidence=evidence, image=image, base=image.base,
                               collect_env=collected, diagnostics=diagnostics, **record)
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


def _command(case: Case, through_runner: bool) -> list[str]:
    script = [case.scenario.script.name, *case.scenario.args]
    return ["python", RUNNER_IN_IMAGE, *script] if through_runner else ["python", *script]


def _run_script(case: Case, engine: Engine, tag: str, run_dir: Path, events: Events, limits: RunLimits):
    env = case.run_env()
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


def _diagnose(case: Case, engine: Engine, tag: str, run_dir: Path, events: Events, limits: RunLimits,
              compile_debug: bool = False) -> Diagnostics:
    """What the torch.compile FAQ says to collect: explain's graph breaks, recompile reasons,
    compile time by phase, and a TORCH_TRACE folder (for tlparse); with `compile_debug`, also
    TORCH_COMPILE_DEBUG=1's folder."""
    folder = run_dir / "diagnose"
    env = case.run_env()
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


def _collect_env(engine: Engine, tag: str, case: Case) -> str:
    code, output = engine.output_of(tag, ["python", "-m", "torch.utils.collect_env"], case.arch,
                                    COLLECT_ENV_TIMEOUT_S, {"org.torch-repro-lab.case": case.name})
    if code != 0:
        return f"Could not collect (exit {code}):\n{output}"
    return output


def _save_freeze(engine: Engine, tag: str, run_dir: Path) -> None:
    data = engine.read_file(tag, "/lab/pip-freeze.txt")
    if data is not None:
        (run_dir / "pip-freeze.txt").write_bytes(data)
