"""A verdict for the right reason: failures of the script's own code, and failure signatures
(lab.analyze.signature, lab.analyze.judge), on evidence built from real captured stderr in
tests/data/tracebacks/ (torch 2.13.0+cpu, Python 3.11; the scripts are in its scripts/ folder)."""

from pathlib import Path

import pytest

from lab.analyze.evidence import Evidence
from lab.analyze.judge import Verdict, judge
from lab.analyze.signature import innermost_torch_frame, observed, own_code_error, signal_name
from lab.analyze.tracebacks import extract_exceptions
from lab.core.errors import ScenarioError
from lab.core.results import FailureSignature
from lab.scenario.model import Expect

DATA = Path(__file__).resolve().parents[1] / "data" / "tracebacks"


def real(name: str, exit_code: int = 1) -> tuple[Evidence, str]:
    stderr = (DATA / name).read_text()
    ev = Evidence(exit_code=exit_code, timed_out=False, oom_killed=False, duration_s=3.0, emulated=False,
                  processes=1, duplicate_runtimes=(), exceptions=tuple(extract_exceptions(stderr)),
                  emulator_crash=None)
    return ev, stderr


def test_pasted_output_run_as_code_is_not_reproduced_by_an_exit_code():
    # The issue's case: the page pasted `tensor([2., 4.])` under its code; the script ran it and died
    # of a NameError. `exit_code: 1` holds, but not for the page's reason.
    ev, stderr = real("pasted-output-torch2.13.stderr")
    j = judge(ev, Expect(exit_code=1), "tensor([2., 4.])\n", stderr, script="pasted_output.py")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY
    assert "the script's own code failed (NameError: name 'tensor' is not defined, pasted_output.py, line 5)" \
        in j.reason
    assert j.different.observed == "NameError: name 'tensor' is not defined, exit code 1"


def test_the_bug_visible_in_stdout_still_counts_when_pasted_output_fails_after_it():
    ev, stderr = real("pasted-output-torch2.13.stderr")
    stdout = (DATA / "pasted-output-torch2.13.stdout").read_text()
    j = judge(ev, Expect(stdout_contains_normalized="tensor([2., 4.])"), stdout, stderr, script="pasted_output.py")
    assert j.verdict is Verdict.REPRODUCED


def test_a_page_error_expected_but_a_name_error_observed_failed_differently():
    ev, stderr = real("pasted-output-torch2.13.stderr")
    j = judge(ev, Expect(traceback_contains="RuntimeError: shape mismatch"), "", stderr, script="pasted_output.py")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY
    assert "traceback_contains: expected 'RuntimeError: shape mismatch'" in j.reason


def test_an_import_of_an_api_the_release_lacks_is_not_the_bug():
    ev, stderr = real("import-missing-torch2.13.stderr")
    assert own_code_error(ev, "import_missing.py").name == "ModuleNotFoundError"
    j = judge(ev, Expect(exit_code=1), "", stderr, script="import_missing.py")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY
    # unless the scenario names that very exception: then it is the bug
    named = Expect(traceback_contains="ModuleNotFoundError: No module named 'torch._dynamo")
    assert judge(ev, named, "", stderr, script="import_missing.py").verdict is Verdict.REPRODUCED


def test_an_error_raised_inside_torch_is_not_the_scripts_own():
    ev, stderr = real("assert-close-torch2.13.stderr")
    assert own_code_error(ev, "assert_close.py") is None
    assert judge(ev, Expect(exit_code=1), "", stderr, script="assert_close.py").verdict is Verdict.REPRODUCED


def test_the_headerless_syntax_error_of_the_script_is_its_own():
    ev, stderr = real("syntax-error-script-py3.11.stderr")
    assert own_code_error(ev, "syntax_error.py").name == "SyntaxError"
    assert own_code_error(ev, "other.py") is None
    assert own_code_error(ev) is not None  # without the script's name: not a library's file
    assert judge(ev, Expect(exit_code=1), "", stderr, script="syntax_error.py").verdict is Verdict.FAILED_DIFFERENTLY


def test_signature_of_a_real_torch_failure():
    ev, _ = real("assert-close-torch2.13.stderr")
    assert observed(ev) == FailureSignature(exception="AssertionError",
                                            frame="torch/testing/_comparison.py in assert_close")
    ev, _ = real("dlpack-torch2.13-cpu.stderr")
    assert innermost_torch_frame(ev.exception) == "torch/_dynamo/eval_frame.py in compile_wrapper"
    assert observed(ev).exception == "Unsupported"
    ev, _ = real("pasted-output-torch2.13.stderr")
    assert observed(ev) == FailureSignature(exception="NameError", frame=None)


