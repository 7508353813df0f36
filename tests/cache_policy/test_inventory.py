"""Taking stock of a real cache folder (made here) and a fake engine's images; pruning and enforcing
the cap with a fake clock: eviction order, and nothing in use is removed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from filelock import FileLock

from lab.cache_policy import inventory as inv
from lab.core.records import ImageUsage

DAY = 86400.0
KIB = 1024


class FakeEngine:
    """managed_images / remove_unused_image over a list; the engine refuses an image in use."""

    def __init__(self, images):
        self.images = list(images)
        self.removed: list[str] = []

    def managed_images(self):
        return list(self.images)

    def remove_unused_image(self, image):
        if image.containers:
            return False
        self.images = [i for i in self.images if i.image_id != image.image_id]
        self.removed.append(image.tags[0])
        return True


def image(tag, mib, created, containers=(), shared=0):
    size = mib * 1024 * KIB
    return ImageUsage(image_id=f"sha256:{abs(hash(tag)):064d}"[:71], tags=(tag,), size=size + shared, shared=shared,
                      unique=size, created=created, containers=tuple(containers))


def fill(path: Path, kib: int, when: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(kib * KIB))
    os.utime(path, (when, when))


def age(path: Path, when: float) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (when, when))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    return root


def site(root: Path, key: str, kib: int, when: float) -> Path:
    tree = root / "site" / key
    fill(tree / "lib" / "python3.11" / "site-packages" / "m.py", kib, when)
    fill(root / "site" / f"{key}.json", 1, when)
    age(tree, when)
    return tree


def test_cap_evicts_least_recently_used_first_and_keeps_what_is_in_use(cache, monkeypatch):
    now = time.time()
    site(cache, "old", 400, now - 30 * DAY)
    site(cache, "mid", 400, now - 10 * DAY)
    site(cache, "new", 400, now - 1 * DAY)
    locked = site(cache, "making", 400, now - 40 * DAY)     # its lock is held: being made
    fill(cache / "index" / "torch.json", 8, now - 5 * DAY)
    engine = FakeEngine([image("torch-repro-lab/case:a-1", 1, now - 20 * DAY),
                         image("torch-repro-lab/case:b-2", 1, now - 50 * DAY, containers=("c1 (running)",)),
                         image("torch-repro-lab/case:c-3", 1, now - 2 * DAY)])
    stock = inv.take_inventory(engine, now)
    assert {e.part for e in stock.entries} >= {"site", "index", "images"}
    # a cap that holds about half of it
    monkeypatch.setenv("LAB_CACHE_CAP", str(stock.total // 2))
    lock = FileLock(str(locked.parent / "making.lock"))
    lock.acquire()
    try:
        pruned = inv.prune(engine, now=now)
    finally:
        lock.release()
    order = [(e.part, e.name) for e in pruned.removed]
    assert order[:3] == [("site", "old"), ("images", "torch-repro-lab/case:a-1"), ("site", "mid")]
    assert pruned.before.total - pruned.freed <= stock.total // 2
    assert not (cache / "site" / "old").exists() and not (cache / "site" / "old.json").exists()
    assert locked.exists() and (cache / "site" / "new").exists()
    assert "torch-repro-lab/case:b-2" not in engine.removed  # a container uses it
    busy = next(e for e in pruned.before.entries if e.name == "torch-repro-lab/case:b-2")
    assert busy.in_use and "c1" in busy.in_use


def test_a_live_lease_protects_what_was_used_since_it_began(cache, monkeypatch):
    now = time.time()
    old = site(cache, "old", 100, now - 30 * DAY)
    used = site(cache, "used", 100, now - 30 * DAY)
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    with inv.lease():
        inv.note_use(paths=(used,))  # a run in progress reuses this tree
        pruned = inv.prune(None, now=now)
    assert [e.name for e in pruned.removed] == ["old"] and not old.exists()
    assert used.exists()
    kept = next(e for e in pruned.before.entries if e.name == "used")
    assert f"pid {os.getpid()}" in kept.in_use


def test_a_settled_lease_covers_only_what_its_run_named(cache, monkeypatch):
    """A run that has named what its script runs on (`settle_lease`) no longer protects whatever
    another process used while it runs: a long emulated script kept every tree of a bisection beside
    it "in use" (issue 34). Before it settles (its base, tree and image still being made) it does."""
    now = time.time()
    mine = site(cache, "mine", 100, now - 30 * DAY)
    other = site(cache, "other", 100, now - 30 * DAY)  # used by another run since this one began
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    with inv.lease():
        inv.note_use(paths=(mine,))
        time.sleep(0.01)
        os.utime(other)  # used now: the time rule would cover it
        making = {e.name: e.in_use for e in inv.take_inventory(None).entries if e.part == "site"}
        assert making["other"] and making["mine"], making
        inv.settle_lease()
        [held] = inv.live_leases(cache)
        assert held.settled and str(mine.resolve()) in held.paths
        pruned = inv.prune(None, now=now)
        assert [e.name for e in pruned.removed] == ["other"] and not other.exists()
        assert mine.exists()
        kept = next(e for e in pruned.before.entries if e.name == "mine")
        assert f"pid {os.getpid()}" in kept.in_use and "in progress" in kept.in_use
    assert inv.live_leases(cache) == []


def test_each_thread_names_what_it_uses_in_its_own_lease(cache):
    """A bisection's probes run in threads of one process, each with its own lease: one probe's
    tree is released when that probe ends, while the other probe's lease goes on."""
    import threading
    trees = {n: site(cache, n, 10, time.time() - DAY) for n in ("a", "b")}
    a_named, b_done = threading.Event(), threading.Event()

    def probe(name: str, first: threading.Event | None, then: threading.Event | None) -> None:
        with inv.lease():
            inv.note_use(paths=(trees[name],))
            inv.settle_lease()
            if first is not None:
                first.set()
            if then is not None:
                then.wait(10)

    a = threading.Thread(target=probe, args=("a", a_named, b_done))
    a.start()
    assert a_named.wait(10)
    probe("b", None, None)  # runs and ends while a's lease goes on
    try:
        [left] = inv.live_leases(cache)
        assert left.paths == frozenset({str(trees["a"].resolve())})
        in_use = {e.name: e.in_use for e in inv.take_inventory(None).entries if e.part == "site"}
        assert in_use["a"] and not in_use["b"], in_use
    finally:
        b_done.set()
        a.join(10)
    assert inv.live_leases(cache) == []


