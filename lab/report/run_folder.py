"""The run folder's written records: the resolved scenario, evidence.json, result.json and report.md.

report.md is meant to be pasted into a PyTorch issue: summary first, evidence in
plain words, versions, the script, then the long logs collapsed.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from lab import __version__
from lab.analyze.dynamo import Diagnostics
from lab.analyze.evidence import Evidence, read_text
from lab.analyze.judge import Judgement
from lab.core.arch import with_emulated_env
from lab.core.config import current
from lab.core.errors import LabError
from lab.core.records import STOPPED_EMULATOR, STOPPED_OUT_FULL, BaseImage, BuiltImage, format_bytes
from lab.core.results import (
    RESULT_NAME,
    BaseRef,
    DepsRef,
    EngineRef,
    ImageRef,
    LocalRef,
    RunEvidence,
    RunResult,
    StageTimes,
    TorchBuild,
    UnfinishedRun,
)
from lab.core.runmarker import mark_run
from lab.core.scrub import redact_secrets
from lab.image.casekey import ContentKey
from lab.image.era import DepSet, freeze_versions, pins_to_versions
from lab.image.layout import VENV
from lab.image.render import SITE_DIR, BuildPlan
from lab.image.resolve import Case
from lab.report.html import write_run_html
from lab.report.writer import render
from lab.scenario.lookup import find_by_name

_LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class RunRecord:
    """Everything report.md and result.json are written from."""

    case: Case
    run_dir: Path
    judgement: Judgement
    evidence: Evidence | None          # None when no run happened (build failed)
    image: BuiltImage | None
    base: BaseImage | None
    engine_version: str
    host_arch: str
    emulated: bool
    started: datetime
    engine_name: str = "default"       # the Docker context's name or the address the run used
    collect_env: str | None = None
    diagnostics: Diagnostics | None = None
    diagnose: str | None = None        # why the diagnose step ran or did not
    timings: StageTimes | None = None
    torch_build: TorchBuild | None = None  # torch/version.py of the image (git_version)
    engine_kind: str = "docker"        # "local": this host, no container
    local: LocalRef | None = None      # the local engine's host, Python and confinement
    content: ContentKey | None = None  # lab.image.casekey of the case, taken before the build
    depset: DepSet | None = None       # lab.image.era: the era's resolution (None: `latest`)


def new_run_dir(root: Path, case: Case, now: datetime | None = None, suffix: str | None = None) -> Path:
    """runs/<scenario>/<timestamp>-torch<ver>-<arch>[-backend][-mode][-suffix]/, unique even for
    parallel runs (a second one the same second gets `-2`)."""
    now = now or datetime.now(timezone.utc)
    parts = [f"{now:%Y%m%dT%H%M%SZ}-torch{case.torch}-{case.arch.value}", case.backend, case.mode, suffix]
    stem = "-".join(p for p in parts if p)
    parent = root / case.scenario.name
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        if (note := mark_run(root, path)) is not None:  # the lab made it: `lab runs --gc` may remove it
            logging.getLogger("lab").warning(note)
        return path
    raise FileExistsError(f"no free run folder name under {parent}")


def resolved_scenario(case: Case, base: BaseImage | None) -> dict:
    data = case.scenario.model_dump(mode="json")
    data["script"] = case.scenario.script.name
    data.pop("source", None)
    data["resolved"] = {
        "case": case.name, "torch": case.torch, "arch": case.arch.value,
        "platform": case.arch.platform, "backend": case.backend, "vars": dict(case.vars),
        "source_file": str(case.scenario.source),
        **({"pins": [*case.pins, *case.resolved]} if case.pins or case.resolved else {}),
        "base": None if base is None else {"requested": base.requested, "ref": base.ref,
                                           "image_id": base.image_id, "origin": base.origin,
                                           "recipe": base.recipe},
    }
    return data


@dataclass(frozen=True)
class SiteReadme:
    """What site/README.md (templates/site-readme.md.j2) is laid out from."""

    requirements: str
    venv: str
    site_root: str | None     # the cross-installed tree, when there is one
    site_image: str | None
    platform: str
    lock_text: str
    notes: str


def write_site_readme(run_dir: Path, plan: BuildPlan) -> None:
    """site/README.md of a run folder: where the venv's packages came from, and how to build with
    them (the folder is the build context of a plain `docker build .`, which leaves this file out).
    Nothing of the host's secrets: the notes and the lock are redacted."""
    site, case = plan.site, plan.case
    root = str(site.root) if site is not None and site.root is not None else None
    view = SiteReadme(requirements=" ".join(case.requirements), venv=VENV, site_root=root,
                      site_image=plan.site_image, platform=case.arch.platform,
                      lock_text=site.lock_text.rstrip() if root else "",
                      notes="; ".join(plan.notes) or "no reason given")
    (run_dir / SITE_DIR).mkdir(exist_ok=True)
    (run_dir / SITE_DIR / "README.md").write_text(redact_secrets(render("site-readme.md.j2", view)))


