"""`lab replay BUNDLE`: check a bundle, rebuild what its scenario declares with this lab's
templates, run it again, and compare the new verdict and evidence with the bundled ones.

A bundle comes from someone else, so nothing in it is trusted, and a replay has two steps:

1. `prepare_replay` unpacks the bundle through `lab.bundle.unpack_bundle` (manifest, checksums,
   sizes, no links, nothing outside the target) into a scratch folder, validates its scenario
   like any scenario file (plus its `resolved` block), and re-renders the Dockerfile with THIS
   lab's templates. It returns a `ReplayPlan`: everything the user must see before anything is
   built (the base, packages, requirements, torch/arch, the script's first lines, network, GPU,
   the environment, and the diff when the bundled Dockerfile is not the re-render). Nothing is
   built or run, and nothing stays on disk if the user declines (`discard_replay`).
2. `execute_replay` moves the unpacked bundle into a new run folder and builds and runs.

What is built: this lab's re-render of the bundled scenario, this lab's runner (`tools/`), and
the bundle's repro script (what the scenario declares; it runs as confined as any script). The
bundle's own Dockerfile is built only with `bundled_dockerfile=True` (`--bundled-dockerfile`):
its RUN steps run at build time, as root, before any confinement, so the CLI warns. Even then,
every file taken from the bundle is checked again against the manifest.

A stranger's bundle runs nothing of its own at build time and learns no secret: its requirements
are installed as wheels only, resolved on this host by uv (`--no-build`) from the indexes the user
configured (lab.image.wheelsonly). A direct URL, VCS or path reference is refused by
`prepare_replay`, and what did not resolve to a wheel by `execute_replay`, before anything is made,
unless `allow_source_builds` (`--allow-source-builds`). The build is sealed (lab.image.render
`Sealed`, lab.image.builder): never the host's index credentials, and no network, except this lab's
system-packages step when the base lacks the packages, and pip with `--allow-source-builds`, which
get the engine's default network (never the host's). From the replaying host come the CA bundle,
the pip settings without credentials (or none: `no-index` with the host's wheels), and the
cross-installed `site/`.

A replay is a run folder, `<runs>/<scenario>/<time>-torch<v>-<arch>-replay/`, with the
unpacked bundle in `replayed/` and the comparison in `replay.json` and at the end of report.md.

Only the CLI prints and asks; the text this module hands it is already made safe to show
(control and bidirectional characters escaped, long lines cut).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from lab.bundle.archive import Unpacked, unpack_bundle
from lab.bundle.compare import Comparison, compare
from lab.bundle.manifest import Manifest
from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.core.records import Events, RunLimits, format_bytes, no_events
from lab.core.results import RESULT_NAME, RunResult, parse_result
from lab.core.scrub import MASK
from lab.engine.protocol import Engine
from lab.image.era import SKIPPED, pins_to_versions
from lab.image.hostpip import HostPip
from lab.image.render import (
    BASE_PACKAGES,
    PROVENANCE,
    ContextFile,
    Sealed,
    context_digest,
    plan_build,
    render_dockerfile,
)
from lab.image.resolve import BACKENDS, MODES, Case, resolve
from lab.image.wheelsonly import DirectReference, direct_references, refuse_references
from lab.pipeline import RunCase, run_limits
from lab.pipeline import run_case as production_run_case
from lab.report import run_folder as report
from lab.report.writer import render
from lab.scenario.loader import read_yaml, validate_scenario
from lab.scenario.model import Limits, Scenario, TorchVersion

REPLAYED = "replayed"
SCRIPT_HEAD_LINES = 20      # lines of the script shown before the confirmation
MAX_LINE_CHARS = 200        # a longer line is cut, with the count of what was cut
MAX_DIFF_LINES = 400        # a longer diff is cut, with the count of what was cut
MAX_DOCKERFILE_BYTES = 1 << 20
_SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}")
# What a terminal would act on or hide: C0/C1 controls, invisible and bidirectional characters.
_HIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u2069\ufeff\ufff9-\ufffb]")
_PY_LINE_END = re.compile(r"\r\n|\r|\n")  # what ends a line for Python's tokenizer


class Built(str, Enum):
    """Which Dockerfile a replay builds."""

    RENDERED = "rendered"   # this lab's re-render of the bundled scenario
    BUNDLED = "bundled"     # the bundle's own (--bundled-dockerfile)


@dataclass(frozen=True)
class ScriptHead:
    """The repro script as shown before a replay: its first lines as Python reads them."""

    name: str
    size: int
    sha256: str
    encoding: str
    lines: tuple[str, ...]
    more_lines: int          # lines after those shown
    notes: tuple[str, ...]   # e.g. a declared source encoding other than UTF-8


@dataclass(frozen=True)
class ReplayPlan:
    """Everything `lab replay` shows before it builds, and what `execute_replay` needs."""

    bundle: Path
    runs_root: Path
    manifest: Manifest
    original: RunResult              # the bundled result.json
    case: Case
    emulated: bool
    limits: RunLimits
    script: ScriptHead
    rendered: str                    # this lab's Dockerfile for the case
    bundled: str | None              # the bundle's Dockerfile (for display), None when it has none
    diff: tuple[str, ...]            # unified diff bundled -> rendered, safe to show; () when the same
    diff_cut: int                    # diff lines left out of `diff`
    built: Built
    masked: tuple[str, ...]          # variables whose secret values the bundle's author removed
    unpacked: Unpacked               # the bundle unpacked in `scratch` (moved by execute_replay)
    scratch: Path
    made_root: Path | None           # the runs folder, when prepare_replay created it
    display: str = "scenario.yaml"   # how errors name the bundled scenario
    allow_source_builds: bool = False  # --allow-source-builds: requirements that are not host-resolved wheels
    source_requirements: tuple[DirectReference, ...] = ()  # direct URL, VCS, path: allowed by the flag

    @property
    def dockerfile_same(self) -> bool:
        return self.bundled is not None and not self.diff

    @property
    def system_packages(self) -> tuple[str, ...]:
        return self.case.scenario.system_packages

    @property
    def lab_packages(self) -> tuple[str, ...]:
        """What the lab's template installs besides the scenario's packages."""
        return tuple(p for p in BASE_PACKAGES if p not in self.case.scenario.system_packages)

    @property
    def requirements(self) -> tuple[str, ...]:
        return self.case.requirements

    @property
    def network(self) -> bool:
        return self.limits.network

    @property
    def gpu(self) -> bool:
        return self.case.scenario.gpu

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        """The script's environment (scenario env, variables, backend), values safe to show."""
        return tuple((k, visible(v, 80)) for k, v in sorted(self.case.run_env().items()))

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(visible(a, 80) for a in self.case.scenario.args)

    @property
    def script_in_bundle(self) -> str:
        return f"{self.unpacked.folder.name}/repro/{self.script.name}"


