"""Tests for lab.tracebacks on real captured stderr (see tests/data/README.md) plus small snippets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.analyze.tracebacks import ExceptionInfo, GraphBreak, extract_exceptions, final_exception

DATA = Path(__file__).resolve().parents[1] / "data" / "tracebacks"


def _read(name: str) -> str:
    return (DATA / name).read_text()


# --- the DLPack bug (torch 2.13, CPU) -------------------------------------------------------------

DLPACK_EXPLANATION = (
    "Dynamo does not know how to trace the builtin `torch._C._to_dlpack.` This function is either a "
    "Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created "
    "with pybind)."
)


@pytest.mark.parametrize("name", ["dlpack-torch2.13-cpu.stderr", "dlpack-torch2.13-cpu-verbose.stderr"])
def test_dlpack_unsupported(name):
    exc = final_exception(_read(name))
    assert exc is not None
    assert exc.type == "torch._dynamo.exc.Unsupported"
    assert exc.name == "Unsupported"
    assert exc.message.startswith("Attempted to call function marked as skipped\n  Explanation: ")
    assert exc.message.endswith("compile-graph-break-site/gb/gb0007.html")
    assert "from user code" not in exc.message
    assert "TORCHDYNAMO_VERBOSE" not in exc.message
    assert exc.frames[0] == "/tmp/tb/dlpack.py:9 in <module>"
    gb = exc.graph_break
    assert gb is not None
    assert gb.reason == "Attempted to call function marked as skipped"
    assert gb.explanation == DLPACK_EXPLANATION
    assert len(gb.hints) == 2
    assert gb.hints[1].endswith("use `torch.compiler.allow_in_graph`.")
    assert gb.user_code == (
        'File "/tmp/tb/dlpack.py", line 5, in forward\n'
        "    d = torch.utils.dlpack.to_dlpack(x.to(torch.uint8))",
    )
    assert gb.details == (
        "module: torch._C, qualname: _to_dlpack, skip reason: cannot determine source file for "
        "torch._C (likely a C extension or builtin)"
    )
    assert gb.doc_url == "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0007.html"


def test_dlpack_warning_before_the_traceback_is_not_an_exception():
    found = extract_exceptions(_read("dlpack-torch2.13-cpu.stderr"))
    assert [e.type for e in found] == ["torch._dynamo.exc.Unsupported"]
    assert len(found[0].frames) == 5


def test_verbose_dynamo_traceback_keeps_the_internal_frames():
    exc = final_exception(_read("dlpack-torch2.13-cpu-verbose.stderr"))
    assert exc is not None
    assert len(exc.frames) == 28
    assert exc.frames[-1].endswith("torch/_dynamo/exc.py:727 in unimplemented")


# --- graph breaks under fullgraph=True -----------------------------------------------------------


def test_data_dependent_branch_graph_break():
    exc = final_exception(_read("graph-break-data-dependent-if-torch2.13.stderr"))
    assert exc is not None and exc.graph_break is not None
    gb = exc.graph_break
    assert gb.reason == "Data-dependent branching"
    assert gb.explanation is not None
    assert gb.explanation.startswith("Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`).")
    assert "gt = gt(sum_1, 0)" in gb.explanation
    assert gb.hints[-1] == "Use `torch.cond` to express dynamic control flow."
    assert len(gb.hints) == 3
    assert gb.details == "attempted to jump with TensorVariable()"
    assert gb.user_code == ('File "/tmp/tb/datadep.py", line 5, in f\n    if x.sum() > 0:',)


def test_print_graph_break():
    exc = final_exception(_read("graph-break-print-torch2.13.stderr"))
    assert exc is not None and exc.graph_break is not None
    gb = exc.graph_break
    assert gb.reason == "Failed to trace builtin operator"
    assert gb.explanation == (
        "Dynamo does not know how to trace builtin operator `print` with argument types ['str'] "
        "(has_kwargs False)")
    assert gb.hints[2] == "Please report an issue to PyTorch."
    assert gb.user_code == ('File "/tmp/tb/printbreak.py", line 6, in f\n    print("y computed")',)


# --- plain Python --------------------------------------------------------------------------------


def test_raise_from_is_two_exceptions_in_order():
    found = extract_exceptions(_read("chained-raise-from-py3.11.stderr"))
    assert [(e.type, e.message) for e in found] == [
        ("json.decoder.JSONDecodeError",
         "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("ValueError", "bad config: '{not json'"),
    ]
    assert found[1].frames == (
        "/tmp/tb/chained.py:16 in <module>", "/tmp/tb/chained.py:12 in main",
        "/tmp/tb/chained.py:8 in load_config")
    assert all(e.graph_break is None for e in found)
    assert final_exception(_read("chained-raise-from-py3.11.stderr")) == found[1]


def test_during_handling_chain():
    found = extract_exceptions(_read("during-handling-torch2.13.stderr"))
    assert [e.type for e in found] == ["FileNotFoundError", "ValueError"]
    assert found[0].message == "[Errno 2] No such file or directory: '/nonexistent/checkpoint.pt'"
    assert found[1].message == "invalid literal for int() with base 10: 'three'"


def test_warnings_before_the_traceback():
    found = extract_exceptions(_read("warnings-then-matmul-error-torch2.13.stderr"))
    assert found == [ExceptionInfo(
        "RuntimeError", "mat1 and mat2 shapes cannot be multiplied (4x4 and 3x5)",
        ("/tmp/tb/warnings_then_error.py:9 in <module>",))]


def test_keyboard_interrupt_has_no_message():
    exc = final_exception(_read("keyboard-interrupt-py3.11.stderr"))
    assert exc == ExceptionInfo("KeyboardInterrupt", "", ("/tmp/tb/keyboard_interrupt.py:6 in <module>",))


def test_syntax_error_of_the_script_has_no_traceback_header():
    exc = final_exception(_read("syntax-error-script-py3.11.stderr"))
    assert exc == ExceptionInfo("SyntaxError", "'(' was never closed", ("/tmp/tb/syntax_error.py:3",))


def test_syntax_error_of_an_imported_module():
    exc = final_exception(_read("syntax-error-import-py3.11.stderr"))
    assert exc is not None
    assert (exc.type, exc.message) == ("SyntaxError", "expected ':'")
    assert exc.frames == ("/tmp/tb/syntax_import.py:3 in <module>", "/tmp/tb/pkg/broken_mod.py:2")


def test_traceback_module_output_interleaved_with_stdout_and_logging():
    found = extract_exceptions(_read("traceback-module-interleaved-torch2.13.combined"))
    assert [(e.type, e.message) for e in found] == [
        ("AssertionError", "Torch not compiled with CUDA enabled"),
        ("ValueError", "invalid literal for int() with base 10: 'seven'"),
        ("RuntimeError", "could not parse the thread count 'seven'"),
    ]
    assert found[0].frames[-1].endswith("torch/cuda/__init__.py:522 in _lazy_init")


def test_no_exception():
    assert extract_exceptions("") == []
    assert final_exception("all good\nWARNING:root:nothing to see\n") is None


# --- hand-made snippets in older torch formats ----------------------------------------------------
# Written by hand in the layout torch 2.1-2.5 printed; not captured (no old wheel on this host).

OLD_PRINT = """\
Traceback (most recent call last):
  File "/work/repro.py", line 9, in <module>
    print(f(torch.randn(8)))
  File "/usr/local/lib/python3.10/site-packages/torch/_dynamo/eval_frame.py", line 328, in _fn
    return fn(*args, **kwargs)
  File "/usr/local/lib/python3.10/site-packages/torch/_dynamo/exc.py", line 193, in unimplemented
    raise Unsupported(msg)
