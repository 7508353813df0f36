"""Pages read as people write them (issue 28, item 3), on the tuning pages saved for it in
tests/data/issues/ (see tests/data/README.md: these pages were used to tune the inference, so they
are no fair measure of it). No torch runs here: parse and infer only."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from lab.analyze.evidence import Evidence
from lab.analyze.judge import Verdict, judge
from lab.analyze.tracebacks import extract_exceptions
from lab.issue.fetch import IssuePage, fetch_issue
from lab.issue.infer import infer
from lab.issue.parse import Kind, blocks, named_versions, split_output
from lab.issue.releases import BRANCH_CUTS, normalize, shipped_after
from lab.scenario.model import Expect

DATA = Path(__file__).resolve().parents[1] / "data"
PAGES = DATA / "issues"


def _page(name: str):
    return fetch_issue(str(PAGES / f"{name}.md"))


def test_output_pasted_in_the_code_fence_is_split_off():
    # 72594, third block: the code, then `'''output` and the tensor it printed, in one ```python fence
    page = _page("72594")
    third = blocks(page.lines)[2]
    assert third.kind is Kind.SCRIPT
    assert third.code.rstrip().endswith("print(gx)") and "tensor(" not in third.code and "'''" not in third.code
    assert third.output.startswith("tensor([[[[ 0.5557,  0.4501")
    assert page.lines[third.output_line - 1].startswith("tensor([[[[ 0.5557")
    inf = infer(page)
    assert "'''output" not in str(inf.expect)  # the marker is no output (it was the expectation before)
    compile(inf.script, "72594", "exec")


def test_split_output_forms():
    code = "import torch\nx = torch.ones(2)\nprint(x * 2)\n"
    assert split_output(code + "# Output:\ntensor([2., 2.])\n") == (code.strip(), "tensor([2., 2.])", 4)
    assert split_output(code + "tensor([2., 2.])") == (code.strip(), "tensor([2., 2.])", 3)  # no marker
    tail = 'Traceback (most recent call last):\n  File "r.py", line 3, in <module>\nRuntimeError: boom'
    assert split_output(code + tail)[1] == tail
    # output between two pieces of code: both pieces kept, in order
    both = split_output(code + "tensor([2., 2.])\ny = x + 1\nprint(y)\n")
    assert both[0] == code + "y = x + 1\nprint(y)" and both[1] == "tensor([2., 2.])"
    assert split_output(code) is None  # nothing to split off
    assert split_output("tensor([1., 2.])\nTrue") is None  # output only: no code left


def test_a_page_whose_output_block_shows_an_error_expects_it_and_a_pasted_name_error_is_not_it():
    # A page written as many are (hand-made, in the form of the pages above): code and the error it
    # printed in one fence. The error becomes the expectation; the pasted lines never run; and a run
    # that dies of a NameError (output run as code) is failed_differently, not reproduced.
    text = ("### 🐛 Describe the bug\n\n```python\nimport torch\nx = torch.ones(2, 3)\ny = torch.ones(4, 5)\n"
            "print(x @ y)\n# output\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)\n```\n")
    page = IssuePage(text=text, source="page.md", title="matmul error", created=date(2025, 1, 10))
    inf = infer(page)
    assert inf.expect == {"traceback_contains": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"}
    assert "RuntimeError" not in inf.script and "# output" not in inf.script
    assert any("left out the 1 line of output" in f for f in inf.fixups)
    stderr = (DATA / "tracebacks" / "pasted-output-torch2.13.stderr").read_text()
    ev = Evidence(exit_code=1, timed_out=False, oom_killed=False, duration_s=1.0, emulated=False, processes=1,
                  duplicate_runtimes=(), exceptions=tuple(extract_exceptions(stderr)), emulator_crash=None)
    j = judge(ev, Expect.model_validate(inf.expect), "", stderr, script="pasted_output.py")
    assert j.verdict is Verdict.FAILED_DIFFERENTLY


def test_a_headerless_error_line_is_the_expected_signature():
    # 102339: an "Error:" block holding only Dynamo's exception line, no `Traceback` header
    inf = infer(_page("102339"))
    assert inf.expect == {"traceback_contains": "Unsupported"}  # cut to its type: the lab runs another torch


def test_a_shell_block_with_a_traceback_tail_gives_the_expectation():
    text = ("```python\nimport torch\nprint(torch.ones(2).view(3))\n```\n\n```console\n$ python repro.py\n"
            '  File "repro.py", line 2, in <module>\n    print(torch.ones(2).view(3))\n'
            "RuntimeError: shape '[3]' is invalid for input of size 2\n```\n")
    page = IssuePage(text=text, source="page.md", title="view", created=date(2025, 1, 10))
    assert infer(page).expect == {"traceback_contains": "RuntimeError: shape '[3]' is invalid for input of size 2"}


def test_terminate_called_is_an_abort():
    # 51861: "terminate called without an active exception" and return code 134, in a plain fence
    inf = infer(_page("51861"))
    assert inf.expect == {"exit_code": 134}
    assert "an abort (SIGABRT)" in inf.fact("expect").how


def test_source_builds_take_the_release_that_first_shipped_their_code():
    inf = infer(_page("125999"))  # PyTorch version: 2.3.0a0+ebedce2
    assert inf.torch == "2.3.0" and "the release that first shipped its code" in inf.fact("torch").how
    inf = infer(_page("51861"))  # PyTorch version: 1.8.0a0+d462109, older than any cp311 wheel
    assert inf.torch == "1.13.0" and "source build of 1.8.0" in inf.fact("torch").how
    assert normalize("2.0.0.dev20230210+cu118")[0] == "2.0.0"
    assert normalize("2.5.0rc1") == ("2.5.0", "2.5.0rc1 is a release candidate of 2.5.0: 2.5.0, the release that "
                                              "first shipped its code")


def test_main_by_date_takes_the_release_whose_branch_cut_came_after():
    assert [v for v, _ in BRANCH_CUTS][:2] == ["2.1", "2.2"]
    assert shipped_after(date(2023, 9, 2))[0] == "2.2.0"      # after 2.1's cut (Aug 2023)
    assert shipped_after(date(2026, 2, 16))[0] == "2.11.0"    # the day of 2.11's cut
    assert shipped_after(date(2026, 2, 17))[0] == "2.12.0"
    assert shipped_after(date(2023, 1, 27)) is None           # 2.0's cut is not in the table
    assert shipped_after(date(2026, 11, 1)) is None           # 2.16 is not out
    text = "```python\nimport torch\nprint(torch.ones(2))\n```\nI am on a nightly from 2024-07-02.\n"
    page = IssuePage(text=text, source="p.md", title="t", created=date(2024, 7, 3))
    inf = infer(page)
    assert inf.torch == "2.5.0" and inf.fact("torch").line == 5 and "main on 2024-07-02" in inf.fact("torch").how


def test_environment_blocks_pin_what_they_name():
    # 106171: transformers-cli's environment block
    page = _page("106171")
    env = [b for b in blocks(page.lines) if b.kind is Kind.ENV]
    assert len(env) == 1 and env[0].text.startswith("transformers version: 4.31.0")
    inf = infer(page)
    assert inf.torch == "2.0.0" and "PyTorch version (GPU?): 2.0.0+cu117" in inf.fact("torch").how
    assert "transformers==4.31.0" in inf.pip
    lines = ["- PyTorch Lightning Version (e.g., 1.5.0): 2.0.2", "- PyTorch Version (e.g., 2.0): 2.0.1",
             "numpy==1.26.4", "[pip3] triton==2.1.0", "Python version: 3.10.12", "torch==2.1.0"]
    assert named_versions(lines) == {"pytorch-lightning": ("2.0.2", 1), "numpy": ("1.26.4", 3),
                                     "triton": ("2.1.0", 4)}


def test_an_error_named_only_in_the_title():
    # Lightning-AI/pytorch-lightning#18123: the error only in the title; the stored excerpt cuts the code
    # mid-call, so there is no script to run (refused), but the title's error is read
    from lab.issue.infer import _title_or_comment_exception
    page = _page("lightning-18123")
    found = blocks(page.lines)
    assert found[0].kind is Kind.OUTPUT  # cut mid-call: not Python
    named = _title_or_comment_exception(page, found[0])
    assert named[0] == "AttributeError: '_ResultMetric' object has no attribute '_forward_pre_hooks'"
    assert named[2] == "the exception the title names"


def test_a_raises_comment_and_a_quoted_warning():
    text = ("```python\nimport torch\nx = torch.ones(2)\ntorch.compile(lambda t: t.item())(x)  "
            "# raises Unsupported: Tensor.item\n```\n")
    page = IssuePage(text=text, source="p.md", title="t", created=date(2025, 1, 10))
    assert infer(page).expect == {"traceback_contains": "Unsupported: Tensor.item"}
    text = ("```python\nimport torch\nx = torch.arange(3)\nprint(torch.range(1, 3))\n```\n\nIt warns:\n\n"
            "> /usr/lib/python3/site-packages/torch/x.py:12: UserWarning: torch.range is deprecated and will be "
            "removed\n")
    page = IssuePage(text=text, source="p.md", title="t", created=date(2025, 1, 10))
    inf = infer(page)
    assert inf.expect == {"stderr_contains": "UserWarning: torch.range is deprecated and will be removed"}
    assert inf.fact("expect").line == 9


def test_real_pages_name_their_error_in_a_two_line_raises_comment_or_only_in_the_title():
    # 146538 (tuning): `# doesn't work, raises` then `# Unsupported: call_function ...` above the failing call
    inf = infer(_page("146538"))
    assert inf.expect == {"traceback_contains": "Unsupported"}
    assert inf.fact("expect").line == 25 and "named in the script's comments" in inf.fact("expect").how
    # 93380 (tuning): the CppCompileError is only in the title; the excerpt shows no traceback
    inf = infer(_page("93380"))
    assert inf.expect == {"traceback_contains": "CppCompileError: C++ compile error"}
    assert inf.fact("expect").how == "the exception the title names"