@dataclass(frozen=True, slots=True)
class LimitLine:
    """One limit of a replay's run as the summary shows it, with this lab's default when the bundle
    raises it above that (the CLI marks those)."""

    name: str
    value: str
    above: str | None = None   # "this lab's default", shown when the value is above it


def limit_lines(plan: ReplayPlan) -> tuple[LimitLine, ...]:
    """Every limit the replay's script runs under: memory, pids, CPUs, timeout, the /out and the
    stdout/stderr caps, and network, each compared with this lab's defaults (`Limits()`,
    `Scenario.timeout`), which a bundle may raise (up to `1t` for /out)."""
    lim, ours = plan.limits, Limits()
    timeout, default_timeout = plan.case.scenario.timeout, Scenario.model_fields["timeout"].default

    def above(value: float | None, default: float | None, shown: str) -> str | None:
        if value is None:
            return None
        return shown if default is None or value > default else None

    return (
        LimitLine("memory", format_bytes(lim.memory_bytes),
                  above(lim.memory_bytes, ours.memory_bytes, format_bytes(ours.memory_bytes))),
        LimitLine("pids", str(lim.pids) if lim.pids else "unlimited", above(lim.pids, ours.pids, str(ours.pids))),
        LimitLine("CPUs", f"{lim.cpus:g}" if lim.cpus else "all of the engine's"),  # the default is all
        LimitLine("timeout", f"{timeout} s", above(timeout, default_timeout, f"{default_timeout} s")),
        LimitLine("/out copied", f"up to {format_bytes(lim.output_bytes)} and {lim.output_files} files",
                  above(lim.output_bytes, ours.output_bytes, format_bytes(ours.output_bytes))),
        LimitLine("stdout, stderr", f"kept up to {format_bytes(lim.stream_bytes)} each",
                  above(lim.stream_bytes, ours.logs_bytes, format_bytes(ours.logs_bytes))),
        LimitLine("network", "YES: the script may use the network (--allow-network)" if lim.network else "no",
                  "no network" if lim.network else None),
    )


