"""The bisect driver's own logic: probe folders, resuming from them, and what counts as a skip.
A fake runner and a fixed list of releases are passed in; tests/test_e2e_bisect.py runs a real bisection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.core.errors import BuildError, EngineError, ResultError, ScenarioError
from lab.core.results import BisectResult, ImageRef, Judgement, StageTimes, read_result
from lab.drivers import bisect_run
from lab.image.casekey import content_key
from lab.image.hostpip import HostPip
from lab.pipeline import RunOutcome
from tests.conftest import DATA, fake_result, tiny_scenario

REAL_RUN = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"  # written by lab 0.1.0, unversioned

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
        image = ImageRef(tag=f"torch-repro-lab/case:b-{case.torch}", id="sha256:00", cached=False)
        timings = StageTimes(build_s=10.0 + len(self.ran), run_s=20.0, analyze_s=0.5, total_s=31.0 + len(self.ran))
        key = content_key(case)  # as lab.pipeline records it
        result = fake_result(case, answer, run_dir, summary=[f"evidence for {case.torch}"], image=image,
                             timings=timings, content_key=key.digest, content_parts=dict(key.parts))
        result.write(run_dir / "result.json")
        return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


class FakeEngine:
    """Records the images a bisection removes after its probes."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def anchor_shared_layers(self, tag: str) -> None:
        pass

    def remove_image(self, tag: str) -> None:
        self.removed.append(tag)

    def discard(self, tag: str) -> None:  # lab.engine.protocol: what a bisection calls
        self.anchor_shared_layers(tag)
        self.remove_image(tag)


def releases(*, python: str, arch: str, include_pre: bool) -> list[str]:
    assert (python, arch, include_pre) == ("3.11", "arm64", False)
    return list(VERSIONS)


@pytest.fixture
def setup(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)

    def go(verdicts, **options):
        fake = FakeRuns(verdicts)
        run = bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0"),
                                    engine=FakeEngine(), host=HostPip(),
                                    runs_root=tmp_path / "runs", run_case=fake, candidates=releases, **options)
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
    written = BisectResult.model_validate_json((run.folder / "bisect.json").read_text())
    assert written == run.result and written.folder == str(run.folder) and written.resume == run.resume_command


def test_an_interrupted_probe_is_run_again(setup):
    go, tmp = setup
    folder = tmp / "runs" / "b" / "bisect-arm64-2.3.0-2.5.0" / "torch2.3.0"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({  # as lab 0.1.0 left an interrupted run
        "scenario": "b", "case": "b[torch=2.3.0,arch=arm64]", "torch": "2.3.0", "arch": "arm64", "verdict": None,
        "status": "interrupted", "reason": "interrupted by the user", "run_dir": str(folder)}))
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
    cmd = bisect_run.resume_command("s", "2.5.1", "2.15.0", "arm64", Path("r"), pre=False, sets={"N": "a b", "M": "1"})
    assert cmd == "lab bisect s --from 2.5.1 --to 2.15.0 --arch arm64 --out r --set M=1 --set 'N=a b'"


def test_probe_images_are_removed_unless_kept(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    verdicts = dict.fromkeys(VERSIONS, "reproduced")
    for keep, root in ((False, "removed"), (True, "kept")):
        engine = FakeEngine()
        bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0", keep_images=keep),
                              engine=engine, host=HostPip(), runs_root=tmp_path / root, run_case=FakeRuns(verdicts),
                              candidates=releases)
        assert engine.removed == ([] if keep else ["torch-repro-lab/case:b-2.3.0", "torch-repro-lab/case:b-2.5.0"])


def test_a_probe_folder_from_the_unversioned_layout_runs_again(setup):
    """A probe that lab 0.1.0 finished (result.json without schema_version) is read, but it records no
    content key, so what it ran is unknown: it runs again, and the progress says why."""
    go, tmp = setup
    folder = tmp / "runs" / "b" / "bisect-arm64-2.3.0-2.5.0" / "torch2.3.0"
    folder.mkdir(parents=True)
    old = json.loads((REAL_RUN / "result.json").read_text())
    (folder / "result.json").write_text(json.dumps({**old, "torch": "2.3.0", "run_dir": str(folder)}))
    said: list[str] = []
    run, fake = go(dict.fromkeys(VERSIONS, "reproduced"), events=lambda stage, message: said.append(message))
    assert "2.3.0" in fake.ran
    assert "probe 2.3.0 runs again: it has no content key (made by an older lab), so what it ran is unknown" in said
    assert run.result.steps[0].version == "2.3.0" and run.result.steps[0].verdict == "reproduced"


def _bisect(tmp_path, scenario, verdicts, **options):
    said: list[str] = []
    fake = FakeRuns(verdicts)
    run = bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0", **options),
                                engine=FakeEngine(), host=HostPip(), runs_root=tmp_path / "runs", run_case=fake,
                                candidates=releases, events=lambda stage, message: said.append(message))
    return run, fake, said


