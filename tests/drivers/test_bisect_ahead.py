"""Issue 34, item 2: what a bisection makes ready while a round runs (lab.drivers.bisect's `prepare`
hints and lab.drivers.bisect_ahead's Prefetcher), and how many emulated probes run at once."""

from __future__ import annotations

import threading

import pytest

from lab.drivers.bisect import Probe, bisect
from lab.drivers.bisect_ahead import Prefetcher, emulated_width
from lab.engine.engines import EngineFacts
from lab.engine.routing import Fleet

GiB = 1024**3


def versions(k: int) -> list[str]:
    return [f"1.{i}.0" for i in range(k)]


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("k", [3, 5, 8, 13, 21])
def test_every_round_after_the_first_was_announced_a_round_ahead(k, width):
    """No round waits for a preparation that could have started earlier: each release a round probes
    was named by `prepare` before the round that came before it started (only the first round's, and
    with one slot the old end, are not), and the boundary is the one found without hints."""
    vs = versions(k)
    for boundary in range(1, k):
        check_hints(vs, boundary, width)


def check_hints(vs: list[str], boundary: int, width: int) -> None:
    def probe(v: str) -> Probe:
        return Probe.judged(v, "reproduced" if vs.index(v) >= boundary else "not_reproduced")
    hints: list[list[str]] = []
    rounds: list[list[str]] = []

    def many(batch: list[str]) -> list[Probe]:
        rounds.append(list(batch))
        return [probe(v) for v in batch]

    def one(v: str) -> Probe:
        rounds.append([v])
        return probe(v)

    when: list[int] = []  # how many rounds had started when each hint came

    def prepare(names: list[str]) -> None:
        hints.append(list(names))
        when.append(len(rounds))

    hinted = bisect(vs, one, width=width, probe_many=many, prepare=prepare)
    plain = bisect(vs, probe, width=width, probe_many=lambda batch: [probe(v) for v in batch])
    assert (hinted.last_old, hinted.first_new) == (plain.last_old, plain.first_new) == (vs[boundary - 1],
                                                                                      vs[boundary])
    assert [p.version for p in hinted.steps] == [p.version for p in plain.steps]
    for n, batch in enumerate(rounds[1:], start=1):  # announced before round n-1 started
        announced = {v for h, at in zip(hints, when, strict=True) if at <= n - 1 for v in h}
        assert set(batch) <= announced, (len(vs), width, boundary, n, batch, hints, when)
    assert all(len(h) <= 2 * width * (width + 1) for h in hints)  # both midpoints; S per part


def test_prefetcher_makes_in_order_drops_what_a_new_hint_replaces_and_never_twice():
    started = threading.Event()
    release = threading.Event()
    made: list[str] = []

    def make(v: str) -> None:
        made.append(v)
        if v == "a":
            started.set()
            release.wait(10)
        if v == "bad":
            raise RuntimeError("no wheel")

    events: list[str] = []
    ahead = Prefetcher(make, lambda stage, msg: events.append(msg), room=lambda: True)
    ahead.ask(["a", "b"])
    assert started.wait(10)
    ahead.ask(["c", "a", "bad"])  # b dropped; a is being made, not again
    ahead.forget("c")             # its probe starts: it makes c itself
    release.set()
    ahead.close()
    assert made[:1] == ["a"] and "b" not in made and "c" not in made and made.count("a") == 1
    assert ahead.failed.get("bad") == "no wheel" if "bad" in made else True
    assert not any("Traceback" in e for e in events)


def test_what_is_made_ahead_runs_below_the_running_probes_and_so_do_its_children():
    """The prefetch thread is niced (10), and a process it starts (uv, tar, mmdebstrap) inherits it."""
    import os
    import subprocess
    seen: dict[str, int] = {}
    made = threading.Event()

    def make(v: str) -> None:
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["child"] = int(subprocess.run(["sh", "-c", "cut -d' ' -f19 /proc/self/stat"], capture_output=True,
                                           text=True, check=True).stdout)
        made.set()
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    ahead = Prefetcher(make, room=lambda: True)
    ahead.ask(["a"])
    assert made.wait(30)
    ahead.close()
    assert seen["thread"] >= 10 and seen["child"] >= 10
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's thread keeps its own


def test_prefetcher_makes_nothing_when_the_cache_is_near_its_cap():
    made: list[str] = []
    ahead = Prefetcher(made.append, room=lambda: False)
    ahead.ask(["a"])
    ahead.close()
    assert made == []


def facts(name: str, *, cpus: int, memory: int, arch: str = "amd64", emulates=("arm64",)) -> EngineFacts:
    return EngineFacts(name, None, "test", reachable=True, arch=arch, cpus=cpus, memory=memory, emulates=emulates)


def test_two_emulated_probes_on_two_cores_and_one_native():
    fleet = Fleet([(facts("default", cpus=2, memory=24 * GiB), object())])
    assert fleet.slots == 1
    assert emulated_width(fleet, "amd64", False) == 1  # native: one per two cores, as before
    assert fleet.slots == 1
    assert emulated_width(fleet, "arm64", False) == 2  # emulated: one per core
    assert fleet.slots == 2


def test_emulated_probes_as_memory_allows():
    fleet = Fleet([(facts("default", cpus=2, memory=5 * GiB), object())])
    assert emulated_width(fleet, "arm64", False) == 1


def test_emulated_probes_as_disk_allows():
    engine = facts("default", cpus=4, memory=24 * GiB)
    fleet = Fleet([(EngineFacts(**{**engine.__dict__, "free_disk": 17 * GiB}), object())])
    assert emulated_width(fleet, "arm64", False) == 2


def test_engines_on_this_host_share_its_cores(monkeypatch):
    """Two engines whose sockets are on one 2-core host: one emulated probe each, not two each."""
    monkeypatch.setattr("lab.drivers.bisect_ahead.os.cpu_count", lambda: 2)
    here = [EngineFacts(**{**facts(n, cpus=2, memory=24 * GiB).__dict__, "local": True}) for n in ("first", "second")]
    fleet = Fleet([(f, object()) for f in here])
    assert emulated_width(fleet, "arm64", False) == 2 and fleet.capacity == {"first": 1, "second": 1}
    alone = Fleet([(here[0], object())])
    assert emulated_width(alone, "arm64", False) == 2  # one engine on the host: one per core
