"""The judge's rules, on evidence built from the real analysis types."""

from lab.analyze.evidence import Evidence
from lab.analyze.judge import Verdict, build_failed, judge
from lab.analyze.loader import DuplicateRuntime, LoadedObject
from lab.analyze.tracebacks import ExceptionInfo
from lab.scenario.model import Expect

TWO_GOMP = DuplicateRuntime("libgomp", "GNU OpenMP", 1, (
    LoadedObject("/opt/venv/lib/python3.11/site-packages/torch.libs/libgomp-947d5fa1.so.1.0.0",
                 "libgomp-947d5fa1.so.1.0.0", "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
                 "needed", True),
    LoadedObject("/lib/aarch64-linux-gnu/libgomp.so.1", "libgomp.so.1",
                 "/tmp/torchinductor_root/ab/cabc.so", "needed", True)))
DLPACK = ExceptionInfo("torch._dynamo.exc.Unsupported",
                       "Attempted to call function marked as skipped\n  Explanation: Dynamo does not know how to "
                       "trace the builtin `torch._C._to_dlpack.`")


def evidence(**kw) -> Evidence:
    base = dict(exit_code=0, timed_out=False, oom_killed=False, duration_s=12.0, emulated=True, processes=3,
                duplicate_runtimes=(), exceptions=(), emulator_crash=None)
    base.update(kw)
    return Evidence(**base)


def test_duplicate_runtime_reproduced_and_not():
    expect = Expect(duplicate_runtime="libgomp", exit_code=0)
    j = judge(evidence(duplicate_runtimes=(TWO_GOMP,)), expect, "", "")
    assert j.verdict is Verdict.REPRODUCED
    assert all(c.held for c in j.checks)
    j = judge(evidence(), expect, "", "")
    assert j.verdict is Verdict.NOT_REPRODUCED
    assert "duplicate_runtime" in j.reason


def test_traceback_must_be_the_same_error():
    expect = Expect(traceback_contains="does not know how to trace the builtin `torch._C._to_dlpack", exit_code=1)
    assert judge(evidence(exit_code=1, exceptions=(DLPACK,)), expect, "", "").verdict is Verdict.REPRODUCED
    other = ExceptionInfo("RuntimeError", "CUDA is not available")
    j = judge(evidence(exit_code=1, exceptions=(other,)), expect, "", "")
    # a different crash is not a reproduction, nor an absence of the bug: it failed differently,
    # with both signatures side by side
    assert j.verdict is Verdict.FAILED_DIFFERENTLY
    assert "RuntimeError: CUDA is not available" in j.reason
    assert j.different.expected == ("an exception containing 'does not know how to trace the builtin "
                                    "`torch._C._to_dlpack', exit code 1")
    assert j.different.observed == "RuntimeError: CUDA is not available, exit code 1"


def test_a_run_that_exits_cleanly_without_the_signature_is_not_reproduced():
    expect = Expect(traceback_contains="capture is disabled", exit_code=1)
    j = judge(evidence(exit_code=0), expect, "SUCCESS", "")
    assert j.verdict is Verdict.NOT_REPRODUCED and j.different is None


def test_all_expectations_must_hold():
    expect = Expect(stdout_contains="checksum", exit_code=0)
    assert judge(evidence(), expect, "checksum=1.0", "").verdict is Verdict.REPRODUCED
    assert judge(evidence(exit_code=3), expect, "checksum=1.0", "").verdict is Verdict.FAILED_DIFFERENTLY
    assert judge(evidence(), expect, "nothing", "").verdict is Verdict.NOT_REPRODUCED
    assert judge(evidence(), Expect(stderr_contains="Segmentation"), "", "a warning").verdict is Verdict.NOT_REPRODUCED


def test_timeout_wins():
    j = judge(evidence(timed_out=True, exit_code=None, duration_s=30), Expect(exit_code=0), "", "")
    assert j.verdict is Verdict.TIMEOUT and "30 s" in j.reason


