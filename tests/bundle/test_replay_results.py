"""lab.replay with a fake runner: the bundled result is read through the model (lab 0.1.0's layout
included), compared with the replay's, and a bundle whose result this lab cannot read is refused
before anything is built. tests/test_e2e_bundle.py replays real bundles on the real engine."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from lab.bundle.archive import write_bundle
from lab.bundle.replay import discard_replay, execute_replay, prepare_replay
from lab.core.arch import Arch
from lab.core.errors import ResultError, ScenarioError
from lab.core.results import Judgement, RunResult, read_result
from lab.image.hostpip import HostPip
from lab.pipeline import RunOutcome
from tests.bundle.test_bundle import craft_bundle, good_manifest
from tests.conftest import fake_result
from tests.core.test_results import REAL_RUN, good

CREATED = datetime(2026, 11, 22, 12, 30, tzinfo=timezone.utc)


class FakeRun:
    """Stands in for pipeline.run_case: answers with the original's evidence, or a different verdict."""

    def __init__(self, original: RunResult, verdict: str | None = None) -> None:
        self.original, self.verdict, self.calls = original, verdict, []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, plan, diagnose, allow_network):
        self.calls.append((case.name, plan.dockerfile, diagnose, allow_network))
        result = fake_result(case, self.verdict or self.original.verdict.value, run_dir,
                             evidence=self.original.evidence, exit_code=self.original.exit_code)
        result.write(run_dir / "result.json")
        return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


def replay(bundle, engine, host, runs_root, run_case):
    """prepare, then execute with a fake runner, as `lab replay --yes` does. Without uv here nothing
    resolves to wheels on the host, so this replays with --allow-source-builds (the fake runner
    builds nothing; tests/bundle/test_wheels_only.py tests the refusal)."""
    plan = prepare_replay(bundle, runs_root, Arch.AMD64, allow_source_builds=True)
    try:
        return execute_replay(plan, engine, host, run_case=run_case), plan
    finally:
        discard_replay(plan)


@pytest.fixture(autouse=True)
def no_cross_install(monkeypatch):
    monkeypatch.setenv("LAB_CROSS_INSTALL", "0")  # plan_build without uv or an index


def test_a_bundle_of_lab_0_1_replays_and_compares(tmp_path):
    bundle = write_bundle(REAL_RUN, tmp_path / "b.tar.gz", env={}, created=CREATED).path
    original = read_result(REAL_RUN)
    fake = FakeRun(original)
    outcome, plan = replay(bundle, engine=None, host=HostPip(), runs_root=tmp_path / "runs", run_case=fake)
    ((case, dockerfile, diagnose, network),) = fake.calls
    assert case == "libgomp-aarch64[torch=2.5.1,arch=arm64]" and not diagnose and not network
    assert dockerfile == plan.rendered  # this lab's re-render of the bundled scenario, not the bundle's own
    assert outcome.original == original and outcome.comparison.same
    data = json.loads((outcome.run_dir / "replay.json").read_text())
    assert data["same"] is True and data["original"]["verdict"] == "reproduced"
    assert data["replay"]["run_dir"] == str(outcome.run_dir)

    different, _ = replay(bundle, engine=None, host=HostPip(), runs_root=tmp_path / "runs",
                          run_case=FakeRun(original, "not_reproduced"))
    assert not different.comparison.same
    assert different.comparison.lines == ("verdict: reproduced → not_reproduced",)


def bundle_with(tmp_path, result: bytes):
    files = {"result.json": result, "report.md": b"# r\n"}
    return craft_bundle(tmp_path / "b.tar.gz", good_manifest(files), files)


def test_a_newer_result_in_a_bundle_is_refused_before_anything_runs(tmp_path):
    bundle = bundle_with(tmp_path, json.dumps({**good(), "schema_version": 3}).encode())
    fake = FakeRun(read_result(REAL_RUN))
    with pytest.raises(ResultError) as info:
        replay(bundle, engine=None, host=HostPip(), runs_root=tmp_path / "runs", run_case=fake)
    assert str(info.value).startswith(f"{bundle}: result.json: was written by a newer torch-repro-lab")
    assert fake.calls == [] and not (tmp_path / "runs").exists()  # nothing left behind


def test_an_unfinished_bundled_run_has_nothing_to_compare(tmp_path):
    unfinished = {"schema_version": 1, "kind": "run", "scenario": "s", "case": "s[torch=2.5.1,arch=amd64]",
                  "torch": "2.5.1", "arch": "amd64", "verdict": None, "status": "interrupted", "reason": "Ctrl-C",
                  "run_dir": "runs/s/x"}
    bundle = bundle_with(tmp_path, json.dumps(unfinished).encode())
    with pytest.raises(ScenarioError, match="never reached a verdict"):
        replay(bundle, engine=None, host=HostPip(), runs_root=tmp_path / "runs",
               run_case=FakeRun(read_result(REAL_RUN)))

