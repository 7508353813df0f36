"""The FAQ's ablation ladder as pure logic (which layer a bug belongs to), and run_ablation with a fake runner."""

import json

import pytest

from lab.analyze.judge import Verdict
from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.core.results import AblationResult, Judgement, read_result
from lab.drivers.ablate import LADDER, Step, conclude, run_ablation, rungs
from lab.image.hostpip import HostPip
from lab.image.resolve import check_ablatable, resolve
from lab.pipeline import RunOutcome
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS, fake_result, tiny_scenario

R, N, E, T = Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.ERROR, Verdict.TIMEOUT


def steps(*verdicts):
    return [Step(rung, v) for rung, v in zip(LADDER, verdicts, strict=False)]


@pytest.mark.parametrize("verdicts, layer, words", [
    ((R, R, R), "dynamo", "fails under `eager`: a TorchDynamo issue"),
    ((N, R, R), "aot_autograd", "passes `eager`, fails `aot_eager`: an AOTAutograd issue"),
    ((N, N, R), "inductor", "passes `aot_eager`, fails `inductor`: a TorchInductor issue"),
    ((N, N, N, R), "inductor-max-autotune", 'fails `inductor` with mode="max-autotune"'),
    ((N, N, N), None, "does not reproduce under any backend tried (`eager`, `aot_eager`, `inductor`)"),
])
def test_the_first_failing_rung_names_the_layer(verdicts, layer, words):
    c = conclude(steps(*verdicts))
    assert c.layer == layer
    assert words in c.words


@pytest.mark.parametrize("bad", [E, T])
def test_an_infrastructure_failure_before_the_bug_is_inconclusive(bad):
    c = conclude(steps(N, bad, R))
    assert c.layer is None and c.words.startswith("inconclusive: `aot_eager` gave")


def test_an_error_after_the_first_reproduction_does_not_matter():
    assert conclude(steps(R, E, T)).layer == "dynamo"


def test_max_autotune_only_where_the_scenario_allows_it():
    assert [r.label for r in rungs(False)] == ["eager", "aot_eager", "inductor"]
    assert rungs(True)[-1].label == "inductor (mode=max-autotune)"


def test_scripts_that_hard_code_the_backend_are_not_ablatable(tmp_path):
    s = tiny_scenario(tmp_path, 'name: h\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
                                'expect: {exit_code: 1}\nablation: {via: none}\n')
    with pytest.raises(ScenarioError, match="hard-codes"):
        check_ablatable(s)
    with pytest.raises(ScenarioError, match="ablation.via"):
        resolve(s, backend="eager")


def test_hook_scenarios_run_through_the_runner_with_the_backend_set(tmp_path):
    s = tiny_scenario(tmp_path, 'name: h\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
                                'expect: {exit_code: 1}\nablation: {via: hook}\n')
    case = resolve(s, backend="inductor", mode="max-autotune")
    env = case.run_env()
    assert case.hooked and env["LAB_COMPILE_HOOK"] == "1"
    assert env["LAB_BACKEND"] == "inductor" and env["LAB_MODE"] == "max-autotune"
    assert not resolve(load_scenario("dlpack-cpu", SCENARIOS), backend="eager").hooked


def test_mode_needs_inductor():
    with pytest.raises(ScenarioError, match="--mode"):
        resolve(load_scenario("dlpack-cpu", SCENARIOS), backend="eager", mode="max-autotune")


class FakeRungs:
    """Stands in for pipeline.run_case: the bug shows from aot_eager on."""

    def __init__(self) -> None:
        self.ran: list[tuple[str | None, str | None]] = []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose):
        assert diagnose is False
        self.ran.append((case.backend, case.mode))
        result = fake_result(case, "not_reproduced" if case.backend == "eager" else "reproduced", run_dir)
        result.write(run_dir / "result.json")
        return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


class AmdEngine:
    arch = Arch.AMD64


def ablate_with_fakes(tmp_path):
    case = resolve(tiny_scenario(tmp_path, 'name: a\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
                                           'expect: {exit_code: 1}\nablation: {max_autotune: true}\n'))
    fake = FakeRungs()
    return run_ablation(case, AmdEngine(), HostPip(), tmp_path / "runs", run_case=fake), fake


def test_run_ablation_runs_every_rung_and_writes_its_result(tmp_path):
    ablation, fake = ablate_with_fakes(tmp_path)
    assert fake.ran == [("eager", None), ("aot_eager", None), ("inductor", None), ("inductor", "max-autotune")]
    assert ablation.conclusion.layer == "aot_autograd"
    assert [s.verdict for s in ablation.steps] == [Verdict.NOT_REPRODUCED] + [Verdict.REPRODUCED] * 3
    written = AblationResult.model_validate_json((ablation.folder / "ablation.json").read_text())
    assert written == ablation.result and not written.emulated and written.layer == "aot_autograd"
    data = json.loads((ablation.folder / "ablation.json").read_text())
    assert {"scenario", "torch", "arch", "emulated", "run_dir", "ablation", "layer", "conclusion"} <= set(data)
    assert "passes `eager`, fails `aot_eager`" in (ablation.folder / "ablation.md").read_text()
    for step in ablation.steps:
        assert read_result(step.run_dir).verdict == step.verdict
