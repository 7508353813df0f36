"""Wrong-result pages get an oracle or say they have none (issue 28, point 4). Real pages here are of
the tuning set only (tests/data/issues/corpus.json `set`); the oracle code a scenario carries is run
with plain Python values, so no torch is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.analyze.evidence import Evidence
from lab.analyze.judge import judge
from lab.core.results import Verdict
from lab.issue import oracle
from lab.issue.fetch import fetch_issue
from lab.issue.infer import infer
from lab.scenario.model import Expect

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"


def _inf(page_id: str):
    return infer(fetch_issue(str(CORPUS / f"{page_id}.md")))


def _ev(exit_code: int = 0) -> Evidence:
    return Evidence(exit_code=exit_code, timed_out=False, oom_killed=False, duration_s=1.0, emulated=False,
                    processes=0, duplicate_runtimes=(), exceptions=(), emulator_crash=None)


def _run(script: str, tmp_path: Path) -> str:
    path = tmp_path / "s.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_stated_right_value_is_the_oracle_not_the_observed_one():
    inf = _inf("102258")  # `print(b)  # got tensor(28.), it should be 36`
    assert inf.expect == {"stdout_contains": oracle.WRONG}
    fact = inf.fact("expect")
    assert fact.how.startswith("oracle: expected value") and "'36'" in fact.how and fact.line == 21
    assert "expected-value oracle" in inf.script and any("oracle" in f for f in inf.fixups)
    compile(inf.script, "102258.py", "exec")


def test_expected_value_oracle_tells_the_wrong_output_from_the_right_one(tmp_path):
    check = oracle.expected_value([("36", 21), ("1", 23)])
    wrong = _run(check.wrap('print("tensor(28.)")\nprint("tensor(0.7778)")\n'), tmp_path)
    assert oracle.WRONG in wrong and "'36', '1'" in wrong
    right = _run(check.wrap('print("tensor(36.)")\nprint("tensor(1.)")\n'), tmp_path)
    assert oracle.RIGHT in right and oracle.WRONG not in right
    # a whole number is a number, not a substring: 13 and 0.3 do not show 3
    three = oracle.expected_value([("3", 5)])
    assert oracle.WRONG in _run(three.wrap('print("tensor([[[[13.]]]]) 0.3")\n'), tmp_path)
    assert oracle.RIGHT in _run(three.wrap('print("tensor([[[[3.0000]]]])")\n'), tmp_path)


def test_two_computations_the_page_compares_are_the_oracle(tmp_path):
    inf = _inf("183082")  # eager = f(x); compiled = torch.compile(f)(x): "eager = 31, compiled = 13"
    assert inf.expect == {"stdout_contains": oracle.WRONG}
    assert inf.fact("expect").how.startswith("oracle: two computations: eager and compiled")
    check = oracle.two_computations(("eager", "compiled"), 1)
    assert oracle.WRONG in _run(check.wrap("eager = 31\ncompiled = 13\n"), tmp_path)
    assert oracle.RIGHT in _run(check.wrap("eager = [1, 2]\ncompiled = [1, 2]\n"), tmp_path)
    # a repro that exits with its own verdict (183761: sys.exit(0 if they differ else 1)) is still checked
    assert oracle.WRONG in _run(check.wrap("import sys\neager = 31\ncompiled = 13\nsys.exit(0)\n"), tmp_path)
    assert _inf("183761").expect == {"stdout_contains": oracle.WRONG}


def test_no_oracle_line_after_the_page_code_raised(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(oracle.two_computations(("eager", "compiled"), 1).wrap("eager = 1\nraise ValueError('x')\n"))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ValueError" in proc.stderr and oracle.MARK not in proc.stdout


def test_two_printed_results_the_prose_says_should_be_equal():
    inf = _inf("27692")  # "the L1 loss is not equal to torch.abs(x - y).mean()": two print() lines
    assert inf.expect == {"stdout_contains": oracle.WRONG}
    assert "torch.nn.L1Loss()(a, torch.zeros_like(a)) and a.abs().mean()" in inf.fact("expect").how


def test_a_compiled_model_is_not_a_value_to_compare():
    script = ("import torch\nmodel = M()\nc_model = torch.compile(model)\noutput = model(x)\n"
              "c_output = c_model(x)\nprint(torch.allclose(output, c_output))\n")
    assert oracle.compared_pair(script) == ("output", "c_output")


def test_a_wrong_result_page_without_an_oracle_says_so_and_is_an_error(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# torch.foo returns a wrong result\n\nfoo gives the wrong value for large inputs.\n\n"
                    "```python\nimport torch\nx = torch.rand(1000)\ny = torch.foo(x)\n```\n\nPyTorch version: 2.4.1\n")
    inf = infer(fetch_issue(str(page)))
    assert inf.expect == {"stdout_contains": oracle.NONE}
    assert inf.fact("expect").how.startswith("oracle: none") and "error" in inf.fact("expect").how
    assert inf.script.startswith(f"# {oracle.NONE}")
    out = _run(oracle.no_oracle("its title").wrap("x = 1\n"), tmp_path)
    assert out.startswith(oracle.NONE)
    judged = judge(_ev(), Expect.model_validate(inf.expect), out, "")
    assert judged.verdict is Verdict.ERROR and judged.reason.startswith("no oracle")


def test_the_verdict_names_the_oracle():
    out = "tensor(28.)\nLAB-ORACLE: wrong result (expected-value oracle, page line 21): ...\n"
    judged = judge(_ev(), Expect(stdout_contains=oracle.WRONG), out, "")
    assert judged.verdict is Verdict.REPRODUCED and "oracle: LAB-ORACLE: wrong result (expected-value" in judged.reason
    right = "LAB-ORACLE: right result (two-computation oracle): eager and compiled agree\n"
    judged = judge(_ev(), Expect(stdout_contains=oracle.WRONG), right, "")
    assert judged.verdict is Verdict.NOT_REPRODUCED and "two-computation oracle" in judged.reason


def test_pages_that_are_not_wrong_results_keep_their_expectations():
    assert _inf("147282").expect == {"stdout_contains_normalized": "should not run"}
    assert "LAB-ORACLE" not in _inf("147282").script
