"""A Markdown comment to paste into a GitHub issue (`lab comment RUN_OR_BISECT_DIR`).

Modelled on cargo-bisect-rustc's final report: the one-line result first, the minimal
environment, the exact commands (with the lab, and with plain Docker), the compare link, and the
long parts (the script, `lab compare`'s summary, the localization) collapsed in `<details>`.
Everything goes through the bundles' scrubbing (lab.core.scrub.scrub_text): secret-named
variables of the host and of the scenario lose their values, URL credentials and the home folder
go. Nothing names the user's own paths (issue 33): a scenario is named by its name (or its file's
name), commands carry no `--out`, and a folder under the runs folder is named relative to it
(`relu-inject/20261125T110531Z-torch2.13.0+cpu-amd64-ablation/ablation.md`), by `relative_paths`.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab.compare.diff import CompareError, _text, boundary_pair, compare_runs
from lab.core.arch import with_emulated_env
from lab.core.results import BisectResult, LocalizeResult, RunResult, SourceBoundary, read_document, read_result
from lab.core.scrub import is_secret_name, scrub_text
from lab.history.index import root_of
from lab.report.writer import render
from lab.scenario.bases import DEFAULT_BASE


def render_comment(folder: Path) -> str:
    """The comment for a run folder or a bisect folder (bisect.json), scrubbed."""
    folder = Path(folder)
    if (folder / "bisect.json").is_file():
        text, scenario = _bisect_comment(folder)
    elif (folder / "result.json").is_file():
        text, scenario = _run_comment(folder)
    elif (folder / "localize.json").is_file():
        text, scenario = _localize_comment(folder), {}
    else:
        raise CompareError(f"{folder}: is neither a run folder (no result.json) nor a bisect folder (no "
                           "bisect.json).", hint="Pass a folder that `lab run` or `lab bisect` made.")
    env = {**os.environ, **_secrets(scenario)}
    return scrub_text(relative_paths(text, folder), env)


_LINK_TO_PATH = re.compile(r"\]\((/[^)\s]+)\)")  # a Markdown link to an absolute path


def relative_paths(text: str, folder: Path) -> str:
    """`text` without the absolute paths of the runs folder that holds `folder` (lab.history's
    root_of): what lies under it is named relative to it, the folder itself `the runs folder`; a
    Markdown link to another absolute path keeps its file's name only."""
    try:
        root = root_of(Path(folder))
    except (IndexError, OSError):  # a folder too near `/` to sit in a runs folder
        return _LINK_TO_PATH.sub(lambda m: f"]({Path(m.group(1)).name})", text)
    for path in sorted({str(root), os.path.realpath(root)}, key=len, reverse=True):
        path = path.rstrip("/")
        if len(path) < 2:
            continue
        text = re.sub(re.escape(path) + r"/+", "", text)
        text = re.sub(re.escape(path) + r"(?![\w.-])", "the runs folder", text)
    return _LINK_TO_PATH.sub(lambda m: f"]({Path(m.group(1)).name})", text)


def scenario_name(scenario: dict, fallback: str) -> str:
    """How a comment names a scenario: its name when it is a project's or shipped one, else its
    file's name (never the path, which is the user's)."""
    source = (scenario.get("resolved") or {}).get("source_file") or ""
    return fallback if "/scenarios/" in source or not source else Path(source).name


# --- what the template (lab/report/templates/comment.md.j2) is laid out from --------------------------
@dataclass(frozen=True)
class Block:
    """A collapsed part: `lang` names its fence; None puts the body in as Markdown."""

    summary: str
    body: str
    lang: str | None


@dataclass(frozen=True)
class EnvironmentView:
    torch: str
    commit: str | None
    backend: str
    platform: str
    how: str
    base: str
    docker: str
    env: tuple[str, ...]      # NAME=value, secrets masked
    facts: tuple[str, ...]    # "key: value" of collect_env
    local: str | None = None  # a run of the local engine: the host it ran on, in words (no base, no Docker)


@dataclass(frozen=True)
class CommandsView:
    lab: str
    platform: str
    base: str
    run_env: str
    local: bool = False       # the run was on the local engine: the Docker commands are another environment


@dataclass(frozen=True)
class Searched:
    count: int
    first: str
    last: str
    command: str
    probed: str


@dataclass(frozen=True)
class CommentView:
    headline: str
    title: tuple[str, str, str | None] | None = None     # scenario, title, upstream
    deps: tuple[str, str] | None = None                  # the fix, the blame's summary
    torch_alone: str | None = None                       # the blame's summary when torch alone flips it
    verdict: str = ""
    reason: str = ""
    different: tuple[str, str] | None = None             # expected, observed
    environment: EnvironmentView | None = None
    commands: CommandsView | None = None
    source: SourceBoundary | None = None
    searched: Searched | None = None
    failed: tuple[str, str] | None = None                # how they count, the probes in words
    localize: LocalizeResult | None = None
    blocks: tuple[Block, ...] = ()


