"""Localizing a compile bug on one release: which layer, and which Inductor subsystem or pass.

Two steps, both on the release's own image:

1. the backend ablation (lab.drivers.ablate, `lab run --ablate`): eager, aot_eager, inductor; the
   first rung that reproduces names the layer;
2. where the release ships `torch._inductor.compiler_bisector` with its `run` command, the bisector
   runs in the same image, confined like any run: it walks eager -> aot_eager ->
   aot_eager_decomp_partition -> inductor, then disables and bisects Inductor's subsystems (passes,
   lowerings) until it names the one responsible. It calls the scenario's script once per step
   with `TORCH_COMPILE_BACKEND` set, which the lab hands on as `LAB_BACKEND`; a step is bad when
   the script exits non-zero. Where the release lacks the module or its `run` command, the result
   says so.

`localize.json` and `localize.md` go into the folder given (a bisect folder's `localize/`, or a
run folder of its own).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from lab.analyze.evidence import read_text
from lab.analyze.tracebacks import extract_exceptions
from lab.core.records import Events, no_events
from lab.core.results import BisectorResult, LocalizeResult
from lab.drivers.ablate import run_ablation
from lab.image import era
from lab.image.casekey import content_key
from lab.image.resolve import Case
from lab.pipeline import RunCase, _command, plan_for, read_torch_file, run_limits
from lab.report.writer import render

BISECTOR_MODULE = "torch/_inductor/compiler_bisector.py"
_COMPILE_TYPES = ("torch._dynamo.", "torch._inductor.", "torch._functorch.", "torch._export.")
_COMPILE_FRAMES = ("/torch/_dynamo/", "/torch/_inductor/", "/torch/_functorch/")
_RESULT = re.compile(r"Bisection complete: (BisectionResult\((?P<fields>.*)\)|(?P<none>no issue found))")
_FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|None|-?\d+)")


def is_compile_failure(run_dir: Path) -> bool:
    """Whether a run's exception came from (or through) Dynamo, AOTAutograd or Inductor (stderr.txt)."""
    try:
        text = (run_dir / "stderr.txt").read_text(errors="replace")
    except OSError:
        return False
    return any(exc.type.startswith(_COMPILE_TYPES) or exc.graph_break is not None
               or any(part in frame for frame in exc.frames for part in _COMPILE_FRAMES)
               for exc in extract_exceptions(text))