# The run folder doubles as a build context for `docker build .`; this keeps its outputs out.
def write_scenario(run_dir: Path, case: Case, base: BaseImage | None) -> None:
    (run_dir / "scenario.yaml").write_text(
        yaml.safe_dump(resolved_scenario(case, base), sort_keys=False, allow_unicode=True))


def deps_ref(rec: RunRecord) -> DepsRef:
    """result.json's `deps`: the setting, the cut, and every package the run had (its pip freeze;
    without one, what the lab pinned)."""
    freeze = rec.run_dir / "pip-freeze.txt"
    packages = freeze_versions(freeze.read_text(errors="replace")) if freeze.is_file() else {}
    if not packages:
        packages = pins_to_versions((*rec.case.pins, *rec.case.resolved))
    d = rec.depset
    return DepsRef(setting=rec.case.deps, exclude_newer=d.cut if d else None,
                   torch_uploaded=d.released if d else None, pinned=rec.case.pins, packages=packages)


def run_result(rec: RunRecord) -> RunResult:
    """result.json (and `lab run --json`) of a run that reached a verdict."""
    ev = rec.evidence
    return RunResult(
        scenario=rec.case.scenario.name,
        case=rec.case.name,
        torch=rec.case.torch,
        arch=rec.case.arch.value,
        backend=rec.case.backend,
        mode=rec.case.mode,
        emulated=rec.emulated,
        verdict=rec.judgement.verdict,
        reason=rec.judgement.reason,
        summary=tuple(ev.plain_words()) if ev else (),
        run_dir=str(rec.run_dir),
        evidence=ev.summary() if ev else RunEvidence(),
        graph_breaks=rec.diagnostics.graph_break_count if rec.diagnostics else None,
        exit_code=ev.exit_code if ev else None,
        duration_s=round(ev.duration_s, 2) if ev else None,
        killed=_killed(ev),
        limits=None if ev is None or ev.limits is None else ev.limits.describe(),
        capture=ev.capture() if ev else None,
        diagnose=rec.diagnose,
        timings=rec.timings,
        checks=rec.judgement.checks,
        image=None if rec.image is None else ImageRef(tag=rec.image.tag, id=rec.image.image_id,
                                                      cached=rec.image.cached,
                                                      site_mounted=rec.image.mounted is not None),
        base=None if rec.base is None else BaseRef(requested=rec.base.requested, ref=rec.base.ref,
                                                   origin=rec.base.origin, image_id=rec.base.image_id),
        engine=EngineRef(version=rec.engine_version, host_arch=rec.host_arch, name=rec.engine_name,
                         kind=rec.engine_kind),
        local=rec.local,
        lab_version=__version__,
        started=rec.started.isoformat(timespec="seconds"),
        different_failure=rec.judgement.different,
        torch_build=rec.torch_build,
        content_key=rec.content.digest if rec.content else None,
        content_parts=dict(rec.content.parts) if rec.content else None,
        signature=rec.judgement.signature,
        deps=deps_ref(rec),
    )


def write_results(rec: RunRecord) -> RunResult:
    result = run_result(rec)
    result.write(rec.run_dir / RESULT_NAME)
    if rec.evidence is not None:
        rec.evidence.record(rec.judgement).write(rec.run_dir / "evidence.json")
    if rec.collect_env is not None:
        (rec.run_dir / "collect_env.txt").write_text(rec.collect_env)
    if rec.diagnostics is not None:
        _dump_json(rec.run_dir / "diagnose" / "diagnostics.json", rec.diagnostics.to_json())
    (rec.run_dir / "report.md").write_text(render_report(rec))
    write_html(rec.run_dir)
    return result


