"""Two run folders side by side: what changed, most telling first (`lab compare A B`).

A run folder is read, never run: result.json (the verdict, through core.results), evidence.json and
stderr.txt (the exception and the frame in user code), diagnose/diagnostics.json (graph breaks),
out/ld/ (the shared libraries the loader really mapped, with who needed each), pip-freeze.txt,
scenario.yaml and collect_env.txt (environment), and the Dockerfile. A bisect folder stands for
its boundary pair (`last_old`, `first_new`). What a folder lacks (a probe runs no collect_env) is
said, never guessed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml

from lab.analyze.loader import parse_dir
from lab.analyze.tracebacks import extract_exceptions
from lab.core.errors import ResultError
from lab.core.results import (
    NOT_REPRODUCED,
    REPRODUCED,
    SKIP,
    BisectResult,
    Document,
    Record,
    RunResult,
    read_document,
    read_result,
)
from lab.image.layout import REPRO_DIR

_MAX_TEXT = 8 << 20          # bytes read of any one text file
_SCRIPT_DIR = REPRO_DIR + "/"  # the scenario's script in the image: frames there are user code
_DOCKERFILE_LINES = 80       # lines of Dockerfile diff kept


class CompareError(ResultError):
    """Two folders that cannot be compared: not runs, runs of different scenarios, a bisect folder
    without a boundary. Names the folder and what is wrong (exit 2)."""


# --- the document: `lab compare --json` ---------------------------------------------------------------
class RunSide(Record):
    run_dir: str
    case: str
    torch: str
    arch: str
    verdict: str
    git_version: str | None = None


class Signature(Record):
    """How a run failed: the final exception and the frame in the scenario's script it came through."""

    type: str
    message: str
    user_frame: str | None = None


class Change(Record):
    field: str
    a: str | None
    b: str | None


class Library(Record):
    name: str                 # the library without version or hash (libgomp, libtorch_cpu)
    path: str
    version: str | None = None
    needed_by: str | None = None


class LibraryChange(Record):
    name: str
    a: Library
    b: Library


class Libraries(Record):
    available: bool           # both folders had loader logs
    note: str | None = None
    added: tuple[Library, ...] = ()
    removed: tuple[Library, ...] = ()
    changed: tuple[LibraryChange, ...] = ()


class Packages(Record):
    available: bool
    note: str | None = None
    added: tuple[Change, ...] = ()
    removed: tuple[Change, ...] = ()
    changed: tuple[Change, ...] = ()


class GraphBreaks(Record):
    available: bool
    a: tuple[str, ...] = ()
    b: tuple[str, ...] = ()


class Comparison(Document):
    """`lab compare A B --json`: what differs between run A and run B."""

    kind: Literal["compare"] = "compare"
    scenario: str
    a: RunSide
    b: RunSide
    verdict: Change | None                 # None when both have the same verdict
    exception_a: Signature | None
    exception_b: Signature | None
    same_signature: bool
    graph_breaks: GraphBreaks
    libraries: Libraries
    packages: Packages
    environment: tuple[Change, ...]
    dockerfile: tuple[str, ...]            # a unified diff, cut at _DOCKERFILE_LINES lines
    summary: tuple[str, ...]               # the lines `lab compare` prints, most telling first


# --- reading the two sides --------------------------------------------------------------------------
def resolve_pair(a: Path, b: Path | None) -> tuple[Path, Path]:
    """The two run folders to compare: A and B, or a bisect folder's boundary pair when only A is
    given (or A and B name the same bisect folder)."""
    if b is None:
        return boundary_pair(a)
    return a, b


def boundary_pair(folder: Path) -> tuple[Path, Path]:
    """The run folders of a bisect folder's `last_old` and `first_new` probes."""
    bisect_json = folder / "bisect.json"
    if not bisect_json.is_file():
        raise CompareError(f"{folder}: is neither a bisect folder (no bisect.json) nor, alone, something to "
                           "compare.", hint="Pass two run folders (`lab compare A B`) or one bisect folder.")
    result = read_document(bisect_json, BisectResult)
    if not result.last_old or not result.first_new:
        raise CompareError(f"{bisect_json}: the bisection has no boundary (status {result.status}), so there "
                           "is no pair to compare.", hint="Compare two of its probe folders instead.")
    return probe_dir(folder, result, result.last_old), probe_dir(folder, result, result.first_new)


