"""lab.drivers.ddmin: delta debugging over a set of changes, with a fake test function."""

from __future__ import annotations

import pytest

from lab.drivers.ddmin import ddmin

PACKAGES = ["filelock", "fsspec", "jinja2", "markupsafe", "mpmath", "networkx", "numpy", "sympy",
            "typing-extensions"]


def flips_when(*needed: str):
    calls: list[tuple[str, ...]] = []

    def test(subset: tuple[str, ...]) -> bool:
        calls.append(subset)
        return set(needed) <= set(subset)
    return test, calls


def test_one_culprit_among_nine_is_found_in_a_few_tests():
    test, calls = flips_when("numpy")
    found = ddmin(PACKAGES, test)
    assert found.minimal == ("numpy",)
    assert len(calls) <= 8 and len(set(calls)) == len(calls)  # each subset tested once
    assert [t[0] for t in found.tests] == calls


def test_two_culprits_that_flip_only_together_are_both_named():
    test, _ = flips_when("jinja2", "sympy")
    assert ddmin(PACKAGES, test).minimal == ("jinja2", "sympy")


@pytest.mark.parametrize("culprit", PACKAGES)
def test_every_single_culprit_is_found(culprit):
    test, _ = flips_when(culprit)
    assert ddmin(PACKAGES, test).minimal == (culprit,)


def test_the_answer_is_one_minimal():
    test, _ = flips_when("fsspec", "mpmath", "typing-extensions")
    found = ddmin(PACKAGES, test).minimal
    assert set(found) == {"fsspec", "mpmath", "typing-extensions"}
    for left_out in found:
        assert not test(tuple(x for x in found if x != left_out))


def test_an_unresolved_test_counts_as_not_flipping():
    def test(subset):
        if "jinja2" in subset and "markupsafe" not in subset:
            return None  # jinja2 without its markupsafe does not install: no verdict
        return "numpy" in subset
    assert ddmin(PACKAGES, test).minimal == ("numpy",)


def test_a_whole_set_that_does_not_flip_gives_nothing_when_asked_to_check():
    test, calls = flips_when("absent")
    assert ddmin(PACKAGES, test, all_flips_known=False).minimal == ()
    assert calls == [tuple(PACKAGES)]


def test_one_or_no_item():
    test, calls = flips_when("numpy")
    assert ddmin(["numpy"], test).minimal == ("numpy",) and calls == []
    assert ddmin([], test).minimal == ()