def write_html(run_dir: Path) -> str | None:
    """report.html beside report.md (lab.report.html), written after every other record: a failure
    to write it is a note (returned, and logged), never a lost run."""
    try:
        write_run_html(run_dir)
    except (OSError, LabError) as exc:
        note = f"report.html was not written: {exc}"
        logging.getLogger("lab").warning(note)
        return note
    return None


def mark_unfinished(run_dir: Path, case: Case, status: str, reason: str) -> None:
    """Best effort, when a run stops without a verdict (Ctrl-C, or the infrastructure failed):
    leave a result.json that says what happened. `status` is "interrupted" or "failed"."""
    UnfinishedRun(scenario=case.scenario.name, case=case.name, torch=case.torch, arch=case.arch.value,
                  backend=case.backend, mode=case.mode, status=status, reason=reason,
                  run_dir=str(run_dir)).write(run_dir / RESULT_NAME)


def _dump_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


# --- report.md ---------------------------------------------------------------
# The values report.md is laid out from (lab/report/templates/report.md.j2): plain strings and
# flags; the template escapes them (lab.report.escape's filters).
@dataclass(frozen=True)
class Details:
    """A collapsed log: the template's `details` filter puts it in <details> with a fenced block."""

    summary: str
    body: str


@dataclass(frozen=True)
class CheckRow:
    key: str
    expected: str
    observed: str
    held: bool


@dataclass(frozen=True)
class DiagnosticsView:
    words: tuple[str, ...]
    trace_files: tuple[str, ...]


@dataclass(frozen=True)
class BaseView:
    requested: str
    origin: str        # in words: "pulled", "bootstrapped from Debian's archive", ...
    image_id: str      # shortened
    recipe: str | None


@dataclass(frozen=True)
class ReportView:
    title: str
    verdict: str
    reason: str
    case_name: str
    torch: str
    where: str
    emulated: bool
    upstream: str | None
    ran: bool                      # False when the build failed: no run facts
    duration: str
    timeout: int
    killed: str | None
    limits: str | None             # RunLimits.describe() and describe_caps(), when confined
    caps: str
    cuts: str
    description: str | None
    words: tuple[str, ...]
    checks: tuple[CheckRow, ...]
    diagnostics: DiagnosticsView | None
    not_collected: str             # why no diagnostics, when there are none
    ablatable: bool
    backend: str
    mode: str | None
    scenario_ref: str
    script_name: str
    args: str
    script: str
    rerun: str
    platform: str
    base_note: str | None          # the engine had no registry: how the base was made
    build_base: str
    run_env: str
    logs: tuple[Details, ...]
    pip_requirement: str
    packages: tuple[str, ...]
    base: BaseView | None
    image_tag: str | None
    facts: tuple[tuple[str, str], ...]
    engine_version: str
    host_arch: str
    engine_name: str
    lab_version: str
    environment: tuple[Details, ...]
    torch_commit: str | None = None                 # torch.version.git_version of the image
    different: tuple[str, str] | None = None        # failed_differently: (expected, observed)
    signature: tuple[str, str] | None = None        # exit-code-only scenario: (words, the YAML to pin it)
    local: LocalRef | None = None      # a run of the local engine: no container, the host's system
    site_mounted: bool = False         # the venv's packages were mounted read-only, not in the image


def render_report(rec: RunRecord) -> str:
    """In the order of PyTorch's pt2-bug-report.yml: the bug (with its trace, ablation and a
    minimal reproducer), then the error logs, then the versions."""
    return render("report.md.j2", report_view(rec))