def probe_dir(folder: Path, result: BisectResult, version: str) -> Path:
    step = next((p for p in result.steps if p.version == version), None)
    here = folder / f"torch{version}"
    if step is not None and step.run_dir and not here.is_dir():
        return Path(step.run_dir)
    return here


def _finished(folder: Path) -> RunResult:
    if not folder.is_dir():
        raise CompareError(f"{folder}: there is no such folder.", hint="Pass folders that `lab run` or "
                           "`lab bisect` made.")
    result = read_result(folder)
    if not isinstance(result, RunResult):
        raise CompareError(f"{folder / 'result.json'}: the run stopped without a verdict "
                           f"({result.status}: {result.reason[:200]}), so there is nothing to compare.",
                           hint="Run it again, or compare another folder.")
    return result


def _text(path: Path) -> str | None:
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with path.open("rb") as fh:
            return fh.read(_MAX_TEXT).decode("utf-8", "replace")
    except OSError:
        return None


# --- the comparison ---------------------------------------------------------------------------------
def compare_runs(a_dir: Path, b_dir: Path) -> Comparison:
    """Compare two finished run folders of one scenario. Raises CompareError (or ResultError for a
    damaged result.json) with one paragraph naming the folder."""
    a, b = _finished(a_dir), _finished(b_dir)
    if a.scenario != b.scenario:
        raise CompareError(f"{a_dir} is a run of `{a.scenario}` and {b_dir} a run of `{b.scenario}`: runs "
                           "of different scenarios differ in everything, so the lab compares only runs of "
                           "one scenario.", hint="Pass two runs of the same scenario (for example a "
                           "bisection's boundary pair).")
    sig_a, sig_b = signature(a_dir, a), signature(b_dir, b)
    verdict = None if a.verdict == b.verdict else Change(field="verdict", a=a.verdict.value, b=b.verdict.value)
    same = _same(sig_a, sig_b)
    breaks = GraphBreaks(available=_has_breaks(a_dir) and _has_breaks(b_dir),
                         a=graph_breaks(a_dir, sig_a), b=graph_breaks(b_dir, sig_b))
    libs = compare_libraries(a_dir, b_dir)
    pkgs = compare_packages(a_dir, b_dir)
    env = tuple(compare_environment(a_dir, b_dir, a, b))
    dockerfile = dockerfile_diff(a_dir, b_dir)

    def side(r: RunResult, d: Path) -> RunSide:
        return RunSide(run_dir=str(d), case=r.case, torch=r.torch, arch=r.arch, verdict=r.verdict.value,
                       git_version=r.torch_build.git_version if r.torch_build else None)

    doc = Comparison(scenario=a.scenario, a=side(a, a_dir), b=side(b, b_dir), verdict=verdict,
                     exception_a=sig_a, exception_b=sig_b, same_signature=same, graph_breaks=breaks,
                     libraries=libs, packages=pkgs, environment=env, dockerfile=dockerfile, summary=())
    return doc.model_copy(update={"summary": tuple(summary_lines(doc))})


def signature(folder: Path, result: RunResult) -> Signature | None:
    """The run's final exception, with the innermost frame in the scenario's script (from stderr.txt)."""
    exc = result.evidence.exception
    if exc is None:
        return None
    frame = None
    stderr = _text(folder / "stderr.txt")
    if stderr:
        found = [e for e in extract_exceptions(stderr) if e.type == exc.type]
        if found:
            frame = user_frame(found[-1].frames)
    first = (exc.message.strip().splitlines() or [""])[0].strip()
    return Signature(type=exc.type, message=first[:500], user_frame=frame)


def user_frame(frames: Iterable[str]) -> str | None:
    """The innermost traceback frame in the scenario's own script (not torch, not Python)."""
    mine = [f for f in frames if _SCRIPT_DIR in f]
    if not mine:
        return None
    return " ".join(mine[-1].split())[:300]


def _same(a: Signature | None, b: Signature | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.type, a.message) == (b.type, b.message)


def _has_breaks(folder: Path) -> bool:
    return (folder / "diagnose" / "diagnostics.json").is_file()