SPLIT = {"2.3.0": "reproduced", "2.3.1": "reproduced", "2.4.0": "not_reproduced", "2.4.1": "not_reproduced",
         "2.5.0": "not_reproduced"}


def test_a_probe_made_from_another_expect_runs_again_and_says_why(tmp_path):
    """Editing `expect` between two bisections: no probe of the first is reused; the progress names it."""
    run, first, _ = _bisect(tmp_path, tiny_scenario(tmp_path, BODY), SPLIT)
    edited = tiny_scenario(tmp_path, BODY.replace("exit_code: 1", "exit_code: 2"))
    again, second, said = _bisect(tmp_path, edited, {**SPLIT, "2.3.1": "not_reproduced"})
    assert second.ran == first.ran  # every probe of the first bisection ran again
    assert (again.result.last_old, again.result.first_new) == ("2.3.0", "2.3.1")
    assert "probe 2.3.0 runs again: the scenario changed since (expect)" in said
    _, third, said = _bisect(tmp_path, edited, {})  # the same again: every probe is reused
    assert third.ran == [] and not any("runs again" in m for m in said)


def test_a_probe_made_from_another_script_or_set_value_runs_again(tmp_path):
    body = BODY + "vars: {N: '1'}\n"
    scenario = tiny_scenario(tmp_path, body)
    run, first, _ = _bisect(tmp_path, scenario, SPLIT)
    _, again, said = _bisect(tmp_path, scenario, SPLIT, sets={"N": "2"})
    assert again.ran == first.ran and "probe 2.3.0 runs again: the scenario changed since (vars (with --set))" in said
    resumed, same, _ = _bisect(tmp_path, scenario, SPLIT, sets={"N": "2"})  # the resume command's own --set
    assert same.ran == [] and "--set N=2" in resumed.resume_command
    (tmp_path / "s.py").write_text("print('edited')\n")
    _, edited, said = _bisect(tmp_path, scenario, SPLIT, sets={"N": "2"})
    assert edited.ran == first.ran and "probe 2.3.0 runs again: the scenario changed since (the script)" in said


def test_a_probe_folder_this_lab_cannot_read_stops_the_bisection(setup):
    """A newer lab's (or a damaged) result.json is neither reused nor deleted: the bisection stops."""
    go, tmp = setup
    folder = tmp / "runs" / "b" / "bisect-arm64-2.3.0-2.5.0" / "torch2.3.0"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"schema_version": 9, "kind": "run"}))
    with pytest.raises(ResultError, match=r"torch2.3.0/result.json: was written by a newer torch-repro-lab"):
        go(dict.fromkeys(VERSIONS, "reproduced"))
    assert (folder / "result.json").is_file()


def test_probe_results_read_back_through_the_model(setup):
    go, _ = setup
    run, fake = go(dict.fromkeys(VERSIONS, "not_reproduced"))
    for version in fake.ran:
        result = read_result(run.folder / f"torch{version}")
        assert result.verdict.value == "not_reproduced" and result.torch == version


def test_each_probe_carries_its_build_run_and_total_time(setup):
    go, tmp_path = setup
    run, fake = go({"2.3.0": "not_reproduced", "2.3.1": "not_reproduced", "2.4.0": "reproduced",
                    "2.4.1": "reproduced", "2.5.0": "reproduced"})
    steps = {s.version: s for s in run.result.steps}
    first = steps["2.3.0"]
    assert (first.build_s, first.run_s, first.total_s) == (11.0, 20.0, 32.0)
    saved = BisectResult.model_validate_json((run.folder / "bisect.json").read_text())
    assert [s.total_s for s in saved.steps] == [s.total_s for s in run.result.steps]
    md = (run.folder / "bisect.md").read_text()
    assert "| build | run | total |" in md and "Wall time of" in md


class FakeRunsWithCommits(FakeRuns):
    """FakeRuns whose results carry torch.version.git_version, and a different failure where asked."""

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose, collect_env):
        from lab.core.results import FailureSignatures, TorchBuild
        outcome = super().__call__(case, engine, host, runs_root, events, run_dir=run_dir, diagnose=diagnose,
                                   collect_env=collect_env)
        extra = {"torch_build": TorchBuild(version=case.torch, git_version=case.torch.replace(".", "") * 8)}
        if outcome.result.verdict.value == "failed_differently":
            extra["different_failure"] = FailureSignatures(expected="exit code 1",
                                                           observed="AttributeError: no is_compiling, exit code 1")
        result = outcome.result.model_copy(update=extra)
        result.write(run_dir / "result.json")
        return RunOutcome(run_dir, result, outcome.judgement)