torch._dynamo.exc.Unsupported: call_function BuiltinVariable(print) [ConstantVariable(str)] {}

from user code:
   File "/work/repro.py", line 12, in forward
    return helper(x)
   File "/work/repro.py", line 6, in helper
    print("y computed")

Set TORCH_LOGS="+dynamo" and TORCHDYNAMO_VERBOSE=1 for more information


You can suppress this exception and fall back to eager by setting:
    import torch._dynamo
    torch._dynamo.config.suppress_errors = True

"""

OLD_DLPACK = """\
W1122 12:00:00.123000 140 torch/_dynamo/convert_frame.py:1125] WON'T CONVERT forward /work/repro.py
Traceback (most recent call last):
  File "/work/repro.py", line 10, in <module>
    print(m(torch.rand(2).bool()))
torch._dynamo.exc.Unsupported: 'skip function _to_dlpack in file SITE/torch/utils/dlpack.py'

from user code:
   File "/work/repro.py", line 5, in forward
    d = torch.utils.dlpack.to_dlpack(x.to(torch.uint8))

Set TORCH_LOGS="+dynamo" and TORCHDYNAMO_VERBOSE=1 for more information

""".replace("SITE", "/usr/local/lib/python3.11/site-packages")


def test_old_call_function_message():
    exc = final_exception(OLD_PRINT)
    assert exc is not None
    assert exc.message == "call_function BuiltinVariable(print) [ConstantVariable(str)] {}"
    assert exc.graph_break == GraphBreak(
        reason="call_function BuiltinVariable(print) [ConstantVariable(str)] {}",
        user_code=('File "/work/repro.py", line 12, in forward\n    return helper(x)',
                   'File "/work/repro.py", line 6, in helper\n    print("y computed")'),
    )


def test_old_skip_function_message():
    exc = final_exception(OLD_DLPACK)
    assert exc is not None and exc.graph_break is not None
    assert exc.message == (
        "'skip function _to_dlpack in file /usr/local/lib/python3.11/site-packages/torch/utils/dlpack.py'")
    assert exc.graph_break.reason == exc.message
    assert exc.graph_break.explanation is None and exc.graph_break.hints == ()
    assert len(exc.graph_break.user_code) == 1


def test_rank_prefixes_and_crlf_are_tolerated():
    text = "".join(f"[rank0]: {line}\r\n" for line in _read("keyboard-interrupt-py3.11.stderr").splitlines())
    exc = final_exception(text)
    assert exc is not None and exc.type == "KeyboardInterrupt"


def test_truncated_traceback_has_no_exception():
    text = _read("chained-raise-from-py3.11.stderr")
    cut = text[: text.rindex("ValueError: bad config")]
    assert [e.type for e in extract_exceptions(cut)] == ["json.decoder.JSONDecodeError"]


def test_multiline_message_ends_at_the_next_traceback():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
            "RuntimeError: CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`.\n\n"
            + _read("keyboard-interrupt-py3.11.stderr"))
    first, second = extract_exceptions(text)
    assert first.message == "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`."
    assert second.type == "KeyboardInterrupt"


# --- robustness ---------------------------------------------------------------------------------

_FRAGMENTS = sorted({
    line for path in DATA.glob("*.*") if path.is_file() for line in path.read_text().splitlines()
})


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from(_FRAGMENTS),
    st.sampled_from(_FRAGMENTS).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n])),
    st.text(max_size=60),
), max_size=40))
def test_extract_exceptions_never_raises(lines):
    text = "\n".join(lines)
    found = extract_exceptions(text)
    assert final_exception(text) == (found[-1] if found else None)


def test_dlpack_torch_2_9_0_as_captured_by_the_lab():
    exc = final_exception((DATA / "dlpack-torch2.9.0-arm64.stderr").read_text())
    assert exc is not None and exc.type == "torch._dynamo.exc.Unsupported"
    assert exc.message.startswith("Attempted to call function marked as skipped")
    assert "does not know how to trace the builtin `torch._C._to_dlpack.`" in exc.graph_break.explanation
    assert exc.graph_break.user_code[-1].startswith('File "/lab/repro/dlpack_compile.py", line 23, in forward')