def parse_bisector_output(text: str) -> dict[str, object] | None:
    """`Bisection complete: BisectionResult(backend='inductor', subsystem='lowerings', ...)` as a dict;
    {} for `no issue found`; None when the output has no final line."""
    found = None
    for m in _RESULT.finditer(text):
        found = m
    if found is None:
        return None
    if found.group("none"):
        return {}
    fields: dict[str, object] = {}
    for key, raw in _FIELD.findall(found.group("fields")):
        if raw == "None":
            fields[key] = None
        elif raw[0] in "'\"":
            fields[key] = raw[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")
        else:
            fields[key] = int(raw)
    return fields


def bisector_words(fields: dict[str, object] | None, exit_code: int | None) -> str:
    if fields is None:
        return f"compiler_bisector gave no result (exit code {exit_code}); see its log"
    if not fields:
        return "compiler_bisector found no backend that fails: the script passed on every backend it tried"
    backend, subsystem, number = fields.get("backend"), fields.get("subsystem"), fields.get("bisect_number")
    if not subsystem:
        return f"compiler_bisector: the issue is in the `{backend}` backend (no single subsystem identified)"
    text = f"compiler_bisector: the issue is in `{backend}`, subsystem `{subsystem}`"
    if isinstance(number, int) and number > 0:
        text += f" (its application number {number})"
    if fields.get("debug_info") and fields.get("debug_info") != subsystem:
        text += f": {fields['debug_info']}"
    return text


def bisector_command(case: Case) -> list[str]:
    """The scenario's script under `python -m torch._inductor.compiler_bisector run`, with the backend
    the bisector tests handed on as LAB_BACKEND (what `ablation: via env` scripts and the lab's runner
    read)."""
    script = _command(case, through_runner=case.scenario.ablation.via == "hook")
    shim = 'LAB_BACKEND="${TORCH_COMPILE_BACKEND:-inductor}" exec "$@"'
    return ["python", "-m", "torch._inductor.compiler_bisector", "run", "sh", "-c", shim, "sh", *script]


def run_bisector(case: Case, engine, tag: str, folder: Path, events: Events = no_events,
                 source: str | None = None) -> BisectorResult:
    """Run compiler_bisector in the image `tag`; `source` is the module's text read from the image
    (None: the release does not ship it)."""
    if source is None:
        return BisectorResult(available=False, ran=False,
                              words=f"torch {case.torch} does not ship torch._inductor.compiler_bisector, so "
                                    "the subsystem was not bisected")
    if '"run"' not in source:
        return BisectorResult(available=False, ran=False,
                              words=f"torch {case.torch} ships torch._inductor.compiler_bisector without its "
                                    "`run` command, so the subsystem was not bisected")
    if case.scenario.ablation.via == "none":
        return BisectorResult(available=True, ran=False,
                              words="not run: the scenario fixes its backend (ablation: via none), so the "
                                    "bisector cannot choose one")
    env = replace(case, backend=None, mode=None).run_env()
    if case.scenario.ablation.via == "hook":
        env["LAB_COMPILE_HOOK"] = "1"
    command = bisector_command(case)
    out = folder / "compiler_bisector"
    out.mkdir(parents=True, exist_ok=True)
    events("localize", f"compiler_bisector: {shlex.join(command)}")
    raw = engine.run(tag, command, env, out_dir=out / "out", logs_dir=out, arch=case.arch,
                     timeout=case.scenario.timeout * 5,
                     labels={"org.torch-repro-lab.case": case.name, "org.torch-repro-lab.step": "localize"},
                     events=events, limits=run_limits(case))
    text = read_text(raw.stdout_path)
    fields = parse_bisector_output(text)
    words = bisector_words(fields, raw.exit_code)
    if raw.timed_out:
        words = f"compiler_bisector timed out after {case.scenario.timeout * 5} s; see its log"
    fields = fields or {}
    number = fields.get("bisect_number")
    return BisectorResult(available=True, ran=True, words=words,
                          backend=_str(fields.get("backend")), subsystem=_str(fields.get("subsystem")),
                          bisect_number=number if isinstance(number, int) else None,
                          debug_info=_str(fields.get("debug_info")), exit_code=raw.exit_code,
                          log="compiler_bisector/stdout.txt")


def _str(value: object) -> str | None:
    return value[:500] if isinstance(value, str) else None


def localize(case: Case, engine, host, runs_root: Path, folder: Path, events: Events = no_events, *,
             run_case: RunCase | None = None,
             read_source: Callable[[str], str | None] | None = None) -> LocalizeResult:
    """The ablation, then compiler_bisector, on the image of `case`; writes localize.json and
    localize.md into `folder`. A scheduler's engine (Slurm) runs all of it as one job on its partition,
    as it runs a probe, and hands back the result its node wrote."""
    if getattr(type(engine), "localize_elsewhere", None) is not None:  # (lab.engine.slurm.SlurmEngine)
        return engine.localize_elsewhere(case, host, runs_root, folder, events)
    folder.mkdir(parents=True, exist_ok=True)
    key = content_key(case).digest
    case = replace(case, backend=None, mode=None)
    if case.scenario.ablation.via == "none":
        layer, ablation, ablation_dir = None, "not ablated: the scenario fixes its backend (ablation: via none)", None
    else:
        events("localize", f"backend ablation of torch {case.torch}")
        ablated = run_ablation(case, engine, host, runs_root, events, run_case=run_case)
        layer, ablation, ablation_dir = ablated.conclusion.layer, ablated.conclusion.words, str(ablated.folder)
    if not engine.keeps_images:
        # the local engine runs the script in a venv, not an image that compiler_bisector can be
        # started in; the ablation above ran there, the bisector is for a Docker engine
        bisector = BisectorResult(available=False, ran=False,
                                  words="compiler_bisector was not run: it runs in the case's image, and the "
                                        f"local engine has none (`lab localize {case.scenario.name} --torch "
                                        f"{case.torch}` on a Docker engine runs it)")
    else:
        plan = plan_for(era.apply(case, host)[0], engine, host, events)  # the dependencies the ablation's runs had
        image = engine.prepare(case, plan, host, folder, events)  # the ablation's image, cached
        reader = read_source or (lambda rel: _decoded(read_torch_file(engine, image.ref, case, rel)))
        bisector = run_bisector(case, engine, image.ref, folder, events, reader(BISECTOR_MODULE))
    conclusion = "; ".join(filter(None, [f"layer: {layer}" if layer else ablation, bisector.words]))
    result = LocalizeResult(scenario=case.scenario.name, torch=case.torch, arch=case.arch.value, layer=layer,
                            ablation=ablation, ablation_dir=ablation_dir, bisector=bisector, conclusion=conclusion,
                            key=key)
    result.write(folder / "localize.json")
    (folder / "localize.md").write_text(localize_markdown(result, folder), encoding="utf-8")
    return result


def _decoded(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


@dataclass(frozen=True)
class LocalizeView:
    """What localize.md (lab/report/templates/localize.md.j2) is laid out from."""

    result: LocalizeResult
    ablation_link: str | None


def localize_markdown(r: LocalizeResult, folder: Path | None = None) -> str:
    """localize.md. It may be pasted into an issue (`lab comment`), so its link to the ablation
    names it relative to `folder`, where the file lies (by the ablation folder's name without one),
    never by the user's absolute path."""
    ablation = None
    if r.ablation_dir:
        ablation = (os.path.relpath(Path(r.ablation_dir), folder) if folder is not None
                    else Path(r.ablation_dir).name) + "/ablation.md"
    return render("localize.md.j2", LocalizeView(r, ablation))