def test_emulator_crash_is_an_error_not_a_verdict_on_the_bug():
    j = judge(evidence(exit_code=139, emulator_crash="qemu: uncaught target signal 11 (Segmentation fault)"),
              Expect(duplicate_runtime="libgomp"), "", "")
    assert j.verdict is Verdict.ERROR
    assert j.reason == "crashed under emulation; confirm on native arm64"


def test_out_of_memory_is_an_error_unless_expected():
    assert judge(evidence(oom_killed=True, exit_code=137), Expect(exit_code=0), "", "").verdict is Verdict.ERROR
    assert judge(evidence(oom_killed=True, exit_code=137), Expect(exit_code=137), "", "").verdict \
        is Verdict.REPRODUCED


def test_torch_that_does_not_import_is_an_error():
    broken = ExceptionInfo("ModuleNotFoundError", "No module named 'torch'")
    j = judge(evidence(exit_code=1, exceptions=(broken,)), Expect(traceback_contains="dlpack"), "", "")
    assert j.verdict is Verdict.ERROR and "No module named 'torch'" in j.reason


def test_a_failed_build_is_an_error():
    assert build_failed("pip could not find torch==9.9").verdict is Verdict.ERROR


def test_an_exception_without_message_is_reported():
    j = judge(evidence(exit_code=130, exceptions=(ExceptionInfo("KeyboardInterrupt", ""),)),
              Expect(traceback_contains="dlpack"), "", "")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY and "KeyboardInterrupt" in j.reason
    assert "the script raised `KeyboardInterrupt`" in evidence(exceptions=(ExceptionInfo("KeyboardInterrupt", ""),)
                                                               ).plain_words()


def test_evidence_names_the_user_code_of_a_graph_break():
    from pathlib import Path

    from lab.analyze.tracebacks import final_exception
    stderr = (Path(__file__).resolve().parents[1] / "data" / "tracebacks" /
              "dlpack-torch2.9.0-arm64.stderr").read_text()
    words = evidence(exit_code=1, exceptions=(final_exception(stderr),)).plain_words()
    assert "in user code: /lab/repro/dlpack_compile.py, line 23, in forward: " \
           "`dlpack = torch.utils.dlpack.to_dlpack(x_uint8)`" in words


def test_stdout_contains_normalized_ignores_whitespace():
    # real torch output (105264's) against the same text as pasted into a page, with its padding lost
    stdout = "tensor(0, dtype=torch.int16)\ntensor(256,  dtype=torch.int16)\n"
    expect = Expect(stdout_contains_normalized="tensor(256, dtype=torch.int16)")
    assert judge(evidence(), expect, stdout, "").verdict is Verdict.REPRODUCED
    assert judge(evidence(), expect, "tensor(0, dtype=torch.int16)\n", "").verdict is Verdict.NOT_REPRODUCED
    assert judge(evidence(), Expect(stdout_contains="tensor(256, dtype=torch.int16)"), stdout, "").verdict \
        is Verdict.NOT_REPRODUCED


def test_graph_breaks_min_needs_the_diagnose_count():
    from types import SimpleNamespace
    expect = Expect(graph_breaks_min=1)
    assert expect.needs_graph_breaks
    assert judge(evidence(), expect, "", "", SimpleNamespace(graph_break_count=2)).verdict is Verdict.REPRODUCED
    assert judge(evidence(), expect, "", "", SimpleNamespace(graph_break_count=0)).verdict is Verdict.NOT_REPRODUCED
    assert judge(evidence(), expect, "", "", None).verdict is Verdict.ERROR


def test_a_list_of_exit_codes_counts_any_one_of_them():
    expect = Expect(exit_code=[134, 139])  # a page that shows an abort or a segfault
    assert expect.exit_code == (134, 139) and expect.exit_codes == (134, 139)
    for code in (134, 139):
        j = judge(evidence(exit_code=code), expect, "", "")
        assert j.verdict is Verdict.REPRODUCED, j.reason
    j = judge(evidence(exit_code=1), expect, "", "")
    assert j.verdict is not Verdict.REPRODUCED and "134 or 139" in j.reason
    assert Expect(exit_code=1).exit_codes == (1,) and Expect(stdout_contains="x").exit_codes == ()