def test_a_crash_is_its_signal():
    assert signal_name(139) == "SIGSEGV" and signal_name(-11) == "SIGSEGV" and signal_name(134) == "SIGABRT"
    assert signal_name(1) is None and signal_name(0) is None and signal_name(None) is None
    ev, _ = real("assert-close-torch2.13.stderr", exit_code=139)
    assert observed(ev) == FailureSignature(signal="SIGSEGV")


def test_signature_matching():
    pinned = FailureSignature(exception="AssertionError", frame="torch/testing/_comparison.py in assert_close")
    assert pinned.matches(FailureSignature(exception="AssertionError",
                                           frame="torch/testing/_comparison.py in _assert_close"))  # same file
    assert pinned.matches(FailureSignature(exception="AssertionError",
                                           frame="torch/testing/_compare.py in assert_close"))  # same function
    assert not pinned.matches(FailureSignature(exception="AssertionError", frame="torch/nn/modules/module.py in "
                                                                                 "_call_impl"))
    assert not pinned.matches(FailureSignature(exception="RuntimeError", frame=pinned.frame))
    assert not pinned.matches(None) and not pinned.matches(FailureSignature(signal="SIGSEGV"))
    assert FailureSignature(exception="NameError").matches(FailureSignature(exception="NameError", frame="torch/x.py"))


def test_a_pinned_signature_is_checked_like_minifier_check_str():
    ev, stderr = real("assert-close-torch2.13.stderr")
    pinned = Expect.model_validate({"exit_code": 1, "signature": {
        "exception": "AssertionError", "frame": "torch/testing/_comparison.py in assert_close"}})
    j = judge(ev, pinned, "", stderr, script="assert_close.py")
    assert j.verdict is Verdict.REPRODUCED and j.signature.exception == "AssertionError"
    other, stderr = real("dlpack-torch2.13-cpu.stderr")
    j = judge(other, pinned, "", stderr, script="dlpack.py")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY
    check = next(c for c in j.checks if c.key == "signature")
    assert not check.held and check.observed == "Unsupported in torch/_dynamo/eval_frame.py in compile_wrapper"
    crash = Expect.model_validate({"exit_code": [134, 139], "signature": {"signal": "SIGSEGV"}})
    assert judge(real("assert-close-torch2.13.stderr", 139)[0], crash, "", "").verdict is Verdict.REPRODUCED
    assert judge(real("assert-close-torch2.13.stderr", 134)[0], crash, "", "").verdict is Verdict.FAILED_DIFFERENTLY


@pytest.mark.parametrize("bad", [{"frame": "torch/x.py in f"}, {"exception": "E", "signal": "SIGSEGV"},
                                 {"signal": "segfault"}, {"exception": "RuntimeError", "where": "x"}])
def test_a_signature_gives_an_exception_or_a_signal(bad, tmp_path):
    from lab.scenario.lookup import load_scenario
    (tmp_path / "s.py").write_text("print(1)\n")
    (tmp_path / "s.yaml").write_text("name: s\ntorch: '2.5.1'\narch: amd64\nscript: s.py\nexpect:\n  exit_code: 1\n"
                                     f"  signature: {bad}\n".replace("'", '"'))
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.yaml")
    assert "expect.signature" in str(err.value) and "line" in str(err.value)


def test_exit_code_only():
    assert Expect(exit_code=1).exit_code_only
    assert not Expect(exit_code=1, traceback_contains="x").exit_code_only
    assert not Expect.model_validate({"exit_code": 1, "signature": {"signal": "SIGSEGV"}}).exit_code_only


def test_a_venv_under_a_folder_named_torch_is_not_torch():
    """The GPU host's Python lives in /opt/torch/.venv (tests/data/local-gpu/2026-11-27-minimal-etc): its
    result.json, captured before this fix, recorded the frame as `torch/.venv/.../torch/_dynamo/...`. The
    innermost torch frame is the torch package's own path."""
    import json

    from lab.analyze.tracebacks import ExceptionInfo
    data = json.loads((DATA.parent / "local-gpu" / "2026-11-27-minimal-etc" / "result.json").read_text())
    where, _, func = data["signature"]["frame"].partition(" in ")
    assert where.startswith("torch/.venv/")
    exc = ExceptionInfo(type="torch._dynamo.exc.Unsupported", message="x",
                        frames=("/lab/repro/dlpack_compile.py:30 in <module>", f"/opt/{where}:838 in {func}"))
    assert innermost_torch_frame(exc) == "torch/_dynamo/eval_frame.py in compile_wrapper"
