"""Which earlier runs a bisection may take a verdict from (lab.history.earlier): only folders this lab
made under the runs root, for the same content key, whose verdict says something about the bug and
whose evidence.json agrees. Fake run folders (fake_result), no engine."""

from __future__ import annotations

import json
import os

from lab.core.results import RunResult
from lab.core.runmarker import mark_run, runs_key
from lab.history.earlier import earlier_verdicts, trusted_result
from lab.image.casekey import content_key
from lab.image.resolve import resolve
from tests.conftest import fake_result, tiny_scenario

BODY = "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\nexpect:\n  exit_code: 1\n"


def made(root, scenario, version, verdict, name=None, *, marked=True, evidence=None, key=None):
    """A finished run folder as lab.pipeline leaves it: marker, result.json and evidence.json."""
    case = resolve(scenario, torch=version, arch="arm64")
    run_dir = root / scenario.name / (name or f"20261127T000000Z-torch{version}")
    run_dir.mkdir(parents=True)
    if marked:
        runs_key(root, create=True)
        assert mark_run(root, run_dir) is None
    wanted = content_key(case)
    result = fake_result(case, verdict, run_dir, content_key=key or wanted.digest, content_parts=dict(wanted.parts))
    result.write(run_dir / "result.json")
    (run_dir / "evidence.json").write_text(json.dumps({"judgement": {"verdict": evidence or verdict}}))
    return run_dir, wanted.digest


def test_a_marked_run_with_the_same_key_is_taken(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    root = tmp_path / "runs"
    run_dir, digest = made(root, scenario, "2.3.0", "reproduced")
    found, refused = earlier_verdicts(root, "b", "arm64", {"2.3.0": digest, "2.5.0": "x" * 64})
    assert set(found) == {"2.3.0"} and found["2.3.0"].run_dir == run_dir and refused == []
    assert found["2.3.0"].result.verdict.value == "reproduced"


def test_untrusted_or_other_folders_are_not_taken(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    root = tmp_path / "runs"
    cases = {
        "2.3.0": made(root, scenario, "2.3.0", "reproduced", marked=False),           # not the lab's here
        "2.3.1": made(root, scenario, "2.3.1", "reproduced", evidence="not_reproduced"),  # result.json edited
        "2.4.0": made(root, scenario, "2.4.0", "error"),                                # says nothing
        "2.4.1": made(root, scenario, "2.4.1", "reproduced", key="0" * 64),             # another content key
    }
    wanted = {v: d for v, (_, d) in cases.items()}
    wanted["2.4.1"] = content_key(resolve(scenario, torch="2.4.1", arch="arm64")).digest
    found, refused = earlier_verdicts(root, "b", "arm64", wanted)
    assert found == {}
    text = "\n".join(refused)
    assert "marker is missing or does not check out" in text
    assert "its result.json says reproduced, its evidence.json not_reproduced" in text
    assert "(error) says nothing about the bug" in text
    key = runs_key(root, create=False)
    assert trusted_result(root, cases["2.4.1"][0], scenario="b", torch="2.4.1", arch="arm64",
                          digest=wanted["2.4.1"], key=key) == "made from another content key"


def test_a_moved_folder_or_a_link_is_not_taken(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    root = tmp_path / "runs"
    run_dir, digest = made(root, scenario, "2.3.0", "reproduced")
    moved = run_dir.with_name("copied-here")
    os.rename(run_dir, moved)  # its marker names the path it was made at
    key = runs_key(root, create=False)
    assert "marker" in trusted_result(root, moved, scenario="b", torch="2.3.0", arch="arm64", digest=digest, key=key)
    link = root / "b" / "linked"
    link.symlink_to(moved)
    assert trusted_result(root, link, scenario="b", torch="2.3.0", arch="arm64", digest=digest,
                          key=key) == "a symbolic link"
    os.rename(moved, run_dir)
    assert isinstance(trusted_result(root, run_dir, scenario="b", torch="2.3.0", arch="arm64", digest=digest,
                                     key=key), RunResult)


def test_the_bisections_own_folder_is_left_to_its_resume(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    root = tmp_path / "runs"
    run_dir, digest = made(root, scenario, "2.3.0", "reproduced", name="bisect-arm64-2.3.0-2.5.0/torch2.3.0")
    found, _ = earlier_verdicts(root, "b", "arm64", {"2.3.0": digest}, exclude=run_dir.parent)
    assert found == {}
    found, _ = earlier_verdicts(root, "b", "arm64", {"2.3.0": digest})  # another bisection's probe
    assert set(found) == {"2.3.0"}


def test_runs_that_disagree_are_not_taken(tmp_path):
    scenario = tiny_scenario(tmp_path, BODY)
    root = tmp_path / "runs"
    _, digest = made(root, scenario, "2.3.0", "reproduced", name="20261127T000000Z-a")
    made(root, scenario, "2.3.0", "not_reproduced", name="20261127T000001Z-b")
    found, refused = earlier_verdicts(root, "b", "arm64", {"2.3.0": digest})
    assert found == {} and "earlier runs of the same case disagree" in "\n".join(refused)