@dataclass(frozen=True)
class ReplayOutcome:
    run_dir: Path
    original: RunResult
    result: RunResult
    comparison: Comparison
    dockerfile_same_as_this_lab: bool
    built: Built


_PIN_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,100}[A-Za-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,60}")


def _check_pin(value: str) -> str:
    """A pin the run recorded (lab.image.era): `name==version` and nothing else; it goes into the
    requirements, so a line break or an option is refused."""
    if not _PIN_RE.fullmatch(value):
        raise ValueError(f"must be a pin such as numpy==1.26.4, got {value[:60]!r}")
    return value


class _Resolved(BaseModel):
    """The `resolved` block of a run folder's scenario.yaml (lab.report.resolved_scenario)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    case: str | None = None
    torch: TorchVersion
    arch: Literal["amd64", "arm64"]
    platform: Literal["linux/amd64", "linux/arm64"] | None = None
    backend: Literal[BACKENDS] | None = None  # type: ignore[valid-type]
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    vars: dict[str, str] = {}
    source_file: str | None = None
    base: dict[str, Any] | None = None   # the original host's base image: informative only
    pins: list[Annotated[str, AfterValidator(_check_pin)]] = []  # what the run pinned (lab.image.era)


# --------------------------------------------------------------------------- prepare


def prepare_replay(bundle: Path, runs_root: Path, host_arch: Arch, *, allow_network: bool = False,
                   bundled_dockerfile: bool = False, allow_source_builds: bool = False) -> ReplayPlan:
    """Unpack and check a bundle, validate its scenario and re-render it; build and run nothing.

    The caller shows the plan, asks, then calls `execute_replay` or `discard_replay`. A
    BundleError or ScenarioError (bad input) leaves nothing behind. A requirement that names a
    direct URL, a VCS repository or a path is refused here (SourceBuildError) unless
    `allow_source_builds`: a replay installs wheels resolved on this host only (lab.image.wheelsonly).
    """

    made_root = _first_missing(runs_root)
    runs_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".replay-", dir=runs_root))
    try:
        unpacked = unpack_bundle(bundle, scratch / "bundle")
        src = unpacked.folder
        original = _original_result(unpacked, bundle)
        display = f"scenario.yaml in {bundle}"
        case, lines = _case_from(unpacked, display, _recorded_pins(original, bundle))
        if case.scenario.network and not allow_network:
            raise ScenarioError(
                "the bundled scenario asks for network access while its script runs (network: true); the "
                "script comes from whoever made the bundle, so the lab replays it without network unless you "
                "confirm.", file=display, line=lines.get(("network",)), field="network",
                hint="Read the script, then replay with --allow-network.")
        limits = run_limits(case, allow_network)
        references = direct_references(case.scenario.pip)
        if not allow_source_builds:
            refuse_references(references, file=display,
                              line=lines.get(("pip", references[0].index)) if references else None)
        script = _script_head(unpacked.read_checked(f"repro/{case.scenario.script.name}"), case.scenario.script.name)
        bundled = _bundled_dockerfile(unpacked, required=bundled_dockerfile)
        rendered = _with_provenance(render_dockerfile(case), bundled)
        diff, cut = _diff(bundled, rendered)
        masked = tuple(sorted(k for k, v in case.run_env().items() if v == MASK))
        return ReplayPlan(bundle=bundle, runs_root=runs_root, manifest=unpacked.manifest, original=original,
                          case=case, emulated=case.arch != host_arch, limits=limits, script=script,
                          rendered=rendered, bundled=None if bundled is None else bundled.decode("utf-8", "replace"),
                          diff=diff, diff_cut=cut, built=Built.BUNDLED if bundled_dockerfile else Built.RENDERED,
                          masked=masked, unpacked=Unpacked(src, unpacked.manifest), scratch=scratch,
                          made_root=made_root, display=display, allow_source_builds=allow_source_builds,
                          source_requirements=references)
    except BaseException:
        _remove(scratch, made_root)
        raise


def discard_replay(plan: ReplayPlan) -> None:
    """Remove what `prepare_replay` left (the scratch folder; the runs folder if it made it and it
    is still empty). Safe to call after `execute_replay`."""
    _remove(plan.scratch, plan.made_root)


def _remove(scratch: Path, made_root: Path | None) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
    folder = scratch.parent
    while made_root is not None and (folder == made_root or made_root in folder.parents):
        try:
            folder.rmdir()  # only while empty
        except OSError:
            return
        folder = folder.parent


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet (what mkdir(parents=True) creates)."""
    missing = None
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing = folder
    return missing