def test_a_lease_line_cut_short_still_reads(cache):
    """A line being appended while another process reads: the lines before it still count."""
    (cache / "leases").mkdir()
    path = cache / "leases" / f"{os.getpid()}-1.lease"
    path.write_text(f'{os.getpid()}\n{{"paths": ["/x/site/k"], "images": []}}\n{{"settled": tr')
    [held] = inv.live_leases(cache)
    assert held.paths == frozenset({"/x/site/k"}) and not held.settled


def test_a_dead_process_lease_is_ignored_and_removed(cache):
    stale = cache / "leases" / "999999999-1.lease"
    stale.parent.mkdir()
    stale.write_text("999999999\n")
    assert inv.live_leases(cache) == [] and not stale.exists()


def test_hard_links_are_counted_once_and_free_nothing_while_another_link_stays(cache):
    now = time.time()
    fill(cache / "uv" / "archive" / "wheel.so", 512, now)
    tree = cache / "site" / "k" / "lib"
    tree.mkdir(parents=True)
    os.link(cache / "uv" / "archive" / "wheel.so", tree / "wheel.so")
    stock = inv.take_inventory(None, now)
    uv = next(e for e in stock.entries if e.part == "uv")
    tree_entry = next(e for e in stock.entries if e.part == "site")
    assert uv.size == 0 and tree_entry.size == 0       # the other link keeps the data
    assert 512 * KIB <= stock.total < 2 * 512 * KIB     # counted once
    # ... and counted where `lab cache info` shows it: apart, so that the parts add up to the total
    sizes = stock.part_sizes()
    assert sizes["linked"] >= 512 * KIB and sum(sizes.values()) == stock.total
    assert {p["part"]: p["bytes"] for p in stock.as_json()["parts"]}["linked"] == sizes["linked"]
    assert "images left out: no Docker engine" in stock.notes


def test_prune_all_removes_images_before_their_base_and_older_than_keeps_recent(cache):
    now = time.time()
    base = image("torch-repro-lab/debian:bookworm-amd64", 0, now - 9 * DAY)
    engine = FakeEngine([image("torch-repro-lab/case:a-1", 1, now - 8 * DAY), base,
                         image("torch-repro-lab/case:b-2", 1, now - 1 * DAY)])
    pruned = inv.prune(engine, older_than=2 * DAY, now=now)
    assert engine.removed == ["torch-repro-lab/case:a-1"]
    pruned = inv.prune(engine, everything=True, now=now)
    assert engine.removed[1:] == ["torch-repro-lab/case:b-2", "torch-repro-lab/debian:bookworm-amd64"]
    assert pruned.before.entries


