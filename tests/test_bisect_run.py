"""The bisect driver's own logic: probe folders, resuming from them, and what counts as a skip.
`run_case` and the index are faked here; tests/test_e2e_bisect.py runs a real bisection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab import bisect_run, pipeline, releases
from lab.errors import BuildError, EngineError, ScenarioError
from lab.hostpip import HostPip

from .conftest import tiny_scenario

VERSIONS = ["2.3.0", "2.3.1", "2.4.0", "2.4.1", "2.5.0"]
BODY = "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\nexpect:\n  exit_code: 1\n"


class FakeRuns:
    """Stands in for pipeline.run_case: a verdict per version, and a record of what ran."""

    def __init__(self, verdicts: dict[str, object]) -> None:
        self.verdicts, self.ran = verdicts, []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose, collect_env):
        assert diagnose is False and collect_env is False  # probes only need the verdict
        self.ran.append(case.torch)
        answer = self.verdicts[case.torch]
        if isinstance(answer, Exception):
            raise answer
        result = {"verdict": answer, "reason": f"{answer} at {case.torch}", "run_dir": str(run_dir),
                  "summary": [f"evidence for {case.torch}"]}
        (run_dir / "result.json").write_text(json.dumps(result))
        return pipeline.RunOutcome(run_dir, result, None)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setattr(releases, "candidates", lambda *a, **k: list(VERSIONS))
    scenario = tiny_scenario(tmp_path, BODY)

    def go(verdicts):
        fake = FakeRuns(verdicts)
        monkeypatch.setattr(pipeline, "run_case", fake)
        run = bisect_run.run_bisect(scenario, "b", "2.3.0", "2.5.0", None, engine=None, host=HostPip(),
                                    runs_root=tmp_path / "runs")
        return run, fake

    return go, tmp_path


def test_probe_folders_report_and_resume(setup):
    go, tmp = setup
    verdicts = {"2.3.0": "reproduced", "2.3.1": "reproduced", "2.4.0": "not_reproduced",
                "2.4.1": "not_reproduced", "2.5.0": "not_reproduced"}
    run, fake = go(verdicts)
    assert run.result.status == "found"
    assert (run.result.last_old, run.result.first_new) == ("2.3.1", "2.4.0")
    assert run.folder == tmp / "runs" / "b" / "bisect-arm64-2.3.0-2.5.0"
    assert fake.ran[:2] == ["2.3.0", "2.5.0"]
    for v in fake.ran:
        assert (run.folder / f"torch{v}" / "result.json").is_file()
    assert (run.folder / "bisect.md").is_file() and (run.folder / "bisect.svg").is_file()
    assert "lab bisect b --from 2.3.0 --to 2.5.0 --arch arm64 --out" in (run.folder / "bisect.md").read_text()
    assert run.result.steps[0].evidence == "evidence for 2.3.0"

    again, fake2 = go(verdicts)  # the same command again: every answer comes from the folders
    assert fake2.ran == []
    assert again.result.to_json() == run.result.to_json()


def test_an_interrupted_probe_is_run_again(setup):
    go, tmp = setup
    folder = tmp / "runs" / "b" / "bisect-arm64-2.3.0-2.5.0" / "torch2.3.0"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"verdict": None, "status": "interrupted"}))
    (folder / "stale.txt").write_text("from the interrupted run")
    verdicts = dict.fromkeys(VERSIONS, "reproduced")
    run, fake = go(verdicts)
    assert "2.3.0" in fake.ran
    assert not (folder / "stale.txt").exists()
    assert run.result.status == "no_change"


def test_setup_failures_are_skips_and_engine_failures_stop(setup):
    go, tmp = setup
    verdicts = {"2.3.0": "not_reproduced", "2.3.1": "not_reproduced", "2.4.0": BuildError("no wheel"),
                "2.4.1": "reproduced", "2.5.0": ScenarioError("uv found no aarch64 wheel")}
    run, _ = go(verdicts)
    assert run.result.status == "ambiguous"
    assert run.result.new_end == "2.4.1"
    assert set(run.result.skipped) == {"2.4.0", "2.5.0"}
    assert run.result.last_old == "2.3.1" and run.result.first_new == "2.4.1"

    shutil.rmtree(tmp / "runs")
    with pytest.raises(EngineError):
        go({**verdicts, "2.3.0": EngineError("the engine went away")})


def test_arch_choice(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY.replace("arch: arm64", "arch: [amd64, arm64]"))
    with pytest.raises(ScenarioError, match="--arch"):
        bisect_run.choose_arch(scenario, None)
    assert bisect_run.choose_arch(scenario, "aarch64") == "arm64"


def test_resume_command_is_exact():
    cmd = bisect_run.resume_command("libgomp-aarch64", "2.5.1", "2.15.0", "arm64", Path("my runs"), pre=True)
    assert cmd == "lab bisect libgomp-aarch64 --from 2.5.1 --to 2.15.0 --arch arm64 --out 'my runs' --pre"
