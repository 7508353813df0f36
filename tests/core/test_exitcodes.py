"""lab.exitcodes: the default codes, and `--check`'s mapping onto `git bisect run`'s contract."""

from __future__ import annotations

import pytest

from lab.core import exitcodes as codes


@pytest.mark.parametrize("verdict", ["reproduced", "not_reproduced", "failed_differently", "error", "timeout"])
def test_by_default_every_verdict_exits_0(verdict):
    assert codes.verdict_exit(verdict, check=False) == 0


@pytest.mark.parametrize("verdict, code", [
    ("not_reproduced", 0),   # git bisect: good
    ("reproduced", 1),       # git bisect: bad
    ("error", 125),          # no verdict about the bug: skip
    ("timeout", 125),
    ("failed_differently", 125),  # another failure than the signature: skip, never good or bad
])
def test_check_maps_verdicts_to_git_bisect_run(verdict, code):
    assert codes.verdict_exit(verdict, check=True) == code


@pytest.mark.parametrize("default, checked", [
    (codes.INFRASTRUCTURE, 125),  # engine down, base image, index: skip this commit
    (codes.BAD_INPUT, 128),       # the same on every commit: git bisect run stops (above 127)
    (codes.INTERNAL, 128),
    (codes.INTERRUPTED, 130),
])
def test_check_maps_failures(default, checked):
    assert codes.failure_exit(default, check=False) == default
    assert codes.failure_exit(default, check=True) == checked


def test_check_codes_are_what_git_bisect_run_expects():
    # 0 good; 1-127 except 125 bad; 125 skip; above 127 aborts the bisection.
    assert codes.CHECK_NOT_REPRODUCED == 0
    assert 1 <= codes.CHECK_REPRODUCED <= 127 and codes.CHECK_REPRODUCED != 125
    assert codes.CHECK_SKIP == 125
    assert codes.CHECK_ABORT > 127 and codes.INTERRUPTED > 127


def test_the_table_names_every_default_exit_code_once():
    assert [row[0] for row in codes.TABLE] == [codes.OK, codes.INTERNAL, codes.BAD_INPUT, codes.INFRASTRUCTURE,
                                               codes.DECLINED, codes.INTERRUPTED]
    assert all(name and meaning and ci for _, name, meaning, ci in codes.TABLE)
    text = codes.table_markdown()
    assert text.startswith("| exit | meaning | details | in CI |") and "| 4 | declined |" in text


def test_the_cli_declines_with_the_tables_code():
    from lab.cli import replay
    assert replay.DECLINED == codes.DECLINED == 4
