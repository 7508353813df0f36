"""A probe that fails, but not with the scenario's signature: a skip by default, never a boundary;
`--failed-differently` counts it on one side. The pure search with fake probes (logic only; the real
engine's run is tests/test_e2e_compare.py)."""

from __future__ import annotations

import pytest

from lab.core.results import FAILED_DIFFERENTLY, SKIP, FailureSignatures, Probe, SourceBoundary, outcome_of
from lab.drivers.bisect import FOUND, bisect

F, R, N = FAILED_DIFFERENTLY, "reproduced", "not_reproduced"
VERSIONS = ["2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1", "2.4.0"]
PAIR = FailureSignatures(expected="an exception containing 'capture is disabled', exit code 1",
                         observed="AttributeError: module 'torch.compiler' has no attribute 'is_compiling', "
                                  "exit code 1")


def probes(verdicts, counted=SKIP):
    table = dict(zip(VERSIONS, verdicts, strict=True))

    def probe(version: str) -> Probe:
        return Probe.judged(version, table[version], run_dir=f"runs/{version}", failed_differently=counted,
                            different_failure=PAIR if table[version] == F else None)
    return probe


def test_outcome_of_failed_differently_is_a_skip_unless_counted():
    assert outcome_of(F) == SKIP
    assert outcome_of(F, R) == R and outcome_of(F, N) == N
    assert outcome_of(R, N) == R  # only failed_differently is counted differently
    with pytest.raises(ValueError, match="counts as one of"):
        outcome_of(F, "bad")


def test_a_failed_differently_probe_is_never_the_boundary():
    # 2.2.x fail differently (an API they lack), 2.3.x reproduce, 2.4.0 passes: a fix at 2.4.0
    result = bisect(VERSIONS, probes([F, F, F, R, R, N]))
    assert result.status == FOUND
    assert (result.last_old, result.first_new) == ("2.3.1", "2.4.0")
    assert result.old_end == "2.3.0"  # the skipped end was replaced inwards
    assert result.failed_differently_probes == ("2.2.0", "2.2.1", "2.2.2")
    step = next(p for p in result.steps if p.version == "2.2.0")
    assert (step.verdict, step.outcome, step.different_failure) == (F, SKIP, PAIR)


def test_a_failed_differently_probe_between_the_ends_is_skipped():
    result = bisect(VERSIONS, probes([N, N, F, F, R, R]))
    assert result.status == "ambiguous"
    assert (result.last_old, result.first_new) == ("2.2.1", "2.3.1")
    assert result.skipped_between == ("2.2.2", "2.3.0")


def test_the_flag_counts_it_on_one_side():
    result = bisect(VERSIONS, probes([N, N, F, F, R, R], counted=R))
    assert (result.status, result.last_old, result.first_new) == (FOUND, "2.2.1", "2.2.2")
    step = next(p for p in result.steps if p.version == "2.2.2")
    assert (step.verdict, step.outcome) == (F, R)


def test_a_probe_round_trips_through_json():
    p = Probe.judged("2.2.2", F, failed_differently=N, git_version="39901f229520a5256505ec24782f716ee7ddc843",
                     different_failure=PAIR)
    again = Probe.model_validate(p.to_json())
    assert again == p and again.outcome == N


def test_source_boundary_links_commits_and_falls_back_to_tags():
    s = SourceBoundary.of("2.4.1", "2.5.0", "ee1b6804381c57161c477caa380a840a84167676",
                          "32f585d9346e316e554c8d9bf7548af9f62141fc", "regression")
    assert s.compare_url == ("https://github.com/pytorch/pytorch/compare/ee1b6804381c57161c477caa380a840a84167676"
                             "...32f585d9346e316e554c8d9bf7548af9f62141fc")
    assert s.git_bisect == ("git bisect start 32f585d9346e316e554c8d9bf7548af9f62141fc "
                            "ee1b6804381c57161c477caa380a840a84167676")
    tags = SourceBoundary.of("2.3.1", "2.4.0+cpu", None, None, "fix")
    assert tags.compare_url.endswith("/compare/v2.3.1...v2.4.0")
    assert tags.git_bisect == "git bisect start --term-old=broken --term-new=fixed v2.4.0 v2.3.1"
