"""Which release a 1.13 nightly is, and which Python a release runs in (issue 28: generic environment
facts, valid for every page)."""

from datetime import date

from lab.issue.releases import python_for, shipped_after, wheel_pythons


def test_main_before_the_1_13_branch_cut_is_1_13_0_and_after_it_is_not_placed():
    # the 1.13 release tracker (pytorch/pytorch#86312, 2022-10-05) says release/1.13 was cut by then
    assert shipped_after(date(2022, 9, 15))[0] == "1.13.0"
    assert shipped_after(date(2022, 10, 5))[0] == "1.13.0"
    assert shipped_after(date(2022, 11, 1)) is None   # 2.0's cut is not known: not guessed


def test_a_release_runs_in_the_base_python_when_it_has_wheels_for_it_else_the_nearest_older_one():
    assert "3.11" not in wheel_pythons("1.12.1") and "3.10" in wheel_pythons("1.12.1")
    assert python_for("1.12.1", "3.11") == "3.10"
    assert python_for("2.0.0", "3.9") == "3.9"     # debian:bullseye, for torch.compile before 2.1.0
    assert python_for("2.15.0", "3.9") == "3.11"   # 2.15.0 has no cp39 or cp310 wheel: the oldest it has
    assert python_for("2.9.0", "3.9") == "3.10"
    assert wheel_pythons("0.2.0") == () and python_for("0.2.0", "3.11") is None


def test_a_page_on_a_release_without_a_python_3_11_wheel_keeps_it_on_a_base_it_has_wheels_for():
    from lab.issue.fetch import IssuePage
    from lab.issue.infer import infer
    from lab.issue.releases import normalize
    # collect_env's lines as people paste them, on torch 1.12.1 (wheels for 3.8 to 3.10 only)
    text = ("```python\nimport torch\nx = torch.ones(3)\ntorch.neg(x, out=x[1:])\n```\n\n"
            "Segmentation fault (core dumped)\n\n```\nPyTorch version: 1.12.1+cu113\nIs debug build: False\n"
            "Python version: 3.8.10 (default, Jun 22 2022, 20:18:18)  [GCC 9.4.0] (64-bit runtime)\n```\n")
    inf = infer(IssuePage(text=text, source="page.md", title="neg out= segfault", created=date(2022, 9, 1)))
    assert inf.torch == "1.12.1" and inf.base == "ubuntu:22.04" and inf.fact("python").value == "3.10"
    assert any("no wheel for Python 3.11" in f for f in inf.fixups)
    assert normalize("1.12.0a0+git1a2b3c")[0] == "1.12.0"
    assert normalize("1.8.0")[0] == "1.13.0"   # older than the releases the lab knows: its oldest, as before