def _original_result(unpacked: Unpacked, bundle: Path) -> RunResult:
    where = f"{bundle}: {RESULT_NAME}"
    data = parse_result(unpacked.read_checked(RESULT_NAME, 16 << 20), where)
    if not isinstance(data, RunResult):
        raise ScenarioError("the bundled run never reached a verdict (it was interrupted or failed), so there "
                            "is nothing to compare a replay with.", file=str(bundle), field="result.json")
    return data


def _recorded_pins(original: RunResult, bundle: Path) -> dict[str, str]:
    """Every package version the original run had (result.json's `deps.packages`, from its pip
    freeze; torch and the venv's own tools left out), checked as pins: a replay installs exactly
    these, whatever `deps` the run used, so a `latest` run is not replayed against today's index."""
    deps = original.deps
    if deps is None:
        return {}
    out: dict[str, str] = {}
    for name, version in deps.packages.items():
        pin = f"{name}=={version}"
        if not _PIN_RE.fullmatch(pin):
            raise ScenarioError(f"must map a package name to its version (numpy: 1.26.4), got {pin[:60]!r}.",
                                file=f"{bundle}: {RESULT_NAME}", field=f"deps.packages.{str(name)[:40]}")
        key = canonicalize_name(name)
        if key not in SKIPPED:
            out[key] = pin
    return out


def _requirement_name(requirement: str) -> str | None:
    try:
        return Requirement(requirement).name
    except InvalidRequirement:
        return None    # a bare URL or path: pip learns its name only from what it fetches


def _case_from(unpacked: Unpacked, display: str,
               recorded: Mapping[str, str] | None = None) -> tuple[Case, Mapping[tuple, int]]:
    """The bundled scenario, validated like any scenario file (errors name `display`, the line and
    the field), at its resolved torch/arch/backend, with its script in the bundle's repro/; pinned to
    the `resolved.pins` the run chose, and constrained to every other version it `recorded` (its
    freeze), but for a package the scenario installs from a direct reference. Constraints, not
    requirements: the re-rendered Dockerfile stays the bundled one, and uv on this host resolves the
    same requirements to exactly the run's versions (a replay is wheels-only, so nothing else installs)."""
    src = unpacked.folder
    path = src / "scenario.yaml"
    if unpacked.entry("scenario.yaml") is None:
        raise ScenarioError("the bundle has no scenario.yaml.", file=display)
    data, lines = read_yaml(path, display=display)
    resolved = _resolved(data.pop("resolved", None), lines, display)
    script = data.get("script")
    if not isinstance(script, str) or not _SCRIPT_NAME.fullmatch(script) or script.strip(".") == "":
        raise ScenarioError("must be the file name of the script in the bundle's repro/ folder (letters, digits, "
                            f"'.', '_', '+', '-'), got {str(script)[:60]!r}.", file=display,
                            line=lines.get(("script",)), field="script")
    if unpacked.entry(f"repro/{script}") is None:
        raise ScenarioError(f"the bundle has no repro/{script}, the script the scenario names.", file=display,
                            line=lines.get(("script",)), field="script")
    scenario = validate_scenario(data, lines, source=path, base_dir=src / "repro", display=display)
    if (resolved.backend or resolved.mode) and scenario.ablation.via == "none":
        raise ScenarioError("a backend or mode is resolved, but the script hard-codes its backend "
                            "(ablation.via: none).", file=display, line=lines.get(("resolved",)),
                            field="resolved.backend")
    chosen = pins_to_versions(resolved.pins)
    direct = {canonicalize_name(name) for r in direct_references(scenario.pip)
              if (name := _requirement_name(r.requirement))}
    constraints = tuple(pin for key, pin in sorted((recorded or {}).items()) if key not in chosen and key not in direct)
    case = resolve(scenario, torch=resolved.torch, arch=resolved.arch, backend=resolved.backend,
                   mode=resolved.mode, pins=tuple(resolved.pins), constraints=constraints)
    return case, lines


