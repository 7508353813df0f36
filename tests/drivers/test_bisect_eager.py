"""lab.drivers.bisect_eager: a slot takes its next probe as soon as it is free. The logic is driven
with simulated durations (no threads, no clock), then once through its threads."""

from __future__ import annotations

import heapq
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.core import cancel
from lab.drivers.bisect import FOUND, NO_CHANGE, NO_RUNNABLE_PAIR, BisectError, Probe, bisect
from lab.drivers.bisect_eager import EagerSearch

R, N, E, T = "reproduced", "not_reproduced", "error", "timeout"
PUBLIC = ["2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0",
          "2.13.0", "2.14.0", "2.15.0"]


def judged(version: str, verdict: str) -> Probe:
    return Probe.judged(version, verdict, reason=f"why {version}", run_dir=f"runs/{version}")


def simulate(verdicts, width, durations, versions=None, stops=True):
    """The eager search with probe i taking durations[i], a probe no longer needed stopped at once
    (with `stops`, as the Docker and local engines do): (result, wall time, releases in start order,
    the most running at once)."""
    versions = versions or [f"1.{i}.0" for i in range(len(verdicts))]
    s = EagerSearch(versions, width)
    clock, pending, started, most = 0.0, [], [], 0
    while True:
        todo = s.wanted(width - len(s.running))
        s.start(todo)
        most = max(most, len(s.running))
        for i in todo:
            started.append(versions[i])
            heapq.heappush(pending, (clock + durations[i], i))
        if not s.running:
            break
        clock, i = heapq.heappop(pending)
        s.answer(i, judged(versions[i], verdicts[i]))
        for k in s.useless() if stops else ():
            pending = [(t, j) for t, j in pending if j != k]
            heapq.heapify(pending)
            s.stop(k)
    return s.result(), clock, started, most


def rounds_wall(verdicts, width, durations, versions=None):
    """The round search with the same durations: each round lasts as long as its slowest probe."""
    versions = versions or [f"1.{i}.0" for i in range(len(verdicts))]
    took = dict(zip(versions, durations, strict=True))
    table = dict(zip(versions, verdicts, strict=True))
    wall = 0.0

    def many(vs):
        nonlocal wall
        wall += max(took[v] for v in vs)
        return [judged(v, table[v]) for v in vs]

    def one(v):
        return many([v])[0]
    return bisect(versions, one, width=width, probe_many=many), wall


def serial(verdicts, versions=None):
    versions = versions or [f"1.{i}.0" for i in range(len(verdicts))]
    table = dict(zip(versions, verdicts, strict=True))
    return bisect(versions, lambda v: judged(v, table[v]))


def test_the_public_bisection_no_longer_waits_for_the_slower_probe():
    """The libgomp-aarch64 bisection as measured (bench/README.md): the new end's first probe made its
    7 GB tree (220 s) while the old end took 109 s; the others about 85 to 110 s."""
    verdicts = [R] * 7 + [N] * 6     # 2.9.1 the last that reproduces, 2.10.0 the first that does not
    durations = [109, 95, 100, 90, 85, 92, 82, 85, 100, 99, 105, 98, 220]
    eager, wall, started, most = simulate(verdicts, 2, durations, PUBLIC)
    rounds, rounds_time = rounds_wall(verdicts, 2, durations, PUBLIC)
    assert (eager.status, eager.last_old, eager.first_new) == (FOUND, "2.9.1", "2.10.0") == (
        rounds.status, rounds.last_old, rounds.first_new)
    assert started[:2] == ["2.5.1", "2.15.0"]       # the ends first, together
    assert started[2] == "2.9.1"                     # the old end's slot goes on at once, to the middle
    assert most == 2 and eager.width == 2 and eager.eager and eager.rounds == len(started) - 1
    assert wall < rounds_time                        # simulated seconds, not a measured timing
    assert len(eager.steps) < len(rounds.steps)
    waited, waited_wall, _, _ = simulate(verdicts, 2, durations, PUBLIC, stops=False)
    assert wall < waited_wall                        # the probe no longer needed was stopped, not waited for
    assert waited.last_old == "2.9.1" and any("2.11.0 was stopped" in n for n in eager.notes)


def test_no_change_waits_for_the_probes_it_started_and_says_so():
    result, _, started, _ = simulate([R] * 9, 2, [1, 1, 1, 1, 1, 1, 1, 1, 5])
    assert result.status == NO_CHANGE and (result.from_verdict, result.to_verdict) == (R, R)
    assert len(started) > 2 and len(result.steps) == len(started)  # the speculative probes are steps too


def test_skipped_ends_walk_inwards_with_the_notes_of_the_serial_search():
    verdicts = [E, T, N, N, N, R, R, E]
    result, _, _, _ = simulate(verdicts, 3, [1] * 8)
    want = serial(verdicts)
    assert (result.status, result.last_old, result.first_new, result.old_end, result.new_end) == (
        want.status, want.last_old, want.first_new, want.old_end, want.new_end)
    assert "1.0.0 skipped: why 1.0.0; 1.1.0 skipped: why 1.1.0; using 1.2.0 as the old end" in result.notes
    assert "1.7.0 skipped: why 1.7.0; using 1.6.0 as the new end" in result.notes