def report_view(rec: RunRecord) -> ReportView:
    case, j, ev, s = rec.case, rec.judgement, rec.evidence, rec.case.scenario
    d = rec.diagnostics
    where = f"{case.arch.platform}" + (f", emulated with QEMU on an {rec.host_arch} host"
                                       if rec.emulated else ", native") + f", engine {rec.engine_name}"
    if rec.local is not None:
        where += f" (this host, no container: {rec.local.os}, {rec.local.libc})"
    base_note, build_base = None, s.base
    if rec.base and rec.base.ref != rec.base.requested:
        base_note = f"this engine had no registry: its base was {rec.base.origin} as {rec.base.ref}"
        build_base = rec.base.ref
    return ReportView(
        title=s.title or s.name, verdict=j.verdict.value, reason=j.reason, case_name=case.name, torch=case.torch,
        where=where, emulated=rec.emulated, upstream=s.upstream,
        ran=ev is not None,
        duration=f"{ev.duration_s:.1f}" if ev else "", timeout=s.timeout, killed=_killed(ev),
        limits=ev.limits.describe() if ev and ev.limits else None,
        caps=ev.limits.describe_caps() if ev and ev.limits else "",
        cuts=_cut_words(ev) if ev else "",
        description=s.description.strip() if s.description else None,
        words=tuple(ev.plain_words() if ev else ["no run: the image build failed"]),
        checks=tuple(CheckRow(c.key, c.expected, c.observed, c.held) for c in j.checks),
        diagnostics=None if d is None else DiagnosticsView(tuple(d.plain_words()), tuple(d.trace_files)),
        not_collected=("no run" if ev is None else
                       "the run timed out, and a second run would hang too" if ev.timed_out else
                       (rec.diagnose or "not run: `--no-diagnose`").removeprefix("not run: ")),
        ablatable=s.ablation.via != "none", backend=case.backend or "as the script chooses", mode=case.mode,
        scenario_ref=scenario_ref(case),
        script_name=s.script.name, args=_args(case), script=s.script.read_text(errors="replace").rstrip(),
        rerun=shlex.join(_rerun_command(case, rec.local)), platform=case.arch.platform, base_note=base_note,
        build_base=build_base,
        run_env="".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in sorted(
            with_emulated_env(case.run_env(), bool(ev and ev.emulated)).items())),
        logs=tuple(_logs(rec)),
        pip_requirement=case.requirements[0], packages=tuple(_packages(rec.run_dir)),
        base=None if rec.base is None else BaseView(rec.base.requested, _BASE_ORIGIN[rec.base.origin],
                                                    rec.base.image_id[:19], rec.base.recipe),
        image_tag=rec.image.tag if rec.image else None,
        facts=tuple(collect_env_facts(rec.collect_env or "")),
        engine_version=rec.engine_version, host_arch=rec.host_arch, engine_name=rec.engine_name,
        lab_version=__version__,
        environment=tuple(_environment(rec)),
        torch_commit=rec.torch_build.git_version if rec.torch_build else None,
        different=(j.different.expected, j.different.observed) if j.different else None,
        signature=_proposed_signature(j, s.expect),
        local=rec.local,
        site_mounted=rec.image is not None and rec.image.mounted is not None,
    )


def _proposed_signature(j, expect) -> tuple[str, str] | None:
    """A scenario that expects only an exit code, on a run that failed with an exception or a signal:
    the signature to pin (`expect.signature`), in words and as the YAML flow mapping to paste."""
    sig = j.signature
    if sig is None or not expect.exit_code_only or j.verdict.value != "reproduced":
        return None
    fields = {k: v for k, v in sig.to_json().items() if v is not None}
    flow = "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()) + "}"
    return sig.words(), flow


def _environment(rec: RunRecord) -> list[Details]:
    out: list[Details] = []
    if rec.collect_env:
        out.append(_log("python -m torch.utils.collect_env", rec.collect_env))
    d = rec.run_dir
    out.append(_log("Dockerfile", (d / "Dockerfile").read_text() if (d / "Dockerfile").exists() else ""))
    return out


def _killed(ev) -> str | None:
    """Why the container did not end by itself, in words ('out of memory (limit 8 GiB)')."""
    if ev is None:
        return None
    if ev.timed_out:
        return f"timeout, after {ev.duration_s:.0f} s; the {ev.unit} was stopped and its partial logs kept"
    if ev.oom_killed:
        return ev.oom_words.removeprefix("killed: ")
    if ev.stopped_for == STOPPED_EMULATOR:
        return f"the emulator crashed, and the lab stopped the {ev.unit} (QEMU would hang)"
    if ev.stopped_for == STOPPED_OUT_FULL:
        return ev.out_full_words.removeprefix("killed: ") + f"; the lab stopped the {ev.unit}"
    return None