def _resolved(value: Any, lines: Mapping[tuple, int], display: str) -> _Resolved:
    if not isinstance(value, dict):
        raise ScenarioError("the bundled scenario.yaml has no `resolved` block (torch, arch, backend), which "
                            "`lab run` writes.", file=display, line=lines.get(("resolved",)), field="resolved")
    try:
        return _Resolved.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(str(p) for p in error["loc"])
        field = ".".join(("resolved", *loc))
        line = next((lines[k] for k in (("resolved", *loc[:1]), ("resolved",)) if k in lines), None)
        cause = (error.get("ctx") or {}).get("error")
        if error["type"] == "extra_forbidden":
            message = "unknown key; `lab run` does not write it."
        elif error["type"] == "missing":
            message = "is missing; `lab run` writes it."
        elif isinstance(cause, ValueError):
            message = f"{cause}."
        else:
            text = error["msg"]
            message = f"{text[:1].lower()}{text[1:]}, got {str(error.get('input'))[:60]!r}."
        raise ScenarioError(message, file=display, line=line, field=field,
                            hint=getattr(cause, "hint", None)) from None


def _script_head(data: bytes, name: str) -> ScriptHead:
    """The script's first lines decoded and split as Python does (a coding cookie is honoured,
    so `# coding: utf-7` cannot hide lines), with anything a terminal would act on made visible."""
    notes: list[str] = []
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        encoding = "utf-8"
        notes.append(f"Python will refuse it: {visible(str(exc), 120)}")
    if encoding not in ("utf-8", "utf-8-sig"):
        notes.append(f"it declares the source encoding {visible(encoding, 40)!r}; shown as Python decodes it")
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        text = data.decode("utf-8", "replace")
        notes.append(f"it is not valid {encoding}; undecodable bytes are shown as \ufffd")
    lines = _PY_LINE_END.split(text.removeprefix("\ufeff"))
    if lines and lines[-1] == "":
        lines.pop()
    head = tuple(visible(line) for line in lines[:SCRIPT_HEAD_LINES])
    return ScriptHead(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest(), encoding=encoding,
                      lines=head, more_lines=max(0, len(lines) - SCRIPT_HEAD_LINES), notes=tuple(notes))


def visible(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """`text` safe to print on a terminal: tabs as spaces, control, invisible and bidirectional
    characters as escapes (\\x1b, \\u202e), cut at `limit` characters with a count of the rest."""
    shown = _HIDDEN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text.expandtabs(4))
    if len(shown) > limit:
        shown = shown[:limit] + f" [... {len(shown) - limit} more characters]"
    return shown


def _bundled_dockerfile(unpacked: Unpacked, *, required: bool) -> bytes | None:
    if unpacked.entry("Dockerfile") is None:
        if required:
            raise ScenarioError("the bundle has no Dockerfile, so --bundled-dockerfile has nothing to build.",
                                file=str(unpacked.folder.name), field="Dockerfile",
                                hint="Replay without --bundled-dockerfile to build this lab's re-render.")
        return None
    return unpacked.read_checked("Dockerfile", MAX_DOCKERFILE_BYTES)


