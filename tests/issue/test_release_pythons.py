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