@pytest.mark.parametrize("verdicts", [[E, E, E, R], [R, E, E, E], [E] * 5])
def test_no_runnable_pair(verdicts):
    result, _, _, _ = simulate(verdicts, 2, [1] * len(verdicts))
    assert result.status == NO_RUNNABLE_PAIR == serial(verdicts).status


def test_a_probe_for_the_wrong_release_is_an_error():
    s = EagerSearch(["1.0", "2.0"], 2)
    s.start(s.wanted(2))
    with pytest.raises(BisectError, match="answered for 3.0"):
        s.answer(0, judged("3.0", R))


@st.composite
def monotone_with_skips(draw):
    k = draw(st.integers(min_value=2, max_value=40))
    b = draw(st.integers(min_value=0, max_value=k))
    old, new = draw(st.sampled_from([(N, R), (R, N)]))
    skips = draw(st.lists(st.sampled_from([None, None, E, T]), min_size=k, max_size=k))
    durations = draw(st.lists(st.integers(min_value=1, max_value=9), min_size=k, max_size=k))
    return [skip or (old if i < b else new) for i, skip in enumerate(skips)], durations


@settings(max_examples=400, deadline=None)
@given(monotone_with_skips(), st.integers(min_value=2, max_value=5), st.booleans())
def test_property_any_order_of_finishing_finds_the_serial_boundary(case, width, stops):
    verdicts, durations = case
    result, _, started, most = simulate(verdicts, width, durations, stops=stops)
    want = serial(verdicts)
    assert (result.status, result.last_old, result.first_new, result.skipped_between) == (
        want.status, want.last_old, want.first_new, want.skipped_between)
    assert most <= width
    if not stops:  # (a stopped probe may be asked again when a later answer needs it)
        assert len(set(started)) == len(started)
    assert len({p.version for p in result.steps}) == len(result.steps)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([R, N, E]), min_size=2, max_size=30),
       st.lists(st.integers(min_value=1, max_value=9), min_size=30, max_size=30),
       st.integers(min_value=2, max_value=4), st.booleans())
def test_property_any_history_gives_a_boundary_its_probes_support(verdicts, durations, width, stops):
    result, _, _, _ = simulate(verdicts, width, durations[:len(verdicts)], stops=stops)
    seen = {p.version: p.outcome for p in result.steps}
    if result.status in ("found", "ambiguous"):
        assert seen[result.last_old] == result.from_verdict and seen[result.first_new] == result.to_verdict
        assert result.from_verdict != result.to_verdict
        assert all(seen.get(v) == "skip" for v in result.skipped_between)


def test_threads_run_at_most_width_at_once_and_find_the_serial_boundary():
    versions = [f"1.{i}.0" for i in range(12)]
    table = dict(zip(versions, [N] * 8 + [R] * 4, strict=True))
    lock, running, most = threading.Lock(), [0], [0]
    hints: list[list[str]] = []

    def probe(v):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01 * (1 + versions.index(v) % 3))
        with lock:
            running[0] -= 1
        return judged(v, table[v])
    result = bisect(versions, probe, width=3, eager=True, prepare=hints.append)
    assert (result.last_old, result.first_new) == ("1.7.0", "1.8.0") and result.eager and most[0] <= 3
    assert hints and all(set(h) <= set(versions) for h in hints)


def test_a_probe_that_raises_is_raised_after_the_running_probes_end():
    ended = []

    def probe(v):
        if v == "1.0.0":
            raise RuntimeError("the engine is gone")
        time.sleep(0.05)
        ended.append(v)
        return judged(v, R)
    with pytest.raises(RuntimeError, match="engine is gone"):
        bisect([f"1.{i}.0" for i in range(6)], probe, width=2, eager=True)
    assert ended == ["1.5.0"]  # the new end, started with it, was waited for; nothing more started


def test_width_one_is_the_serial_search_even_when_eager():
    verdicts = [N] * 5 + [R] * 4
    versions = [f"1.{i}.0" for i in range(9)]
    table = dict(zip(versions, verdicts, strict=True))
    result = bisect(versions, lambda v: judged(v, table[v]), width=1, eager=True)
    assert result == serial(verdicts) and not result.eager


def test_a_probe_no_longer_needed_is_asked_to_stop_and_leaves_no_step():
    """1.3.0 starts while 1.2.0 runs; 1.2.0's answer closes the search, so 1.3.0 is asked to stop (it
    sees lab.core.cancel.requested(), as the engines' wait loops do) instead of being waited for."""
    started = {v: threading.Event() for v in ("1.2.0", "1.3.0")}
    saw_stop = []

    def probe(v):
        if v in started:
            started[v].set()
        if v == "1.4.0":
            assert started["1.2.0"].wait(10)
        if v == "1.2.0":
            assert started["1.3.0"].wait(10)
        if v == "1.3.0":
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if cancel.requested():
                    saw_stop.append(v)
                    raise cancel.Cancelled()
                time.sleep(0.01)
        return judged(v, {"1.0.0": N, "1.1.0": N}.get(v, R))
    result = bisect([f"1.{i}.0" for i in range(5)], probe, width=2, eager=True)
    assert (result.status, result.last_old, result.first_new) == (FOUND, "1.1.0", "1.2.0")
    assert saw_stop == ["1.3.0"] and "1.3.0" not in [p.version for p in result.steps]
    assert "1.3.0 was stopped before it answered: the other probes' answers made it unnecessary" in result.notes