def _with_provenance(rendered: str, bundled: bytes | None) -> str:
    """The re-render, with the bundle's own "# Rendered by ... from <file>." comment in place of
    this lab's when that line is well-formed: it names the scenario file the original run used."""
    if bundled is None:
        return rendered
    theirs = next((line for line in bundled.decode("utf-8", "replace").split("\n")[:5]
                   if PROVENANCE.fullmatch(line)), None)
    ours = rendered.split("\n")
    if theirs is None:
        return rendered
    return "\n".join(theirs if PROVENANCE.fullmatch(line) else line for line in ours)


def _diff(bundled: bytes | None, rendered: str) -> tuple[tuple[str, ...], int]:
    """The unified diff from the bundled Dockerfile to the re-render, lines safe to show, and how
    many lines were cut. Compared byte for byte: no line-ending or Unicode trick hides a change."""
    if bundled is None or bundled == rendered.encode("utf-8"):
        return (), 0
    theirs = bundled.decode("utf-8", "replace").split("\n")
    lines = [visible(line.rstrip("\n")) for line in difflib.unified_diff(
        theirs, rendered.split("\n"), "bundle: Dockerfile", "this lab: Dockerfile (re-rendered)", lineterm="")]
    if not any(line.startswith(("+", "-")) and not line.startswith(("+++", "---")) for line in lines):
        lines.append("(the files differ in bytes that do not show: invalid UTF-8 or line endings)")
    return tuple(lines[:MAX_DIFF_LINES]), max(0, len(lines) - MAX_DIFF_LINES)


# --------------------------------------------------------------------------- execute


def execute_replay(plan: ReplayPlan, engine: Engine, host: HostPip, events: Events = no_events, *,
                   run_case: RunCase | None = None) -> ReplayOutcome:
    """Build what the plan says (see the module docstring), run it and compare with the bundle.
    `run_case` is the pipeline's (tests pass a fake)."""
    run_case = run_case or production_run_case

    # wheels only, resolved on this host, before anything is made: an unresolved requirement is
    # refused here (lab.image.wheelsonly), and the build is sealed (lab.image.builder)
    sealed = Sealed(rendered=plan.built is Built.RENDERED, source_builds=plan.allow_source_builds,
                    scenario_file=plan.display)
    planned = plan_build(plan.case, host, events, sealed=sealed)
    run_dir = report.new_run_dir(plan.runs_root, plan.case, suffix="replay")
    os.replace(plan.unpacked.folder, run_dir / REPLAYED)
    src = Unpacked(run_dir / REPLAYED, plan.manifest)
    scenario = plan.case.scenario.model_copy(update={"script": src.folder / "repro" / plan.script.name,
                                                     "source": src.folder / "scenario.yaml"})
    case = replace(plan.case, scenario=scenario)
    if plan.masked:
        events("replay", f"the bundle's author's secret values were removed: {', '.join(plan.masked)} are "
                         f"{MASK!r} in this replay")
    script = src.read_checked(f"repro/{plan.script.name}")
    if hashlib.sha256(script).hexdigest() != plan.script.sha256:
        raise ScenarioError("the script changed after it was shown.", file=str(src.folder / "repro"),
                            field="script", hint="Replay it again.")
    dockerfile = src.read_checked("Dockerfile", MAX_DOCKERFILE_BYTES) if plan.built is Built.BUNDLED \
        else plan.rendered.encode("utf-8")
    events("replay", "building the bundle's own Dockerfile (--bundled-dockerfile)" if plan.built is Built.BUNDLED
           else "building this lab's re-render of the bundled scenario")
    build = _swap(replace(planned, case=case), {"Dockerfile": dockerfile, f"repro/{plan.script.name}": script})
    diagnose = plan.original.graph_breaks is not None  # needed to compare graph-break counts
    outcome = run_case(case, engine, host, plan.runs_root, events, run_dir=run_dir, plan=build, diagnose=diagnose,
                       allow_network=plan.network)
    original = plan.original
    comparison = compare(original, outcome.result)
    _write(run_dir, plan, original, outcome.result, comparison)
    return ReplayOutcome(run_dir, original, outcome.result, comparison, plan.dockerfile_same, plan.built)


