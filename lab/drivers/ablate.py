"""Backend ablation, the torch.compile FAQ's "Why is my code crashing?" ladder.

The same case runs under `eager` (Dynamo only), `aot_eager` (+ AOTAutograd), `inductor`
(+ TorchInductor) and, where the scenario allows it, inductor with mode="max-autotune".
The first rung where the bug reproduces names the layer it belongs to. The ladder is
pure logic (`conclude`); `run_ablation` only drives a `run_case` (pipeline.run_case) over one image.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from lab.core.records import Events, no_events
from lab.core.results import AblationResult, AblationStep, Verdict
from lab.image.resolve import Case, check_ablatable
from lab.pipeline import RunCase
from lab.pipeline import run_case as production
from lab.report.run_folder import new_run_dir
from lab.report.writer import render


@dataclass(frozen=True, slots=True)
class Rung:
    backend: str
    mode: str | None
    layer: str          # the layer this rung adds
    words: str          # the FAQ's words when the bug first appears on this rung

    @property
    def label(self) -> str:
        return self.backend + (f" (mode={self.mode})" if self.mode else "")


LADDER = (
    Rung("eager", None, "dynamo", "fails under `eager`: a TorchDynamo issue"),
    Rung("aot_eager", None, "aot_autograd", "passes `eager`, fails `aot_eager`: an AOTAutograd issue"),
    Rung("inductor", None, "inductor", "passes `aot_eager`, fails `inductor`: a TorchInductor issue"),
    Rung("inductor", "max-autotune", "inductor-max-autotune",
         'passes `inductor`, fails `inductor` with mode="max-autotune": a TorchInductor autotuning issue'),
)


@dataclass(frozen=True, slots=True)
class Step:
    rung: Rung
    verdict: Verdict
    run_dir: Path | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Conclusion:
    layer: str | None   # "dynamo" | "aot_autograd" | "inductor" | "inductor-max-autotune" | None
    words: str


@dataclass(frozen=True)
class AblationRun:
    folder: Path
    steps: tuple[Step, ...]
    conclusion: Conclusion
    result: AblationResult


def rungs(max_autotune: bool) -> tuple[Rung, ...]:
    return LADDER if max_autotune else LADDER[:3]


def conclude(steps: list[Step] | tuple[Step, ...]) -> Conclusion:
    """The first rung that reproduces names the layer; an error or timeout before it makes the
    ladder inconclusive, since that rung says nothing about the bug."""
    for step in steps:
        if step.verdict is Verdict.REPRODUCED:
            return Conclusion(step.rung.layer, step.rung.words)
        if step.verdict in (Verdict.ERROR, Verdict.TIMEOUT):
            return Conclusion(None, f"inconclusive: `{step.rung.label}` gave `{step.verdict.value}`"
                                    + (f" ({step.reason})" if step.reason else ""))
    tried = ", ".join(f"`{s.rung.label}`" for s in steps)
    return Conclusion(None, f"does not reproduce under any backend tried ({tried})")


def run_ablation(case: Case, engine, host, runs_root: Path, events: Events = no_events, *,
                 run_case: RunCase | None = None) -> AblationRun:
    """Run every rung in one image (the backend is chosen at run time), each in its own run folder.
    `run_case` runs one rung (default: lab.pipeline.run_case)."""
    if run_case is None:
        run_case = production

    check_ablatable(case.scenario)
    folder = new_run_dir(runs_root, case, suffix="ablation")
    steps: list[Step] = []
    for rung in rungs(case.scenario.ablation.max_autotune):
        events("ablate", f"{rung.label}")
        sub = folder / (rung.backend + (f"-{rung.mode}" if rung.mode else ""))
        sub.mkdir()
        outcome = run_case(replace(case, backend=rung.backend, mode=rung.mode), engine, host, runs_root,
                           events, run_dir=sub, diagnose=False)
        steps.append(Step(rung, outcome.judgement.verdict, sub, outcome.judgement.reason))
        events("ablate", f"{rung.label}: {outcome.judgement.verdict.value}")
    conclusion = conclude(steps)
    result = ablation_result(case, case.arch != engine.arch, folder, steps, conclusion)
    result.write(folder / "ablation.json")
    (folder / "ablation.md").write_text(ablation_markdown(case, steps, conclusion))
    return AblationRun(folder, tuple(steps), conclusion, result)


def ablation_result(case: Case, emulated: bool, folder: Path, steps: list[Step],
                    conclusion: Conclusion) -> AblationResult:
    """ablation.json, and `lab run --ablate --json`."""
    return AblationResult(
        scenario=case.scenario.name, torch=case.torch, arch=case.arch.value, emulated=emulated,
        run_dir=str(folder),
        ablation=tuple(AblationStep(backend=s.rung.backend, mode=s.rung.mode, verdict=s.verdict, reason=s.reason,
                                    run_dir=None if s.run_dir is None else str(s.run_dir)) for s in steps),
        layer=conclusion.layer, conclusion=conclusion.words)


@dataclass(frozen=True)
class AblationRow:
    backend: str
    mode: str
    verdict: str
    folder: str     # the rung's run folder, by its name (relative to ablation.md)


@dataclass(frozen=True)
class AblationView:
    """What ablation.md (lab/report/templates/ablation.md.j2) is laid out from."""

    title: str
    conclusion: str
    torch: str
    platform: str
    how: str
    steps: tuple[AblationRow, ...]


def ablation_markdown(case: Case, steps: list[Step], conclusion: Conclusion) -> str:
    how = "the lab overrides torch.compile" if case.scenario.ablation.via == "hook" else "LAB_BACKEND/LAB_MODE"
    return render("ablation.md.j2", AblationView(
        title=case.scenario.title or case.scenario.name, conclusion=conclusion.words, torch=case.torch,
        platform=case.arch.platform, how=how,
        steps=tuple(AblationRow(s.rung.backend, s.rung.mode or "", s.verdict.value, s.run_dir.name if s.run_dir else "")
                    for s in steps)))
