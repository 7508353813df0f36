"""Bad input to `lab compare` and `lab comment`: one paragraph naming the file or field, exit 2, no
traceback. On real run folders (tests/data/compare/, tests/data/run-folders/)."""

from __future__ import annotations

import shutil

from tests.conftest import DATA, run_lab

RELU = DATA / "compare" / "relu-inject-2.13.0"
LIBGOMP = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"


def _one_paragraph_exit_2(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    text = " ".join(proc.stderr.split())
    assert text.startswith("error: "), text
    for word in words:
        assert word in text, (word, text)


def test_runs_of_different_scenarios():
    proc = run_lab("compare", str(RELU), str(LIBGOMP))
    _one_paragraph_exit_2(proc, "`relu-inject`", "`libgomp-aarch64`", "different scenarios")


def test_a_folder_that_is_not_a_run(tmp_path):
    proc = run_lab("compare", str(tmp_path), str(RELU))
    _one_paragraph_exit_2(proc, f"{tmp_path}/result.json", "not a run folder")
    alone = run_lab("compare", str(tmp_path))
    _one_paragraph_exit_2(alone, "no bisect.json")
    comment = run_lab("comment", str(tmp_path))
    _one_paragraph_exit_2(comment, "neither a run folder", "nor a bisect folder")


def test_a_corrupt_result_json(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(RELU, broken)
    (broken / "result.json").write_text('{"schema_version": 1, "kind": "run", "verdict": ')
    proc = run_lab("compare", str(RELU), str(broken))
    _one_paragraph_exit_2(proc, f"{broken}/result.json", "not valid JSON")
    (broken / "result.json").write_text('{"schema_version": 1, "kind": "run", "verdict": "maybe"}')
    proc = run_lab("comment", str(broken))
    _one_paragraph_exit_2(proc, f"{broken}/result.json")


def test_a_bad_failed_differently_value():
    proc = run_lab("bisect", "vmap-inside-compile", "--from", "2.3.1", "--to", "2.4.0", "--failed-differently", "good")
    _one_paragraph_exit_2(proc, "--failed-differently", "'good'")
