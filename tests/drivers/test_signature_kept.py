"""A scenario that expects only an exit code: the first failing probe of a bisection (or run of a
matrix) records its failure signature in the bisection's own folder (signature.json) or matrix.json,
and later runs must match it, as PyTorch's minifier does with `check_str`. Fake runners (logic only)."""

from __future__ import annotations

from lab.core.results import BisectResult, FailureSignature, Judgement, Verdict
from lab.drivers import bisect_run
from lab.drivers.matrix import expand, matrix_result, run_matrix
from lab.image.casekey import content_key
from lab.image.hostpip import HostPip
from lab.pipeline import RunOutcome
from tests.conftest import fake_result, tiny_scenario
from tests.drivers.test_bisect_run import VERSIONS, FakeEngine, releases

BODY = "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\nexpect:\n  exit_code: 1\n"
ASSERT = FailureSignature(exception="AssertionError", frame="torch/testing/_comparison.py in assert_close")
NAME = FailureSignature(exception="NameError")


class SignedRuns:
    """pipeline.run_case's stand-in: (verdict, signature) per version."""

    def __init__(self, answers) -> None:
        self.answers, self.ran = answers, []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose, collect_env):
        self.ran.append(case.torch)
        verdict, signature = self.answers[case.torch]
        key = content_key(case)  # as lab.pipeline records it
        result = fake_result(case, verdict, run_dir, signature=signature, content_key=key.digest,
                             content_parts=dict(key.parts))
        result.write(run_dir / "result.json")
        return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


def test_later_probes_must_fail_like_the_first(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    answers = {"2.3.0": ("reproduced", ASSERT), "2.3.1": ("reproduced", ASSERT), "2.4.0": ("reproduced", NAME),
               "2.4.1": ("not_reproduced", None), "2.5.0": ("not_reproduced", None)}

    def go():
        fake = SignedRuns(answers)
        return bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0"),
                                     engine=FakeEngine(), host=HostPip(),
                                     runs_root=tmp_path / "runs", run_case=fake, candidates=releases), fake

    run, fake = go()
    assert fake.ran[:3] == ["2.3.0", "2.5.0", "2.4.0"]
    steps = {p.version: p for p in run.result.steps}
    odd = steps["2.4.0"]
    assert (odd.verdict, odd.outcome) == ("failed_differently", "skip")  # never a boundary
    assert "NameError (no torch frame), not the failure torch 2.3.0 recorded" in odd.reason
    assert odd.different_failure.expected.endswith("(recorded from torch 2.3.0)")
    assert run.result.status == "ambiguous" and run.result.skipped_between == ("2.4.0",)
    assert (run.result.signature, run.result.signature_from) == (ASSERT, "2.3.0")
    kept = (run.folder / "signature.json").read_text()
    assert '"torch": "2.3.0"' in kept and "torch/testing/_comparison.py in assert_close" in kept
    assert any("held to the failure torch 2.3.0 recorded first" in n for n in run.result.notes)
    assert "signature.json" in (run.folder / "bisect.md").read_text()
    # resumed from its folders: the same signature, the same answer, nothing run again
    again, fake2 = go()
    assert fake2.ran == [] and again.result.to_json() == run.result.to_json()
    assert BisectResult.model_validate_json((run.folder / "bisect.json").read_text()).signature == ASSERT


def test_an_edited_scenario_records_its_signature_again(tmp_path):
    """signature.json belongs to the scenario it was recorded from: after an edit of the script the
    probes run again (their content key changed), and so is the signature recorded again, never the
    old script's held against the new one's failures."""
    scenario = tiny_scenario(tmp_path, BODY)
    answers = {"2.3.0": ("reproduced", ASSERT), "2.3.1": ("reproduced", ASSERT), "2.4.0": ("reproduced", ASSERT),
               "2.4.1": ("not_reproduced", None), "2.5.0": ("not_reproduced", None)}
    notes = []

    def go(scenario):
        fake = SignedRuns(answers)
        return bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0"),
                                     engine=FakeEngine(), host=HostPip(),
                                     runs_root=tmp_path / "runs", run_case=fake, candidates=releases,
                                     events=lambda stage, msg: notes.append(msg)), fake

    first, _ = go(scenario)
    assert first.result.signature == ASSERT
    (tmp_path / "s.py").write_text("raise SystemExit(1)\n")
    answers.update({v: ("reproduced", NAME) for v in ("2.3.0", "2.3.1", "2.4.0")})
    second, fake = go(scenario)  # the same file, its script edited
    assert "2.3.0" in fake.ran and any("signature.json was recorded from another version" in n for n in notes)
    assert (second.result.signature, second.result.signature_from) == (NAME, "2.3.0")
    assert second.result.first_new == "2.4.1" and not any(p.verdict == "failed_differently"
                                                         for p in second.result.steps)


def test_a_scenario_with_a_real_expectation_keeps_no_signature(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY.replace("exit_code: 1", "traceback_contains: Boom"))
    answers = {v: ("reproduced", NAME if v == "2.4.0" else ASSERT) for v in VERSIONS}
    fake = SignedRuns(answers)
    run = bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0"),
                                engine=FakeEngine(), host=HostPip(),
                                runs_root=tmp_path / "runs", run_case=fake, candidates=releases)
    assert run.result.signature is None and not (run.folder / "signature.json").exists()


def test_matrix_runs_are_held_to_the_first_failure(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY.replace("torch: '2.3.0'", "torch: ['2.3.0', '2.4.0', '2.5.0']"))
    answers = {"2.3.0": ("reproduced", ASSERT), "2.4.0": ("reproduced", NAME), "2.5.0": ("not_reproduced", None)}

    def run_one(case, i):
        verdict, signature = answers[case.torch]
        return fake_result(case, verdict, tmp_path / case.torch, signature=signature)

    cells = run_matrix(expand(scenario), run_one)
    assert [c.verdict for c in cells] == ["reproduced", "failed_differently", "not_reproduced"]
    assert cells[1].results[0].verdict is Verdict.FAILED_DIFFERENTLY
    result = matrix_result(scenario, cells)
    assert result.signature == ASSERT and result.signature_from == "b[torch=2.3.0,arch=arm64]"