def graph_breaks(folder: Path, sig: Signature | None) -> tuple[str, ...]:
    """Dynamo's graph breaks with their reasons: explain's (the diagnose step), else the break the
    run's own exception names (evidence.json)."""
    out: list[str] = []
    text = _text(folder / "diagnose" / "diagnostics.json")
    data = _json(text) if text else None
    explain = data.get("explain") if isinstance(data, dict) else None
    for fn in (explain or {}).get("functions") or []:
        for brk in (fn.get("breaks") or []) if isinstance(fn, dict) else []:
            if isinstance(brk, dict):
                where = f" ({brk['location']})" if brk.get("location") else ""
                out.append(" ".join(str(brk.get("reason", "")).split())[:300] + where)
    if not out:
        ev = _json(_text(folder / "evidence.json") or "")
        exc = ev.get("exception") if isinstance(ev, dict) else None
        gb = exc.get("graph_break") if isinstance(exc, dict) else None
        if isinstance(gb, dict) and gb.get("reason"):
            out.append(" ".join(str(gb["reason"]).split())[:300])
    return tuple(out)


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


# --- loaded shared libraries ------------------------------------------------------------------------
_SO = re.compile(r"^(?P<stem>.+?)\.so(?:\.(?P<version>[0-9][0-9.]*))?$")
_HASH = re.compile(r"-[0-9a-f]{8,}$")


def library_key(path: str) -> tuple[str, str | None]:
    """`/x/torch.libs/libgomp-f3febf51.so.1.0.0` -> ('libgomp', '1.0.0'); an Inductor kernel (a
    hashed .so under /tmp) -> ('inductor kernel', None)."""
    base = path.rsplit("/", 1)[-1]
    if (path.startswith("/tmp/") or "/torchinductor" in path) \
            and re.fullmatch(r"[0-9a-z_]{20,}(?:\.[0-9a-z_]+)*\.so", base):   # c<hash>.so, c<hash>.main.so
        return "inductor kernel", None
    m = _SO.match(base)
    if not m:
        return base, None
    return _HASH.sub("", m.group("stem")), m.group("version")


def loaded_libraries(folder: Path) -> dict[str, Library] | None:
    """Every shared library the loader mapped in any process of the run, by name; None without logs.
    A second file of the same name (the wheel's libgomp and the system's, say) is kept as
    `name (copy 2)`, so that a runtime loaded twice on one side shows in the comparison."""
    ld = folder / "out" / "ld"
    if not ld.is_dir() or not any(ld.iterdir()):
        return None
    found: dict[str, Library] = {}
    paths: dict[str, list[str]] = {}
    for _, proc in sorted(parse_dir(ld).items()):
        for obj in proc.objects:
            name, version = library_key(obj.path)
            seen = paths.setdefault(name, [])
            real = os.path.normpath(obj.path)
            if real in seen or (name == "inductor kernel" and seen):
                continue
            seen.append(real)
            key = name if len(seen) == 1 else f"{name} (copy {len(seen)})"
            needed = obj.needed_by.rsplit("/", 1)[-1] if obj.needed_by else None
            found[key] = Library(name=key, path=obj.path, version=version, needed_by=needed)
    return found


def compare_libraries(a_dir: Path, b_dir: Path) -> Libraries:
    a, b = loaded_libraries(a_dir), loaded_libraries(b_dir)
    if a is None or b is None:
        which = " and ".join(str(d) for d, libs in ((a_dir, a), (b_dir, b)) if libs is None)
        return Libraries(available=False, note=f"no loader log (out/ld/) in {which}")
    return Libraries(
        available=True,
        added=tuple(b[n] for n in sorted(set(b) - set(a))),
        removed=tuple(a[n] for n in sorted(set(a) - set(b))),
        changed=tuple(LibraryChange(name=n, a=a[n], b=b[n]) for n in sorted(set(a) & set(b))
                      if n != "inductor kernel"  # its file is named by a hash of the code: always new
                      and (_where(a[n].path), a[n].version) != (_where(b[n].path), b[n].version)))


def _where(path: str) -> str:
    """A library's place, as two runs are compared: under a site-packages folder, from there on. Each
    release on the local engine has a venv of its own (~/.cache/torch-repro-lab/venv/<key>/), so its
    folder is not a change; a library that moves into or out of site-packages, or to another file, is."""
    real = os.path.normpath(path)
    at = real.find("/site-packages/")
    return real[at:] if at >= 0 else real


# --- pip packages -----------------------------------------------------------------------------------
def freeze(folder: Path) -> dict[str, str] | None:
    """pip-freeze.txt as {name: version} (names normalised as PEP 503 does)."""
    text = _text(folder / "pip-freeze.txt")
    if text is None:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep:
            name, _, version = line.partition(" @ ")
        out[re.sub(r"[-_.]+", "-", name.strip()).lower()] = version.strip()
    return out