def test_images_of_the_filter_only(cache, monkeypatch):
    now = time.time()
    engine = FakeEngine([image("torch-repro-lab/case:mine-1", 1, now - 8 * DAY),
                         image("torch-repro-lab/case:theirs-1", 1, now - 9 * DAY)])
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    inv.prune(engine, now=now, only=lambda i: any("mine" in t for t in i.tags))
    assert engine.removed == ["torch-repro-lab/case:mine-1"]


def test_a_stamp_is_the_last_use_of_an_image(cache):
    now = time.time()
    img = image("torch-repro-lab/case:a-1", 1, now - 30 * DAY)
    inv.note_use(image_ids=(img.image_id,))
    stock = inv.take_inventory(FakeEngine([img]), now)
    entry = next(e for e in stock.entries if e.part == "images")
    assert entry.last_used > now - 60


def test_enforcement_never_raises_and_says_why(cache, monkeypatch):
    class Broken:
        def managed_images(self):
            raise RuntimeError("socket closed")
    said = []
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    inv.enforce_cap(Broken(), lambda stage, msg: said.append((stage, msg)))
    assert said and said[0][0] == "cache" and "socket closed" in said[0][1]

    def fails(*a, **k):
        raise OSError("disk gone")
    monkeypatch.setattr(inv, "prune", fails)
    said.clear()
    assert inv.enforce_cap(FakeEngine([]), lambda stage, msg: said.append((stage, msg)), now=time.time() + 1e6) is None
    assert said == [("cache", "the cache cap was not enforced: OSError: disk gone")]


def test_enforcement_counts_again_only_when_due_and_defers_inside_a_bisection(cache, monkeypatch):
    now = time.time()
    site(cache, "old", 100, now - 30 * DAY)
    engine = FakeEngine([])
    monkeypatch.setenv("LAB_CACHE_CAP", "10GiB")
    first = inv.enforce_cap(engine, now=now)
    assert first is not None and not first.removed
    assert inv.enforce_cap(engine, now=now + 60) is None              # counted a minute ago, far under the cap
    assert inv.enforce_cap(engine, now=now + inv.RECOUNT_S + 1) is not None
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    with inv.deferred():
        assert inv.enforce_cap(engine, now=now + 10 * inv.RECOUNT_S) is None
        pruned = inv.enforce_cap(engine, now=now + 10 * inv.RECOUNT_S, force=True)
    assert [e.name for e in pruned.removed] == ["old"]


def test_a_smaller_cap_set_since_the_last_count_makes_it_due(cache, monkeypatch):
    now = time.time()
    site(cache, "old", 100, now - 30 * DAY)
    monkeypatch.setenv("LAB_CACHE_CAP", "10GiB")
    assert inv.enforce_cap(FakeEngine([]), now=now) is not None
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    pruned = inv.enforce_cap(FakeEngine([]), now=now + 60)
    assert pruned is not None and [e.name for e in pruned.removed] == ["old"]


def test_a_disk_that_lost_more_than_the_cap_allows_since_the_last_count_makes_it_due(cache, monkeypatch):
    """The bench from_issue filled the disk: ten minutes without a count, and 35 GB of CUDA wheels,
    site trees and images came in between."""
    now, gib = time.time(), 1024**3
    site(cache, "old", 100, now - 30 * DAY)
    monkeypatch.setenv("LAB_CACHE_CAP", "10GiB")
    monkeypatch.setattr(inv, "_free", lambda root: 100 * gib)
    assert inv.enforce_cap(FakeEngine([]), now=now) is not None
    monkeypatch.setattr(inv, "_free", lambda root: 99 * gib)       # 1 GiB less: far under the cap still
    assert inv.enforce_cap(FakeEngine([]), now=now + 60) is None
    monkeypatch.setattr(inv, "_free", lambda root: 90 * gib)       # 10 GiB less: the cache may hold that
    assert inv.enforce_cap(FakeEngine([]), now=now + 120) is not None
    monkeypatch.setattr(inv, "_free", lambda root: 0)              # unreadable: counted, to be safe
    assert inv.enforce_cap(FakeEngine([]), now=now + 180) is not None


def test_an_engine_without_image_listing_leaves_images_out_with_a_note(cache):
    stock = inv.take_inventory(object(), time.time())
    assert any(n.startswith("images left out: AttributeError") for n in stock.notes)
