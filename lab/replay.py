"""`lab replay BUNDLE`: check a bundle, rebuild its image from the bundled Dockerfile and context,
run it again, and compare the new verdict and evidence with the bundled ones.

A bundle comes from someone else, so nothing in it is trusted: the archive is unpacked by
`lab.bundle.open_bundle` (manifest, checksums, sizes, no links, nothing outside the target),
its scenario goes through the same validation as any scenario file, and the script runs as
confined as any other (no network unless the scenario asks and the user confirms).

What the replay takes from the bundle: the Dockerfile, the repro script and the lab's runner
(`repro/`, `tools/`), the scenario with its resolved case (torch, arch, backend, variables).
What it takes from the replaying host: the CA bundle, the pip settings, local wheels and the
cross-installed `site/` (host specifics that never travel in a bundle). A replay is itself a
run folder, `<runs>/<scenario>/<time>-torch<v>-<arch>-replay/`, with the unpacked bundle in
`replayed/` and the comparison in `replay.json` and at the end of report.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from . import report
from .bundle import Comparison, compare, inspect_bundle, open_bundle
from .engine import Engine
from .errors import ScenarioError
from .hostpip import HostPip
from .records import Events, no_events
from .render import ContextFile, context_digest, plan_build
from .resolve import Case, resolve
from .results import RESULT_NAME, RunResult, read_result
from .scenario import load_scenario, read_yaml
from .scrub import MASK

if TYPE_CHECKING:
    from .pipeline import RunCase

REPLAYED = "replayed"
_FROM_BUNDLE = ("repro/", "tools/")  # and the Dockerfile: the repro itself; the rest is this host's


@dataclass(frozen=True)
class ReplayOutcome:
    run_dir: Path
    original: RunResult
    result: RunResult
    comparison: Comparison
    dockerfile_same_as_this_lab: bool


def replay(bundle: Path, engine: Engine, host: HostPip, runs_root: Path, events: Events = no_events, *,
           allow_network: bool = False, run_case: RunCase | None = None) -> ReplayOutcome:
    if run_case is None:
        from .pipeline import run_case as production
        run_case = production

    manifest = inspect_bundle(bundle)
    events("replay", f"bundle of {manifest.case}: {manifest.verdict} "
                     f"({len(manifest.files)} files, made by lab {manifest.lab_version})")
    runs_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".replay-", dir=runs_root))
    try:
        src = open_bundle(bundle, scratch / "bundle")
        original = _original_result(src, bundle)
        run_dir = report.new_run_dir(runs_root, _case_from(src, bundle), suffix="replay")
        os.replace(src, run_dir / REPLAYED)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    src = run_dir / REPLAYED
    case = _case_from(src, bundle)  # again, from where the files now stay
    masked = sorted(k for k, v in case.run_env().items() if v == MASK)
    if masked:
        events("replay", f"the bundle's author's secret values were removed: {', '.join(masked)} are "
                         f"{MASK!r} in this replay")
    plan, dockerfile_same = _with_bundled_files(plan_build(case, host, events), src)
    events("replay", "rebuilding from the bundled Dockerfile" +
           ("" if dockerfile_same else " (it differs from what this lab version renders)"))
    diagnose = original.graph_breaks is not None  # needed to compare graph-break counts
    outcome = run_case(case, engine, host, runs_root, events, run_dir=run_dir, plan=plan, diagnose=diagnose,
                       allow_network=allow_network)
    comparison = compare(original, outcome.result)
    _write(run_dir, bundle, original, outcome.result, comparison, dockerfile_same)
    return ReplayOutcome(run_dir, original, outcome.result, comparison, dockerfile_same)


def _original_result(src: Path, bundle: Path) -> RunResult:
    data = read_result(src, where=f"{bundle}: {RESULT_NAME}")
    if not isinstance(data, RunResult):
        raise ScenarioError("the bundled run never reached a verdict (it was interrupted or failed), so there "
                            "is nothing to compare a replay with.", file=str(bundle), field="result.json")
    return data


def _case_from(src: Path, bundle: Path) -> Case:
    """The bundled scenario, validated like any scenario file, at its resolved torch/arch/backend."""
    path = src / "scenario.yaml"
    if not path.is_file():
        raise ScenarioError("the bundle has no scenario.yaml.", file=str(bundle), field="scenario.yaml")
    data, _ = read_yaml(path)
    resolved = data.pop("resolved", None)
    if not isinstance(resolved, dict):
        raise ScenarioError("the bundled scenario.yaml has no `resolved` block (torch, arch, backend).",
                            file=str(path), field="resolved")
    script = data.get("script")
    if not isinstance(script, str) or "/" in script or script in ("", ".", ".."):
        raise ScenarioError("the bundled scenario's `script` must be a file name inside repro/.",
                            file=str(path), field="script")
    data["script"] = f"repro/{script}"
    clean = src / "replay-scenario.yaml"
    clean.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    scenario = load_scenario(clean)

    def pick(key: str) -> str | None:
        value = resolved.get(key)
        if value is not None and not isinstance(value, str):
            raise ScenarioError(f"`resolved.{key}` must be a text.", file=str(path), field=f"resolved.{key}")
        return value

    return resolve(scenario, torch=pick("torch"), arch=pick("arch"), backend=pick("backend"), mode=pick("mode"))


def _with_bundled_files(plan, src: Path):
    """The plan with the bundle's Dockerfile, repro/ and tools/ in place of this lab's."""
    if not (src / "Dockerfile").is_file():
        raise ScenarioError("the bundle has no Dockerfile.", file=str(src), field="Dockerfile")
    bundled = [ContextFile(rel, path.read_bytes()) for path in sorted(src.rglob("*"))
               if path.is_file() and _from_bundle(rel := path.relative_to(src).as_posix())]
    kept = [f for f in plan.files if not _from_bundle(f.arcname)]
    files = tuple(sorted([*kept, *bundled], key=lambda f: f.arcname))
    dockerfile = (src / "Dockerfile").read_text(encoding="utf-8", errors="replace")
    same = _essential(dockerfile) == _essential(plan.dockerfile)
    return replace(plan, dockerfile=dockerfile, files=files, digest=context_digest(files)), same


def _from_bundle(arcname: str) -> bool:
    return arcname == "Dockerfile" or arcname.startswith(_FROM_BUNDLE)


def _essential(dockerfile: str) -> list[str]:
    """The Dockerfile's lines but the one naming the scenario file it was rendered from."""
    return [line for line in dockerfile.splitlines() if not line.startswith("# Rendered by")]