def compare_packages(a_dir: Path, b_dir: Path) -> Packages:
    a, b = freeze(a_dir), freeze(b_dir)
    if a is None or b is None:
        which = " and ".join(str(d) for d, f in ((a_dir, a), (b_dir, b)) if f is None)
        return Packages(available=False, note=f"no pip-freeze.txt in {which}")
    return Packages(
        available=True,
        added=tuple(Change(field=n, a=None, b=b[n]) for n in sorted(set(b) - set(a))),
        removed=tuple(Change(field=n, a=a[n], b=None) for n in sorted(set(a) - set(b))),
        changed=tuple(Change(field=n, a=a[n], b=b[n]) for n in sorted(set(a) & set(b)) if a[n] != b[n]))


# --- environment ------------------------------------------------------------------------------------
def environment(folder: Path, result: RunResult) -> dict[str, str]:
    """The facts of a run's environment: the case, the engine, the script's variables (scenario.yaml)
    and collect_env's `Key: value` lines."""
    facts = {"arch": result.arch, "emulated": str(result.emulated).lower(), "backend": str(result.backend),
             "mode": str(result.mode), "engine": result.engine.name, "engine version": result.engine.version}
    if result.torch_build is not None:
        facts["torch.version.git_version"] = str(result.torch_build.git_version)
        facts["torch.version.cuda"] = str(result.torch_build.cuda)
    data = _yaml(_text(folder / "scenario.yaml") or "")
    if isinstance(data, dict):
        for key, value in sorted((data.get("env") or {}).items()):
            facts[f"env {key}"] = str(value)
        resolved = data.get("resolved") or {}
        for key, value in sorted((resolved.get("vars") or {}).items()):
            facts[f"var {key}"] = str(value)
        base = resolved.get("base") or {}
        if isinstance(base, dict) and base.get("image_id"):
            facts["base image"] = str(base["image_id"])[:19]
    text = _text(folder / "collect_env.txt")
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith((" ", "[")) and len(key) < 60 and value.strip():
            facts.setdefault(f"collect_env {key.strip()}", value.strip()[:300])
    return facts


def _yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def compare_environment(a_dir: Path, b_dir: Path, a: RunResult, b: RunResult) -> Iterable[Change]:
    ea, eb = environment(a_dir, a), environment(b_dir, b)
    a_env, b_env = (d / "collect_env.txt" for d in (a_dir, b_dir))
    for key in list(dict.fromkeys([*ea, *eb])):
        if key.startswith("collect_env ") and not (a_env.is_file() and b_env.is_file()):
            continue  # one side never ran collect_env (a bisect probe): nothing to compare
        if ea.get(key) != eb.get(key):
            yield Change(field=key, a=ea.get(key), b=eb.get(key))


def dockerfile_diff(a_dir: Path, b_dir: Path) -> tuple[str, ...]:
    a, b = _text(a_dir / "Dockerfile"), _text(b_dir / "Dockerfile")
    if a is None or b is None:
        return ()
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"{a_dir.name}/Dockerfile",
                                      f"{b_dir.name}/Dockerfile", lineterm="", n=0))
    if len(lines) > _DOCKERFILE_LINES:
        lines = [*lines[:_DOCKERFILE_LINES], f"... {len(lines) - _DOCKERFILE_LINES} more lines"]
    return tuple(lines)


# --- words ------------------------------------------------------------------------------------------
def _sig_words(sig: Signature | None) -> str:
    if sig is None:
        return "no exception"
    text = f"{sig.type}: {sig.message}" if sig.message else sig.type
    return text + (f" [at {sig.user_frame}]" if sig.user_frame else "")


def _lib_words(lib: Library) -> str:
    return f"{lib.path}" + (f" (needed by {lib.needed_by})" if lib.needed_by else "")


