"""report.md of a scenario that expects only an exit code proposes the run's failure signature to pin
(`expect.signature`); result.json records it. Real captured stderr, through the real analyze and judge."""

from __future__ import annotations

import yaml

from lab.image.resolve import resolve
from lab.report.run_folder import render_report, run_result
from lab.scenario.model import Expect
from tests.conftest import DATA, tiny_scenario
from tests.report.test_report_golden import _run

HEAD = "name: t\ntorch: '2.13.0'\narch: amd64\nbase: debian:bookworm\nexpect:\n"


def test_report_proposes_the_signature_to_pin(tmp_path):
    scenario = tiny_scenario(tmp_path, HEAD + "  exit_code: 1\n")
    rec = _run(tmp_path / "run", resolve(scenario), stderr=DATA / "tracebacks" / "assert-close-torch2.13.stderr",
               exit_code=1)
    assert rec.judgement.verdict.value == "reproduced"
    text = render_report(rec)
    assert "This run failed with\nAssertionError in torch/testing/_comparison.py in assert_close." in text
    pinned = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    expect = Expect.model_validate(yaml.safe_load(pinned)["expect"] | {"exit_code": 1})  # it loads as it is
    assert expect.signature.frame == "torch/testing/_comparison.py in assert_close"
    assert run_result(rec).signature.exception == "AssertionError"


def test_no_proposal_when_the_scenario_names_its_failure(tmp_path):
    scenario = tiny_scenario(tmp_path, HEAD + "  traceback_contains: Tensor-likes are not close\n")
    rec = _run(tmp_path / "run", resolve(scenario), stderr=DATA / "tracebacks" / "assert-close-torch2.13.stderr",
               exit_code=1)
    assert "Pin it" not in render_report(rec) and run_result(rec).signature is not None
