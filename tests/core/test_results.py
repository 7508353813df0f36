"""lab.results: result.json written and read through the model, the unversioned layout of lab 0.1.0
migrated, and everything else refused with one paragraph naming the file."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lab.analyze.evidence import analyze, read_text
from lab.analyze.judge import judge
from lab.core.errors import LabError, ResultError
from lab.core.records import BaseImage, BuiltImage, RawRun, RunLimits
from lab.core.results import (
    SCHEMA_VERSION,
    BisectResult,
    EvidenceRecord,
    RunResult,
    UnfinishedRun,
    Verdict,
    parse_result,
    read_document,
    read_result,
)
from lab.image.resolve import resolve
from lab.report import run_folder as report
from lab.scenario.lookup import load_scenario
from tests.conftest import DATA, SCENARIOS, run_lab

REAL_RUN = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"  # written by lab 0.1.0: no schema_version


def rerun_analysis(run_dir: Path) -> RunResult:
    """Analyse and judge the committed real run's captured logs again and write a run folder with
    the lab's own writer (report.write_results): today's result.json and evidence.json of a real run."""
    case = resolve(load_scenario("libgomp-aarch64", SCENARIOS))
    raw = RawRun(exit_code=0, timed_out=False, oom_killed=False, duration_s=58.97,
                 stdout_path=REAL_RUN / "stdout.txt", stderr_path=REAL_RUN / "stderr.txt",
                 loader_dir=REAL_RUN / "out" / "ld", emulated=True, command=("python", "libgomp_aarch64.py"),
                 env=(), limits=RunLimits())
    evidence = analyze(raw)
    judgement = judge(evidence, case.scenario.expect, read_text(raw.stdout_path), read_text(raw.stderr_path))
    base = BaseImage("debian:bookworm", "torch-repro-lab/debian:bookworm-arm64", "sha256:4eb7", "bootstrapped",
                     "mmdebstrap --variant=minbase bookworm rootfs.tar")
    image = BuiltImage("torch-repro-lab/case:libgomp-aarch64-742e2307b639011e", "sha256:4176", base, False, 80.0)
    run_dir.mkdir(parents=True)
    rec = report.RunRecord(case=case, run_dir=run_dir, judgement=judgement, evidence=evidence, image=image,
                           base=base, engine_version="20.10.24+dfsg1", host_arch="x86_64", emulated=True,
                           started=datetime(2026, 11, 22, 12, 9, 58, tzinfo=timezone.utc))
    return report.write_results(rec)


def test_a_run_is_written_and_read_back_through_the_model(tmp_path):
    written = rerun_analysis(tmp_path / "run")
    assert written.verdict is Verdict.REPRODUCED
    assert read_result(tmp_path / "run") == written
    data = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (data["schema_version"], data["kind"]) == (SCHEMA_VERSION, "run")
    # the --json contract of DESIGN.md and README.md, key for key
    assert {"scenario", "torch", "arch", "emulated", "verdict", "run_dir", "evidence"} <= set(data)
    (dup,) = data["evidence"]["duplicate_runtimes"]
    assert set(dup) == {"family", "pid", "paths"} and dup["family"] == "libgomp" and len(dup["paths"]) == 2
    assert data["evidence"]["exception"] is None
    assert {"case", "backend", "mode", "reason", "summary", "graph_breaks", "exit_code", "duration_s", "killed",
            "limits", "checks", "image", "base", "engine", "lab_version", "started"} <= set(data)
    assert data["started"] == "2026-11-22T12:09:58+00:00"
    evidence = EvidenceRecord.model_validate_json((tmp_path / "run" / "evidence.json").read_text())
    assert evidence.judgement.verdict is Verdict.REPRODUCED and evidence.duplicate_runtimes[0].family == "libgomp"


def test_the_unversioned_layout_of_lab_0_1_is_migrated():
    result = read_result(REAL_RUN)
    assert isinstance(result, RunResult) and result.schema_version == SCHEMA_VERSION
    assert (result.scenario, result.torch, result.arch, result.verdict) == \
        ("libgomp-aarch64", "2.5.1", "arm64", Verdict.REPRODUCED)
    assert result.evidence.duplicate_runtimes[0].pid == 1
    assert (result.mode, result.summary, result.graph_breaks, result.killed, result.limits) == \
        (None, (), None, None, None)  # fields lab 0.1.0 did not write yet: "not recorded"
    assert result.image is not None and result.image.cached is False


def test_an_unfinished_run_reads_as_one(tmp_path):
    case = resolve(load_scenario("libgomp-amd64", SCENARIOS))
    report.mark_unfinished(tmp_path, case, "interrupted", "interrupted by the user (Ctrl-C or SIGTERM)")
    result = read_result(tmp_path)
    assert isinstance(result, UnfinishedRun) and result.status == "interrupted" and result.verdict is None
    old = {"scenario": "s", "case": "s[torch=2.5.1,arch=arm64]", "torch": "2.5.1", "arch": "arm64",
           "verdict": None, "status": "failed", "reason": "the engine went away", "run_dir": "runs/s/x"}
    assert parse_result(json.dumps(old), "old.json").status == "failed"  # lab 0.1.0's unfinished layout


def good() -> dict:
    return json.loads(RunResult.model_validate_json(read_result(REAL_RUN).model_dump_json()).model_dump_json())


@pytest.mark.parametrize("text, words", [
    ("", "is not valid JSON (Expecting value at line 1, column 1)"),
    ("[1, 2]", "is an array in JSON, not an object"),
    ('"reproduced"', "is a string in JSON, not an object"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
    (json.dumps({**good(), "schema_version": 2}),
     "was written by a newer torch-repro-lab (schema_version 2); this lab reads schema_version 1"),
    (json.dumps({**good(), "schema_version": "1"}), "field `schema_version` must be a whole number, got '1'"),
    (json.dumps({**good(), "kind": "bisect"}), "is a bisection's result, not a run's result"),
    (json.dumps({**good(), "kind": "wheel"}), "is of kind 'wheel', not a run's result"),
    (json.dumps({"schema_version": 1, "from_verdict": "reproduced"}), "without a valid `kind` (None)"),
    (json.dumps({k: v for k, v in good().items() if k != "engine"}), "the required field `engine` is missing"),
    (json.dumps({**good(), "verdict": "maybe"}), "field `verdict`: Input should be 'reproduced'"),
    (json.dumps({**good(), "evidence": {"duplicate_runtimes": [{"family": "libgomp", "pid": "one", "paths": []}],
                                        "exception": None}}),
     "field `evidence.duplicate_runtimes[0].pid`: Input should be a valid integer"),
    (json.dumps({"checks": {"all": "fine"}}),
     "it has no `schema_version`, so it was read as the unversioned layout of lab 0.1.0, and it is not that either"),
])
def test_foreign_results_get_one_paragraph_naming_the_file(tmp_path, text, words):
    (tmp_path / "result.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ResultError) as info:
        read_result(tmp_path)
    message = str(info.value)
    assert isinstance(info.value, LabError)
    assert message.startswith(f"{tmp_path / 'result.json'}: ") and words in message, message
    assert "\n" not in message


def test_a_missing_result_says_it_is_no_run_folder(tmp_path):
    with pytest.raises(ResultError, match="result.json: there is no such file, so .* is not a run folder"):
        read_result(tmp_path)
    with pytest.raises(ResultError, match=r"^b.tar.gz: result.json: there is no such file\. "):
        read_result(tmp_path, where="b.tar.gz: result.json")


def test_unknown_fields_of_the_same_version_are_ignored():
    """A newer lab of the same schema version may add fields; this one reads what it knows."""
    result = parse_result(json.dumps({**good(), "flamegraph": "x.svg"}), "new.json")
    assert result == read_result(REAL_RUN)


def test_the_cli_refuses_a_foreign_result_with_exit_2(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({**good(), "schema_version": 7}))
    proc = run_lab("bundle", str(run), "-o", str(tmp_path / "b.tar.gz"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    text = " ".join(proc.stderr.split())
    assert text.startswith("error: ") and "result.json: was written by a newer torch-repro-lab" in text
    assert "Upgrade torch-repro-lab" in text


def test_other_documents_are_read_through_their_models(tmp_path):
    bisect = {"from_verdict": "not_reproduced", "to_verdict": "reproduced", "last_old": "2.3.1", "first_new": "2.4.0",
              "steps": [{"torch": "2.3.1", "verdict": "not_reproduced", "outcome": "not_reproduced", "reason": "",
                         "evidence": "", "run_dir": None}],
              "status": "found", "ambiguous": False, "skipped_between": [], "skipped": [], "from": "2.3.1",
              "to": "2.4.0", "old_end": "2.3.1", "new_end": "2.4.0", "notes": [], "scenario": "s", "arch": "arm64",
              "candidates": ["2.3.1", "2.4.0"]}
    (tmp_path / "bisect.json").write_text(json.dumps(bisect))  # as lab 0.1.0 wrote it: no schema_version
    result = read_document(tmp_path / "bisect.json", BisectResult)
    assert (result.from_version, result.first_new, result.steps[0].version) == ("2.3.1", "2.4.0", "2.3.1")
    (tmp_path / "result.json").write_text(json.dumps(good()))
    with pytest.raises(ResultError, match=r"result.json: is a run's result, not a bisection's result\."):
        read_document(tmp_path / "result.json", BisectResult)
    (tmp_path / "bisect.json").write_text(json.dumps({**bisect, "status": "done"}))
    with pytest.raises(ResultError, match=r"bisect.json: field `status`: Input should be 'found'"):
        read_document(tmp_path / "bisect.json", BisectResult)


def test_a_failed_build_writes_an_error_result(tmp_path):
    """No run happened: no evidence, no image, and still a complete result of schema 1."""
    from lab.analyze.judge import build_failed
    case = resolve(load_scenario("libgomp-amd64", SCENARIOS))
    rec = report.RunRecord(case=case, run_dir=tmp_path, judgement=build_failed("pip could not find torch"),
                           evidence=None, image=None, base=None, engine_version="20.10.24+dfsg1", host_arch="x86_64",
                           emulated=False, started=datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc))
    written = report.write_results(rec)
    assert read_result(tmp_path) == written and written.verdict is Verdict.ERROR
    assert written.reason == "the image build failed: pip could not find torch"
    assert (written.evidence.duplicate_runtimes, written.evidence.exception, written.exit_code, written.image) == \
        ((), None, None, None)
    assert not (tmp_path / "evidence.json").exists()