def _write(run_dir: Path, bundle: Path, original: RunResult, result: RunResult, comparison: Comparison,
           dockerfile_same: bool) -> None:
    data = {"bundle": str(bundle), "same": comparison.same, "differences": [] if comparison.same else
            list(comparison.lines), "original": {"verdict": original.verdict.value, "case": original.case,
                                                  "started": original.started,
                                                  "lab_version": original.lab_version},
            "replay": {"verdict": result.verdict.value, "run_dir": result.run_dir},
            "dockerfile_same_as_this_lab": dockerfile_same}
    (run_dir / "replay.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = ["", "## Replay", "", f"Replayed from `{bundle.name}` (original verdict "
             f"`{original.verdict.value}`, run {original.started}): **"
             + ("same verdict, same signature" if comparison.same else "different") + "**.", ""]
    if not comparison.same:
        lines += [f"- {line}" for line in comparison.lines] + [""]
    if not dockerfile_same:
        lines += ["The bundled Dockerfile differs from what this lab version renders; the bundled one was used.", ""]
    with (run_dir / "report.md").open("a", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    ignore = run_dir / ".dockerignore"
    if ignore.exists() and REPLAYED not in ignore.read_text().split():
        with ignore.open("a") as fh:
            fh.write(f"{REPLAYED}\nreplay-scenario.yaml\n")
