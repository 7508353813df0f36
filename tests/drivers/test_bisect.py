"""lab.bisect: the pure search, driven by a fake runner."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.analyze.judge import Verdict
from lab.core.errors import LabError
from lab.drivers.bisect import (
    AMBIGUOUS,
    FOUND,
    NO_CHANGE,
    NO_RUNNABLE_PAIR,
    BisectError,
    Probe,
    bisect,
    cost_bound,
    outcome_of,
    rounds_bound,
)

R, N, E, T = "reproduced", "not_reproduced", "error", "timeout"
VERSIONS = ["2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0",
            "2.13.0", "2.14.0", "2.15.0"]


class FakeRunner:
    """Answers from a table of raw verdicts; records what it was asked."""

    def __init__(self, versions, verdicts, reasons=None):
        self.table = dict(zip(versions, verdicts, strict=True))
        self.reasons = reasons or {}
        self.asked: list[str] = []

    def __call__(self, version: str) -> Probe:
        self.asked.append(version)
        verdict = self.table[version]
        return Probe.judged(version, verdict, reason=self.reasons.get(version, ""),
                            evidence=f"evidence of {version}", run_dir=f"runs/{version}")


def run(verdicts, versions=None, reasons=None):
    versions = versions or [f"1.{i}.0" for i in range(len(verdicts))]
    runner = FakeRunner(versions, verdicts, reasons)
    return bisect(versions, runner), runner


def regression_at(k: int, b: int) -> list[str]:
    return [N] * b + [R] * (k - b)


# -- outcome_of and Probe ---------------------------------------------------------------------

def test_outcome_of_maps_verdicts_and_enum():
    assert outcome_of("reproduced") == "reproduced"
    assert outcome_of(Verdict.NOT_REPRODUCED) == "not_reproduced"
    assert outcome_of("error") == outcome_of(Verdict.TIMEOUT) == "skip"
    with pytest.raises(ValueError, match="unknown verdict"):
        outcome_of("flaky")


def test_probe_keeps_raw_verdict_and_outcome():
    p = Probe.judged("2.13.0", Verdict.ERROR, reason="crashed under emulation")
    assert (p.outcome, p.verdict, p.skipped) == ("skip", "error", True)
    assert Probe(version="2.5.1", outcome="reproduced").verdict == "reproduced"
    assert Probe(version="2.5.1", outcome="skip").verdict == "skip"
    with pytest.raises(ValueError):
        Probe(version="2.5.1", outcome="good")
    with pytest.raises(ValueError, match="contradicts"):
        Probe(version="2.5.1", outcome="reproduced", verdict="error")


def test_cost_bound():
    assert [cost_bound(k) for k in (1, 2, 3, 4, 5, 8, 9, 13, 16, 17)] == [2, 3, 4, 4, 5, 5, 6, 6, 6, 7]


# -- order and directions -------------------------------------------------------------------------

def test_ends_first_then_halving():
    versions = [f"v{i}" for i in range(8)]
    result, runner = run(regression_at(8, 6), versions)
    assert runner.asked[:2] == ["v0", "v7"]
    assert runner.asked == ["v0", "v7", "v3", "v5", "v6"]
    assert [p.version for p in result.steps] == runner.asked
    assert (result.status, result.last_old, result.first_new) == (FOUND, "v5", "v6")


def test_regression():
    result, _ = run(regression_at(len(VERSIONS), 4), VERSIONS)
    assert result.status == FOUND and not result.ambiguous
    assert (result.from_verdict, result.to_verdict) == (N, R)
    assert (result.last_old, result.first_new) == ("2.7.1", "2.8.0")
    assert result.direction == "regression"
    assert result.summary == ("first release that behaves like 2.15.0 (reproduced): 2.8.0; "
                              "last like 2.5.1 (not_reproduced): 2.7.1.")


def test_fix():
    verdicts = [R] * 9 + [N] * 4
    result, _ = run(verdicts, VERSIONS)
    assert (result.status, result.from_verdict, result.to_verdict) == (FOUND, R, N)
    assert (result.last_old, result.first_new) == ("2.11.0", "2.12.0")
    assert result.direction == "fix"


def test_every_boundary_position_found():
    for k in range(2, 20):
        for b in range(1, k):
            result, runner = run(regression_at(k, b))
            assert result.first_new == f"1.{b}.0" and result.last_old == f"1.{b - 1}.0"
            assert len(runner.asked) <= cost_bound(k)
            assert len(set(runner.asked)) == len(runner.asked), "a release was probed twice"


# -- skips ----------------------------------------------------------------------------------------

def test_skipped_new_end_walks_inwards_and_says_so():
    verdicts = [N, N, N, N, N, N, R, R, R, R, E, E, E]  # 2.13.0 .. 2.15.0 crash under QEMU
    reasons = {v: "crashed under emulation; confirm on native arm64" for v in VERSIONS[10:]}
    result, runner = run(verdicts, VERSIONS, reasons)
    assert runner.asked[:5] == ["2.5.1", "2.15.0", "2.14.0", "2.13.0", "2.12.0"]
    assert result.new_end == "2.12.0" and result.to_verdict == R
    assert result.to_version == "2.15.0"
    assert (result.status, result.last_old, result.first_new) == (FOUND, "2.9.0", "2.9.1")
    assert result.notes[0] == ("2.15.0 skipped: crashed under emulation; confirm on native arm64; "
                               "2.14.0 skipped: crashed under emulation; confirm on native arm64; "
                               "2.13.0 skipped: crashed under emulation; confirm on native arm64; "
                               "using 2.12.0 as the new end")
    assert result.skipped == ("2.15.0", "2.14.0", "2.13.0")


def test_skipped_old_end_walks_inwards():
    verdicts = [T, E, N, N, N, N, N, N, R, R, R, R, R]
    result, runner = run(verdicts, VERSIONS)
    assert runner.asked[:4] == ["2.5.1", "2.15.0", "2.6.0", "2.7.0"]
    assert result.old_end == "2.7.0" and result.from_verdict == N
    assert result.notes[0] == "2.5.1 skipped: timeout; 2.6.0 skipped: error; using 2.7.0 as the old end"
    assert (result.last_old, result.first_new) == ("2.10.0", "2.11.0")


def test_skipped_midpoint_tries_neighbours_alternately():
    versions = [f"v{i}" for i in range(9)]
    verdicts = [N, N, E, E, E, E, R, R, R]
    result, runner = run(verdicts, versions)
    # the middle v4 is skipped, then v3, v5, v2 (nearest first, alternating), then v6 and v1
    assert runner.asked[:6] == ["v0", "v8", "v4", "v3", "v5", "v2"]
    assert result.status == AMBIGUOUS and result.ambiguous
    assert (result.last_old, result.first_new) == ("v1", "v6")
    assert result.skipped_between == ("v2", "v3", "v4", "v5")


def test_skip_in_middle_still_finds_exact_boundary():
    verdicts = [N, N, N, N, N, N, E, N, N, R, R, R, R]
    result, runner = run(verdicts, VERSIONS)
    assert runner.asked[:4] == ["2.5.1", "2.15.0", "2.9.1", "2.9.0"]  # the skipped middle, then its neighbour
    assert (result.status, result.last_old, result.first_new) == (FOUND, "2.11.0", "2.12.0")
    assert "2.9.1 skipped: error" in result.notes


def test_all_middle_skipped_is_ambiguous_with_range_named():
    verdicts = [N] + [E] * 11 + [R]
    result, runner = run(verdicts, VERSIONS)
    assert result.status == AMBIGUOUS
    assert (result.last_old, result.first_new) == ("2.5.1", "2.15.0")
    assert result.skipped_between == tuple(VERSIONS[1:-1])
    assert sorted(runner.asked, key=VERSIONS.index) == VERSIONS
    assert "ambiguous" in result.summary and "2.5.1" in result.summary and "2.15.0" in result.summary
    data = result.to_json()
    assert data["ambiguous"] is True and data["status"] == "ambiguous"
    assert data["skipped_between"] == VERSIONS[1:-1]


def test_skipped_release_never_a_boundary():
    verdicts = [N, N, N, E, E, R, R]
    result, _ = run(verdicts)
    assert result.last_old == "1.2.0" and result.first_new == "1.5.0"
    assert result.skipped_between == ("1.3.0", "1.4.0")


# -- edges ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("verdicts, status, old, new", [
    ([N, R], FOUND, "1.0.0", "1.1.0"),
    ([R, N], FOUND, "1.0.0", "1.1.0"),
    ([R, R], NO_CHANGE, None, None),
    ([N, N], NO_CHANGE, None, None),
    ([E, R], NO_RUNNABLE_PAIR, None, None),
    ([N, T], NO_RUNNABLE_PAIR, None, None),
    ([E, T], NO_RUNNABLE_PAIR, None, None),
])
def test_two_releases(verdicts, status, old, new):
    result, runner = run(verdicts)
    assert runner.asked == ["1.0.0", "1.1.0"]
    assert (result.status, result.last_old, result.first_new) == (status, old, new)
    json.dumps(result.to_json())


def test_same_verdict_ends_say_nothing_to_bisect():
    result, runner = run([R, N, R])
    assert runner.asked == ["1.0.0", "1.2.0"]
    assert result.status == NO_CHANGE
    assert result.summary.startswith("both ends reproduced: nothing to bisect (1.0.0: reproduced, "
                                     "1.2.0: reproduced)")


def test_no_runnable_pair_messages():
    one, _ = run([E, R])
    assert one.to_verdict == R and one.new_end == "1.1.0" and one.from_verdict is None
    assert "only 1.1.0 (reproduced) ran" in one.summary
    none, runner = run([E, E, E])
    assert runner.asked == ["1.0.0", "1.2.0", "1.1.0"]
    assert "every release probed was skipped" in none.summary
    assert none.notes == ("1.0.0 skipped: error; 1.1.0 skipped: error; no runnable old end",)


@pytest.mark.parametrize("versions", [[], ["2.5.1"]])
def test_fewer_than_two_releases_is_a_clear_error(versions):
    with pytest.raises(BisectError, match="nothing to bisect") as info:
        bisect(versions, FakeRunner(versions, [R] * len(versions)))
    assert isinstance(info.value, LabError)
    assert "Widen --from/--to" in str(info.value)


def test_repeated_release_is_an_error():
    with pytest.raises(BisectError, match="repeat 2.5.1"):
        bisect(["2.5.1", "2.5.1"], FakeRunner(["2.5.1"], [R]))


def test_probe_for_wrong_version_is_an_error():
    with pytest.raises(BisectError, match="answered for"):
        bisect(["1", "2"], lambda v: Probe(version="3", outcome=R))


# -- flaky histories and determinism --------------------------------------------------------------

def test_non_monotone_history_reports_a_boundary_its_probes_support():
    verdicts = [N, R, N, R, N, R, N, R, N, R, N, R, R]
    result, _ = run(verdicts, VERSIONS)
    seen = {p.version: p.outcome for p in result.steps}
    assert seen[result.last_old] == N and seen[result.first_new] == R
    i, j = VERSIONS.index(result.last_old), VERSIONS.index(result.first_new)
    assert j == i + 1


def test_deterministic_and_resumable():
    verdicts = [N, N, E, N, N, E, R, E, R, R, E, R, R]
    first, runner1 = run(verdicts, VERSIONS)
    second, runner2 = run(verdicts, VERSIONS)
    assert runner1.asked == runner2.asked
    assert first == second
    # a resumed bisection (probe answers from existing run folders) asks the same releases in order
    cache = {p.version: p for p in first.steps}
    resumed = bisect(VERSIONS, lambda v: cache[v])
    assert [p.version for p in resumed.steps] == runner1.asked


def test_to_json_matches_design_contract():
    verdicts = [N, N, N, E, R]
    result, _ = run(verdicts)
    data = result.to_json()
    assert {"from_verdict", "to_verdict", "last_old", "first_new", "steps", "ambiguous", "status", "notes",
            "skipped"} <= set(data)
    assert data["steps"][0] == {"torch": "1.0.0", "verdict": "not_reproduced", "outcome": "not_reproduced",
                                "reason": "", "evidence": "evidence of 1.0.0", "run_dir": "runs/1.0.0",
                                "build_s": None, "run_s": None, "total_s": None, "engine": None,
                                "emulated": None, "git_version": None, "different_failure": None,
                                "reused_from": None}
    assert {"torch": "1.3.0", "verdict": "error"}.items() <= next(
        s for s in data["steps"] if s["torch"] == "1.3.0").items()
    assert data["skipped"] == ["1.3.0"]
    json.dumps(data)


# -- property: monotone histories with skips ------------------------------------------------------

@st.composite
def monotone_with_skips(draw):
    k = draw(st.integers(min_value=2, max_value=60))
    b = draw(st.integers(min_value=0, max_value=k))
    old, new = draw(st.sampled_from([(N, R), (R, N)]))
    skips = draw(st.lists(st.sampled_from([None, E, T]), min_size=k, max_size=k))
    verdicts = [skip or (old if i < b else new) for i, skip in enumerate(skips)]
    return k, b, old, new, verdicts


@settings(max_examples=400, deadline=None)
@given(monotone_with_skips())
def test_property_boundary_is_correct_and_never_a_skip(case):
    k, b, old, new, verdicts = case
    result, runner = run(verdicts)
    versions = [f"1.{i}.0" for i in range(k)]
    runnable = [i for i, v in enumerate(verdicts) if v in (R, N)]
    before = [i for i in runnable if i < b]
    after = [i for i in runnable if i >= b]
    non_skip = [p for p in result.steps if not p.skipped]
    assert len(non_skip) <= cost_bound(k)
    assert len(set(runner.asked)) == len(runner.asked)
    if before and after:
        lo, hi = max(before), min(after)
        assert result.status == (AMBIGUOUS if hi - lo > 1 else FOUND)
        assert (result.last_old, result.first_new) == (versions[lo], versions[hi])
        assert (result.from_verdict, result.to_verdict) == (old, new)
        assert result.skipped_between == tuple(versions[lo + 1:hi])
        assert result.ambiguous == (hi - lo > 1)
        for boundary in (result.last_old, result.first_new):
            assert verdicts[versions.index(boundary)] in (R, N)
    elif len(runnable) >= 2:
        assert result.status == NO_CHANGE and result.last_old is None and result.first_new is None
    else:
        assert result.status == NO_RUNNABLE_PAIR


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([R, N, E]), min_size=2, max_size=40))
def test_property_any_history_gives_a_boundary_consistent_with_probes(verdicts):
    result, runner = run(verdicts)
    assert len([p for p in result.steps if not p.skipped]) <= cost_bound(len(verdicts))
    if result.status in (FOUND, AMBIGUOUS):
        seen = {p.version: p.outcome for p in result.steps}
        assert seen[result.last_old] == result.from_verdict != result.to_verdict == seen[result.first_new]
        lo = int(result.last_old.split(".")[1])
        hi = int(result.first_new.split(".")[1])
        assert all(seen.get(f"1.{i}.0") == "skip" for i in range(lo + 1, hi))


# -- k-ary: several probes per round ----------------------------------------------------------

class BatchRunner(FakeRunner):
    """Records each round (the releases asked together)."""

    def __init__(self, versions, verdicts):
        super().__init__(versions, verdicts)
        self.batches: list[list[str]] = []

    def many(self, versions: list[str]) -> list[Probe]:
        self.batches.append(list(versions))
        return [self(v) for v in versions]


def run_wide(verdicts, width):
    versions = [f"1.{i}.0" for i in range(len(verdicts))]
    runner = BatchRunner(versions, verdicts)
    return bisect(versions, runner, width=width, probe_many=runner.many), runner


def test_width_one_is_the_binary_search_probe_for_probe():
    verdicts = regression_at(13, 9)
    serial, a = run(verdicts)
    wide, b = run_wide(verdicts, 1)
    assert a.asked == b.asked and serial.steps == wide.steps and wide.rounds == len(a.asked)


def test_three_slots_probe_three_releases_per_round_and_need_fewer_rounds():
    verdicts = regression_at(13, 9)  # 1.8.0 last old, 1.9.0 first new
    result, runner = run_wide(verdicts, 3)
    assert (result.last_old, result.first_new) == ("1.8.0", "1.9.0")
    assert runner.batches[0] == ["1.0.0", "1.12.0"]  # the ends, together
    assert all(len(b) <= 3 for b in runner.batches[1:]) and len(runner.batches[1]) == 3
    assert result.rounds == len(runner.batches) <= rounds_bound(13, 3) < run(verdicts)[0].rounds
    assert result.width == 3


def test_rounds_bound():
    assert rounds_bound(13, 1) == 5 and rounds_bound(13, 3) == 3 and rounds_bound(2, 4) == 1


@settings(max_examples=300, deadline=None)
@given(monotone_with_skips(), st.integers(min_value=2, max_value=6))
def test_property_any_width_finds_the_serial_boundary(case, width):
    k, b, old, new, verdicts = case
    serial, _ = run(verdicts)
    wide, runner = run_wide(verdicts, width)
    assert (wide.status, wide.last_old, wide.first_new, wide.skipped_between) == \
        (serial.status, serial.last_old, serial.first_new, serial.skipped_between)
    assert len(set(runner.asked)) == len(runner.asked)
    assert all(len(batch) <= max(width, 2) for batch in runner.batches)
    if all(v in (R, N) for v in verdicts):
        assert wide.rounds <= rounds_bound(k, width)