def summary_lines(c: Comparison, most: int = 12) -> list[str]:
    """What `lab compare` prints: the differences that matter, most telling first."""
    a, b = c.a, c.b
    out = [f"A: {a.case} ({a.verdict})" + (f", torch commit {a.git_version[:12]}" if a.git_version else ""),
           f"B: {b.case} ({b.verdict})" + (f", torch commit {b.git_version[:12]}" if b.git_version else "")]
    if c.verdict:
        out.append(f"verdict: {c.verdict.a} → {c.verdict.b}")
    else:
        out.append(f"verdict: both {a.verdict}")
    if c.same_signature:
        out.append(f"exception: the same in both: {_sig_words(c.exception_a)}")
    else:
        out.append(f"exception: {_sig_words(c.exception_a)} → {_sig_words(c.exception_b)}")
    gb = c.graph_breaks
    if gb.a != gb.b:
        out.append(f"graph breaks: {len(gb.a)} → {len(gb.b)}")
        out += [f"  - A: {r}" for r in gb.a if r not in gb.b][:most]
        out += [f"  + B: {r}" for r in gb.b if r not in gb.a][:most]
    elif not gb.available and not gb.a:
        out.append("graph breaks: not collected (no diagnose step in "
                   + ("either run" if not gb.a else "one run") + ")")
    libs = c.libraries
    if not libs.available:
        out.append(f"loaded libraries: {libs.note}")
    elif libs.added or libs.removed or libs.changed:
        out.append(f"loaded libraries: {len(libs.added)} added, {len(libs.removed)} removed, "
                   f"{len(libs.changed)} changed")
        out += [f"  + {lib.name}: {_lib_words(lib)}" for lib in libs.added][:most]
        out += [f"  - {lib.name}: {_lib_words(lib)}" for lib in libs.removed][:most]
        out += [f"  ~ {ch.name}: {_lib_words(ch.a)} → {_lib_words(ch.b)}" for ch in libs.changed][:most]
    else:
        out.append("loaded libraries: the same")
    pk = c.packages
    if not pk.available:
        out.append(f"pip packages: {pk.note}")
    elif pk.added or pk.removed or pk.changed:
        out.append(f"pip packages: {len(pk.added)} added, {len(pk.removed)} removed, {len(pk.changed)} changed")
        out += [f"  ~ {ch.field} {ch.a} → {ch.b}" for ch in pk.changed][:most]
        out += [f"  + {ch.field} {ch.b}" for ch in pk.added][:most]
        out += [f"  - {ch.field} {ch.a}" for ch in pk.removed][:most]
    else:
        out.append("pip packages: the same")
    if c.environment:
        out.append(f"environment: {len(c.environment)} field(s) differ")
        out += [f"  ~ {ch.field}: {ch.a} → {ch.b}" for ch in c.environment][:most]
    else:
        out.append("environment: the same")
    if c.dockerfile:
        changed = [line for line in c.dockerfile if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        out.append(f"Dockerfile: {len(changed)} line(s) differ")
        out += [f"  {line}" for line in changed][:most]
    else:
        out.append("Dockerfile: the same")
    return out


# --- bisection helpers ------------------------------------------------------------------------------
_COUNTING = {"skip": SKIP, "reproduced": REPRODUCED, "not-reproduced": NOT_REPRODUCED,
             "not_reproduced": NOT_REPRODUCED}


def counting(value: str) -> str:
    """`--failed-differently` as a bisection outcome; bad input is a one-paragraph error."""
    try:
        return _COUNTING[value.strip().lower()]
    except KeyError:
        raise CompareError(f"--failed-differently: {value!r} is not one of skip, reproduced, not-reproduced.",
                           hint="skip (the default) never makes such a probe the boundary.") from None


def boundary_lines(result: BisectResult) -> list[str]:
    """What `lab bisect` prints after its result: the blame (dependencies or torch), the boundary pinned
    to source, the probes that failed differently, and the compare summary of the boundary pair."""
    out: list[str] = result.blame_lines()
    if result.source is not None:
        s = result.source
        out.append(f"commits: {s.last_old} = {s.last_old_commit or 'not recorded'}, "
                   f"{s.first_new} = {s.first_new_commit or 'not recorded'}")
        out.append(f"compare: {s.compare_url}")
        out.append(f"commit-level bisection on a PyTorch checkout: {s.git_bisect}")
    fd = [p for p in result.steps if p.verdict == "failed_differently"]
    if fd:
        how = "skipped" if result.failed_differently == SKIP else f"counted as {result.failed_differently}"
        out.append(f"failed differently ({how}): " + ", ".join(p.version for p in fd))
    if result.localization:
        out.append(f"localization: {result.localization}")
    if result.compare:
        out.append("what changed at the boundary (lab compare):")
        out += [f"  {line}" for line in result.compare]
    return out