def test_failed_differently_boundary_source_and_compare(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    verdicts = {"2.3.0": "failed_differently", "2.3.1": "not_reproduced", "2.4.0": "not_reproduced",
                "2.4.1": "reproduced", "2.5.0": "reproduced"}

    def go(**options):
        return bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0", **options),
                                     engine=FakeEngine(), host=HostPip(), runs_root=tmp_path / "runs",
                                     run_case=FakeRunsWithCommits(verdicts), candidates=releases)
    run = go()
    r = run.result
    assert (r.status, r.last_old, r.first_new, r.old_end) == ("found", "2.4.0", "2.4.1", "2.3.1")
    assert r.failed_differently_probes == ("2.3.0",) and r.failed_differently == "skip"
    assert r.source is not None and r.source.last_old_commit == "240" * 8 and r.source.first_new_commit == "241" * 8
    assert r.source.git_bisect == f"git bisect start {'241' * 8} {'240' * 8}"
    assert r.compare[2] == "verdict: not_reproduced → reproduced"
    assert r.localization is None  # no compiler-stack exception in these fake runs
    md = (run.folder / "bisect.md").read_text()
    assert "## Failed differently" in md and "AttributeError: no is_compiling" in md
    assert "## The boundary in PyTorch's source" in md and r.source.compare_url in md
    assert "## What changed at the boundary" in md and "verdict: not_reproduced → reproduced" in md
    page = (run.folder / "report.html").read_text()
    assert r.source.compare_url in page and 'id="compare"' in page

    counted = go(failed_differently="not_reproduced").result  # resumes from the folders
    assert counted.old_end == "2.3.0" and counted.failed_differently == "not_reproduced"
    assert counted.resume.endswith("--failed-differently not-reproduced")


def test_verdicts_of_earlier_runs_are_taken_and_said(setup):
    """Issue 34, item 3: the ends a `lab run` (or a matrix, a triage) already ran with the same content
    key are not run again; the bisection says which, from which folder, and finds the same boundary."""
    from tests.history.test_earlier import made
    go, tmp = setup
    from lab.scenario.lookup import load_scenario
    loaded = load_scenario(tmp / "tiny.yaml", None)
    old_dir, _ = made(tmp / "runs", loaded, "2.3.0", "reproduced")
    new_dir, _ = made(tmp / "runs", loaded, "2.5.0", "not_reproduced")
    made(tmp / "runs", loaded, "2.4.0", "reproduced", name="edited", evidence="not_reproduced")  # not believed
    verdicts = {"2.3.0": "reproduced", "2.3.1": "reproduced", "2.4.0": "not_reproduced",
                "2.4.1": "not_reproduced", "2.5.0": "not_reproduced"}
    run, fake = go(verdicts)
    assert (run.result.last_old, run.result.first_new) == ("2.3.1", "2.4.0")
    assert "2.3.0" not in fake.ran and "2.5.0" not in fake.ran and "2.4.0" in fake.ran
    reused = {p.version: p.reused_from for p in run.result.steps if p.reused_from}
    assert reused == {"2.3.0": str(old_dir), "2.5.0": str(new_dir)}
    notes = "\n".join(run.result.notes)
    assert f"torch 2.3.0: reproduced, taken from {old_dir}" in notes and "not run again" in notes
    assert "its result.json says reproduced, its evidence.json not_reproduced" in notes
    assert str(old_dir) in (run.folder / "bisect.md").read_text()

    fresh, fake2 = go(verdicts, **{})  # resumed: its own folders, the earlier runs still named
    assert fake2.ran == [] and fresh.result.last_old == "2.3.1"


def test_collect_env_only_at_the_boundary(tmp_path):
    """Issue 34, item 4: collect_env runs for the boundary's two probes only, not for the others (the
    probes themselves run without it: FakeRuns asserts that); the hints for the next round reach
    `make_ready` (lab.drivers.bisect_ahead; which ones: tests/drivers/test_bisect_ahead.py)."""
    scenario = tiny_scenario(tmp_path, BODY)
    readied: list[str] = []
    collected: list[str] = []
    fake = FakeRuns({"2.3.0": "reproduced", "2.3.1": "reproduced", "2.4.0": "reproduced",
                     "2.4.1": "not_reproduced", "2.5.0": "not_reproduced"})

    def make_ready(version: str) -> None:
        readied.append(version)

    run = bisect_run.run_bisect(bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0"), engine=FakeEngine(),
                                host=HostPip(), runs_root=tmp_path / "runs", run_case=fake, candidates=releases,
                                make_ready=make_ready, boundary_env=lambda p: collected.append(p.version))
    assert (run.result.last_old, run.result.first_new) == ("2.4.0", "2.4.1")
    assert sorted(collected) == ["2.4.0", "2.4.1"]
    assert set(fake.ran) - set(collected)  # probes that are not the boundary: no collect_env
    assert set(readied) <= set(VERSIONS)