def _swap(build, contents: dict[str, bytes]):
    """The build plan with these context files' bytes: exactly what was shown and checked."""
    files = tuple(sorted([*(f for f in build.files if f.arcname not in contents),
                          *(ContextFile(name, data) for name, data in contents.items())], key=lambda f: f.arcname))
    return replace(build, dockerfile=contents["Dockerfile"].decode("utf-8", "replace"), files=files,
                   digest=context_digest(files))


def diff_text(plan: ReplayPlan) -> str:
    return "\n".join(plan.diff) + (f"\n[... {plan.diff_cut} more lines]" if plan.diff_cut else "")


def package_differences(original: RunResult, result: RunResult) -> list[str]:
    """`name: old → new` for each package whose version differs between the original run and its
    replay (both from their pip freeze); empty when they had the same, or when either recorded none."""
    old = original.deps.packages if original.deps else {}
    new = result.deps.packages if result.deps else {}
    if not old or not new:
        return []
    return [f"{name}: {old.get(name, 'absent')} → {new.get(name, 'absent')}"
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def _write(run_dir: Path, plan: ReplayPlan, original: RunResult, result: RunResult,
           comparison: Comparison) -> None:
    bundle = plan.bundle
    data = {"bundle": str(bundle), "same": comparison.same, "differences": [] if comparison.same else
            list(comparison.lines), "original": {"verdict": original.verdict.value, "case": original.case,
                                                  "started": original.started,
                                                  "lab_version": original.lab_version},
            "replay": {"verdict": result.verdict.value, "run_dir": result.run_dir},
            "dockerfile_built": plan.built.value,
            "source_builds_allowed": plan.allow_source_builds,
            "dockerfile_same_as_this_lab": plan.dockerfile_same,
            "dockerfile_diff": diff_text(plan) if plan.diff else None,
            "constrained_to": list(plan.case.constraints),
            "packages_differ": package_differences(original, result)}
    (run_dir / "replay.json").write_text(json.dumps(data, indent=2) + "\n")
    section = replay_section(plan, original, comparison, tuple(package_differences(original, result)))
    with (run_dir / "report.md").open("a", encoding="utf-8") as fh:
        fh.write(section)
    ignore = run_dir / ".dockerignore"
    if ignore.exists() and REPLAYED not in ignore.read_text().split():
        with ignore.open("a") as fh:
            fh.write(f"{REPLAYED}\n")


@dataclass(frozen=True)
class ReplaySection:
    """What the "Replay" section (lab/report/templates/replay.md.j2) is laid out from."""

    bundle: str
    original: str
    started: str
    same: bool
    differences: tuple[str, ...]
    built: str
    source_builds: bool
    diff: str
    constrained: int = 0              # versions from the original run's freeze that the replay was held to
    moved: tuple[str, ...] = ()       # `name: old → new` where the replay still got another version


def replay_section(plan: ReplayPlan, original: RunResult, comparison: Comparison,
                   moved: tuple[str, ...] = ()) -> str:
    """The section `lab replay` appends to report.md: the verdicts compared, what was built."""
    return render("replay.md.j2", ReplaySection(
        bundle=plan.bundle.name, original=original.verdict.value, started=str(original.started),
        same=comparison.same, differences=tuple(comparison.lines), built=_built_words(plan),
        source_builds=plan.allow_source_builds, diff=diff_text(plan) if plan.diff else "",
        constrained=len(plan.case.constraints), moved=moved)).rstrip("\n") + "\n"


def _built_words(plan: ReplayPlan) -> str:
    if plan.built is Built.BUNDLED:
        return "Built: the bundle's own Dockerfile (`--bundled-dockerfile`)."
    if plan.bundled is None:
        return "Built: this lab's re-render of the bundled scenario (the bundle has no Dockerfile)."
    return "Built: this lab's re-render of the bundled scenario" + \
        (" (the same as the bundled Dockerfile)." if plan.dockerfile_same else ", not the bundled Dockerfile.")