def _cut_words(ev: Evidence) -> str:
    """'stdout cut; 2 entries of /out not copied' (the details are in the evidence list)."""
    parts = [f"{s.name} cut at {format_bytes(s.cap)}" for s in ev.streams if s.cut]
    if ev.outputs is not None and ev.outputs.skipped:
        n = len(ev.outputs.skipped)
        parts.append(f"{n} entr{'ies' if n != 1 else 'y'} of /out not copied (links, fifos, devices or "
                     "unsafe names)")
    if ev.outputs is not None and ev.outputs.stopped:
        parts.append("the copy of /out stopped early")
    return "; ".join(parts) + ("; see the evidence below" if parts else "")


_BASE_ORIGIN = {"bootstrapped": "bootstrapped from Debian's archive", "pulled": "pulled",
                "local": "present on the engine"}


def _packages(run_dir: Path) -> list[str]:
    """The pip freeze lines worth a line in an issue (torch has its own)."""
    freeze = run_dir / "pip-freeze.txt"
    if not freeze.exists():
        return []
    return [ln for ln in freeze.read_text().splitlines()
            if ln.split("==")[0].lower() in ("torch", "numpy", "sympy", "triton", "filelock")
            and not ln.startswith("torch==")]


_ENV_FACTS = ("Python version", "OS", "GCC version", "Libc version", "CUDA runtime version",
              "cuDNN version", "Nvidia driver version")


def collect_env_facts(text: str) -> list[tuple[str, str]]:
    """The lines of collect_env's record that matter in an issue, where it could collect them."""
    facts = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in _ENV_FACTS and key not in facts:
            value = value.strip()
            if value and value not in ("Could not collect", "No CUDA", "N/A"):
                facts[key] = value
    return [(k, facts[k]) for k in _ENV_FACTS if k in facts]


def scenario_ref(case: Case) -> str:
    """How report.md names the scenario on a command line: its name when that name finds this very
    file (a project or shipped scenario, lab.config's search path), else its file's name. Never its
    path: report.md goes into bundles for an upstream issue, and the path is the user's (issue 33);
    scenario.yaml's `resolved.source_file` keeps it for the user."""
    source = case.scenario.source
    if source is None:
        return case.scenario.name
    found = find_by_name(source.stem, [d.path for d in current().scenario_dirs()])
    if found is not None and found.resolve() == source.resolve():
        return source.stem
    return source.name


def _args(case: Case) -> str:
    return (" " + shlex.join(case.scenario.args)) if case.scenario.args else ""


def _rerun_command(case: Case, local: LocalRef | None = None) -> list[str]:
    cmd = ["lab", "run", scenario_ref(case), "--torch", case.torch, "--arch", case.arch.value]
    if local is not None:
        cmd += ["--engine", "local"] + (["--python-env", "current"] if local.python_env == "current" else [])
        if not local.confined:
            cmd.append("--trust-script")
    if case.backend:
        cmd += ["--backend", case.backend]
    if case.mode:
        cmd += ["--mode", case.mode]
    for k, v in case.vars:
        cmd += ["--set", f"{k}={v}"]
    return cmd


def _logs(rec: RunRecord) -> list[Details]:
    out: list[Details] = []
    d = rec.run_dir
    logs = (("stderr.txt", "stderr"), ("stdout.txt", "stdout"),
            ("diagnose/stderr.txt", "diagnose step: stderr (TORCH_LOGS=recompiles)"), ("build.log", "build log"))
    for name, title in logs:
        if (d / name).exists():
            text = read_text(d / name, limit=256 * 1024)
            lines = text.splitlines()
            note = f" (last {_LOG_TAIL_LINES} of {len(lines)} lines)" if len(lines) > _LOG_TAIL_LINES else ""
            out.append(_log(title + note, "\n".join(lines[-_LOG_TAIL_LINES:])))
    if rec.evidence and rec.evidence.duplicate_runtimes:
        out.append(_log("Loader evidence (LD_DEBUG=libs,files)", "\n".join(
            f"pid {dup.pid}: {path}  <- {obj.needed_by or '?'}"
            for dup in rec.evidence.duplicate_runtimes
            for path, obj in zip(dup.paths, dup.objects, strict=True))))
    return out


def _log(summary: str, body: str) -> Details:
    return Details(summary, body.rstrip())