def _render(view: CommentView) -> str:
    return render("comment.md.j2", view).rstrip() + "\n"


# --- a bisection ------------------------------------------------------------------------------------
def _bisect_comment(folder: Path) -> tuple[str, dict]:
    result = read_document(folder / "bisect.json", BisectResult)
    if result.last_old is None or result.first_new is None:
        raise CompareError(f"{folder / 'bisect.json'}: the bisection found no boundary (status {result.status}): "
                           f"{result.summary}", hint="A comment needs a bisection that found where the "
                           "verdict changes.")
    old_dir, new_dir = boundary_pair(folder)
    bad_dir = new_dir if result.to_verdict == "reproduced" else old_dir
    bad = _finished(bad_dir)
    scenario = _scenario(bad_dir)
    where = _where(bad)
    if result.direction == "regression":
        line = (f"Reproduced on torch {result.first_new}, {where}. Regression between {result.last_old} and "
                f"{result.first_new}.")
    else:
        line = (f"Reproduced on torch {result.last_old}, {where}. Fixed between {result.last_old} and "
                f"{result.first_new}.")
    if result.status == "ambiguous":
        line += f" (Ambiguous: {', '.join(result.skipped_between)} could not be run.)"
    deps = [b for b in result.blame if b.package != "torch"]
    command = shlex.join(["lab", "bisect", scenario_name(scenario, bad.scenario), "--from", result.from_version,
                          "--to", result.to_version, "--arch", bad.arch])
    failed = [p for p in result.steps if p.verdict == "failed_differently"]
    try:
        summary = compare_runs(old_dir, new_dir).summary
    except CompareError as exc:
        summary = (f"not compared: {exc}",)
    view = CommentView(
        headline=line,
        deps=(str(result.blame_fix), _capital(result.blame_summary or "")) if deps else None,
        torch_alone=(result.blame_summary or "").rstrip(": ") if result.blame and not deps else None,
        title=_title(scenario, bad), environment=_environment(bad, bad_dir, scenario),
        commands=_commands(bad, bad_dir, scenario), source=result.source,
        searched=Searched(len(result.candidates) or len(result.steps), result.from_version, result.to_version,
                          command, ", ".join(f"{p.version} ({p.verdict})" for p in result.steps)),
        failed=("skipped" if result.failed_differently == "skip" else f"counted as {result.failed_differently}",
                "; ".join(f"{p.version}: {p.different_failure.observed if p.different_failure else p.reason}"
                          for p in failed)) if failed else None,
        blocks=(Block(f"What changed between {result.last_old} and {result.first_new} (lab compare)",
                      "\n".join(summary), "text"), *_localization(result, folder), *_script(bad_dir, scenario)))
    return _render(view), scenario


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:] + ("." if text and not text.endswith(".") else "")


# --- one run ----------------------------------------------------------------------------------------
def _run_comment(folder: Path) -> tuple[str, dict]:
    result = _finished(folder)
    scenario = _scenario(folder)
    verdict = {"reproduced": "Reproduced", "not_reproduced": "Not reproduced",
               "failed_differently": "Failed differently", "error": "No verdict (error)",
               "timeout": "No verdict (timeout)"}[result.verdict.value]
    d = result.different_failure
    localization = (Block("Localization", _text(folder / "localize.md") or "", None),) \
        if (folder / "localize.json").is_file() else ()
    view = CommentView(
        headline=f"{verdict} on torch {result.torch}, {_where(result)}.", title=_title(scenario, result),
        verdict=result.verdict.value, reason=result.reason, different=(d.expected, d.observed) if d else None,
        environment=_environment(result, folder, scenario), commands=_commands(result, folder, scenario),
        blocks=(*localization, *_script(folder, scenario)))
    return _render(view), scenario


# --- a localization (`lab localize`) --------------------------------------------------------------
def _localize_comment(folder: Path) -> str:
    r = read_document(folder / "localize.json", LocalizeResult)
    log = _text(folder / r.bisector.log) if r.bisector.log else None
    blocks: tuple[Block, ...] = ()
    if log:
        lines = [ln for ln in log.splitlines() if ln.strip()]
        blocks = (Block("compiler_bisector's log", "\n".join(lines[-60:]), "text"),)
    return _render(CommentView(headline=f"Localized on torch {r.torch}, {r.arch}: {r.conclusion}.", localize=r,
                               blocks=blocks))


# --- pieces -----------------------------------------------------------------------------------------
def _finished(folder: Path) -> RunResult:
    result = read_result(folder)
    if not isinstance(result, RunResult):
        raise CompareError(f"{folder / 'result.json'}: the run stopped without a verdict ({result.status}), "
                           "so there is nothing to report.", hint="Run it again.")
    return result


def _scenario(folder: Path) -> dict:
    try:
        data = yaml.safe_load(_text(folder / "scenario.yaml") or "")
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _secrets(scenario: dict) -> dict[str, str]:
    found: dict[str, str] = {}
    for key in ("env", "vars"):
        block = scenario.get(key)
        if isinstance(block, dict):
            found.update({str(k): str(v) for k, v in block.items() if is_secret_name(str(k))})
    return found


def _masked(env: dict) -> dict[str, str]:
    """Secret-named variables with their values already masked (the scrubbing does it again)."""
    return {str(k): "***" if is_secret_name(str(k)) else str(v) for k, v in env.items()}


def _where(r: RunResult) -> str:
    return f"{r.arch} ({'emulated' if r.emulated else 'native'})"


def _title(scenario: dict, r: RunResult) -> tuple[str, str, str | None]:
    return r.scenario, str(scenario.get("title") or r.scenario), scenario.get("upstream") or None


def _environment(r: RunResult, folder: Path, scenario: dict) -> EnvironmentView:
    resolved = scenario.get("resolved") or {}
    return EnvironmentView(
        torch=r.torch, commit=r.torch_build.git_version if r.torch_build and r.torch_build.git_version else None,
        backend=r.backend or "as the script chooses", platform=resolved.get("platform") or r.arch,
        how=f"emulated with QEMU on {r.engine.host_arch}" if r.emulated else "native",
        base=str(scenario.get("base", "?")), docker=r.engine.version,
        env=tuple(f"{k}={v}" for k, v in sorted(_scenario_env(r, scenario).items())),
        facts=tuple(f"{k}: {v}" for k, v in _collect_env(folder)), local=_local_words(r))


def _local_words(r: RunResult) -> str | None:
    """Where a run of the local engine ran: this host, not the scenario's base, and not in Docker."""
    if r.engine.kind != "local" or r.local is None:
        return None
    python = f"Python {r.local.python}" + (" in a venv made by the lab" if r.local.python_env == "venv" else "")
    return (f"the local engine: the host the lab ran on ({r.local.os}, {r.local.libc}), no container, "
            f"{r.engine.version}; {python}")


_FACTS = ("PyTorch version", "OS", "GCC version", "Python version", "Is CUDA available", "CPU architecture")


def _collect_env(folder: Path) -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    for line in (_text(folder / "collect_env.txt") or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key in _FACTS and key not in found and value.strip():
            found[key] = value.strip()
    return [(k, found[k]) for k in _FACTS if k in found]


def _scenario_env(r: RunResult, scenario: dict) -> dict[str, str]:
    """The run's environment as the scenario gave it (secrets masked), with the emulated defaults."""
    resolved = scenario.get("resolved") or {}
    return _masked(with_emulated_env({**(scenario.get("env") or {}), **(resolved.get("vars") or {})}, r.emulated))


def _commands(r: RunResult, folder: Path, scenario: dict) -> CommandsView:
    resolved = scenario.get("resolved") or {}
    lab = ["lab", "run", scenario_name(scenario, r.scenario), "--torch", r.torch, "--arch", r.arch]
    local = r.engine.kind == "local"
    if local:
        lab += ["--engine", "local"]
    if r.backend:
        lab += ["--backend", r.backend]
    for key, value in sorted((resolved.get("vars") or {}).items()):
        lab += ["--set", f"{key}={value}"]
    platform = resolved.get("platform") or f"linux/{r.arch}"
    base = (resolved.get("base") or {}).get("ref") or scenario.get("base") or DEFAULT_BASE
    env = _scenario_env(r, scenario)
    if r.backend:
        env["LAB_BACKEND"] = r.backend
    run_env = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in sorted(env.items()))
    return CommandsView(shlex.join(lab), platform, base, run_env, local)


def _localization(result: BisectResult, folder: Path) -> tuple[Block, ...]:
    if not result.localization:
        return ()
    body = _text(Path(result.localize_dir) / "localize.md") if result.localize_dir else None
    if body is None:
        body = _text(folder / "localize" / "localize.md")
    return (Block("Localization: " + result.localization, body or result.localization, None),)


def _script(folder: Path, scenario: dict) -> tuple[Block, ...]:
    name = scenario.get("script")
    if not isinstance(name, str):
        return ()
    text = _text(folder / "repro" / name)
    if text is None:
        return ()
    return (Block(f"The script ({name})", text.rstrip(), "python"),)
