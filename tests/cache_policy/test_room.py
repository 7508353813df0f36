"""Room for the next run, with a real cache folder (made here) and fakes for the engine and the runs:
what is released when, the estimate of what a run adds, and the warning or refusal before it starts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from lab.cache_policy import inventory as inv
from lab.cache_policy import room
from lab.core.results import ImageRef, Judgement
from lab.drivers import bisect_run
from lab.image.casekey import content_key
from lab.image.crossinstall import target_for
from lab.image.hostpip import HostPip
from lab.pipeline import RunOutcome
from tests.conftest import fake_result, tiny_scenario

KIB = 1024
DAY = 86400.0
GiB = 1024**3


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    monkeypatch.setenv("LAB_DISK_MARGIN", "0")
    return root


def tree(root: Path, key: str, torch: str, kib: int, when: float, target: str = "linux/arm64 cp311") -> Path:
    """A site tree as lab.image.crossinstall leaves it: the folder, its .json, its .lock."""
    folder = root / "site" / key
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    (folder / "lib" / "torch.so").write_bytes(os.urandom(kib * KIB))
    (root / "site" / f"{key}.json").write_text(json.dumps(
        {"requirements": [f"torch=={torch}", "numpy"], "target": target, "size": kib * KIB}))
    (root / "site" / f"{key}.lock").touch()
    for p in (folder / "lib" / "torch.so", folder / "lib", folder, root / "site" / f"{key}.json",
              root / "site" / f"{key}.lock"):
        os.utime(p, (when, when))
    return folder


# ----------------------------------------------------------------------------- the estimate

def test_a_cached_tree_adds_nothing_unless_the_engine_copies_it_into_an_image(cache):
    tree(cache, "a", "2.5.1", 300, time.time())
    mounted = room.estimate_bytes("2.5.1", "arm64", "linux/arm64 cp311", copies=False)
    copied = room.estimate_bytes("2.5.1", "arm64", "linux/arm64 cp311", copies=True)
    assert mounted.bytes == 0 and "cached" in mounted.source
    assert copied.bytes == 300 * KIB
    venv = cache / "venv"  # the local engine's venv says no target (it is this host's) and no size
    venv.mkdir()
    (venv / "v1.json").write_text(json.dumps({"requirements": ["torch==2.13.0+cpu"], "python": "/usr/bin/python3"}))
    assert room.estimate_bytes("2.13.0+cpu", "amd64", "linux/amd64 cp311", copies=False).bytes == 0


def test_an_uncached_release_is_estimated_from_the_nearest_cached_one_of_its_target(cache):
    tree(cache, "a", "2.1.0", 100, time.time())
    tree(cache, "b", "2.5.1", 400, time.time())
    tree(cache, "c", "2.5.0", 900, time.time(), target="linux/amd64 cp311")  # another target: not compared
    need = room.estimate_bytes("2.6.0", "arm64", "linux/arm64 cp311", copies=False)
    assert need.bytes == int(400 * KIB * room.NEAREST_SLACK) and "2.5.1" in need.source
    assert room.estimate_bytes("2.6.0", "arm64", "linux/arm64 cp311", copies=True).bytes == 2 * need.bytes


def test_a_cuda_build_is_never_estimated_from_a_cpu_builds_tree_nor_the_other_way(cache):
    """AArch64 torch 2.10.0's tree is 0.6 GB and 2.11.0's, with its nvidia-* wheels, about 7 GB: the
    nearest release across that line says nothing about the other's size."""
    tree(cache, "cpu", "2.10.0", 600, time.time())
    need = room.estimate_bytes("2.11.0", "arm64", "linux/arm64 cp311", copies=False)
    assert need.bytes == room.TYPICAL_ARM64_CUDA and "CUDA" in need.source
    # once a CUDA tree of the target is cached, it is the measure for the next CUDA release
    cuda = tree(cache, "cuda", "2.12.0", 7000, time.time())
    meta = cuda.parent / "cuda.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "packages": [{"name": "torch", "version": "2.12.0"},
                                                     {"name": "nvidia-cublas", "version": "13.0.0"}]}))
    assert "2.12.0" in room.estimate_bytes("2.11.0", "arm64", "linux/arm64 cp311", copies=False).source
    assert "2.10.0" in room.estimate_bytes("2.9.1", "arm64", "linux/arm64 cp311", copies=False).source
    # what a tree installed decides its kind: a +cpu venv on this host is no measure of a CUDA build
    venv = cache / "venv"
    venv.mkdir()
    (venv / "v.json").write_text(json.dumps({"requirements": ["torch==2.13.0+cpu"], "size": 700 * KIB,
                                             "freeze": ["torch==2.13.0+cpu", "numpy==2.3.0"]}))
    amd64 = "linux/amd64 cp311"
    assert room.estimate_bytes("2.13.0", "amd64", amd64, copies=False).bytes == room.TYPICAL_BYTES["amd64"]
    assert "2.13.0+cpu" in room.estimate_bytes("2.12.0+cpu", "amd64", amd64, copies=False).source


def test_with_nothing_cached_the_estimate_is_a_typical_release(cache):
    assert room.estimate_bytes("2.12.0", "arm64", None, copies=False).bytes == room.TYPICAL_ARM64_CUDA
    assert room.estimate_bytes("2.5.1", "amd64", None, copies=False).bytes == room.TYPICAL_BYTES["amd64"]
    assert room.estimate_bytes("2.13.0+cpu", "amd64", None, copies=False).bytes == room.TYPICAL_CPU


# ----------------------------------------------------------------------------- making room

def test_room_is_made_least_recently_used_first_down_to_the_cap_less_the_need(cache, monkeypatch):
    now = time.time()
    old = tree(cache, "old", "2.1.0", 200, now - 3 * DAY)
    mid = tree(cache, "mid", "2.2.0", 200, now - 2 * DAY)
    new = tree(cache, "new", "2.3.0", 200, now - 1 * DAY)
    monkeypatch.setenv("LAB_CACHE_CAP", str(700 * KIB))
    got = room.make_room(250 * KIB, None, now=now)
    assert not old.exists() and mid.exists() and new.exists()  # 600 KiB + 250 > 700: the oldest goes
    assert got.ok and got.total + got.need <= got.cap


def test_what_is_pinned_held_or_used_by_a_run_is_never_released(cache, monkeypatch):
    now = time.time()
    pinned = tree(cache, "p", "2.1.0", 200, now - 5 * DAY)
    held = tree(cache, "h", "2.2.0", 200, now - 4 * DAY)
    used = tree(cache, "u", "2.3.0", 200, now - 3 * DAY)
    free = tree(cache, "f", "2.4.0", 200, now - 2 * DAY)
    inv.set_pins(["torch==2.1.0"])
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    with inv.hold(paths=(held,), why="prepared for the next round"), inv.lease():
        inv.note_use(paths=(used,))
        got = room.make_room(0, None, now=now)
        stock = {e.name: e for e in inv.take_inventory(None, now).entries}
        assert "prepared for the next round" in stock["h"].in_use
        assert stock["p"].in_use.startswith(inv.PINNED) and "torch==2.1.0" in stock["p"].label
    assert pinned.exists() and held.exists() and used.exists() and not free.exists()
    assert not got.cap_kept
    after = {e.name: e for e in inv.take_inventory(None, now).entries}  # the hold and the lease are gone
    assert after["h"].in_use is None and after["u"].in_use is None and after["p"].in_use


def test_a_too_small_cap_is_said_before_the_run_and_a_full_disk_refuses_it(cache, monkeypatch, tmp_path):
    now = time.time()
    tree(cache, "p", "2.4.0", 300, now - DAY)
    inv.set_pins(["2.4.0"])
    case = _case(tmp_path, "2.5.0")
    said: list[tuple[str, str]] = []
    monkeypatch.setenv("LAB_CACHE_CAP", str(400 * KIB))
    got = room.before_run(case, None, lambda stage, msg: said.append((stage, msg)), now=now)
    assert got is not None and not got.cap_kept and got.disk_kept
    assert said and said[-1][0] == "cache" and "will go over its cap" in said[-1][1] and "torch 2.5.0" in said[-1][1]

    monkeypatch.setattr(inv, "_free", lambda root: 100 * KIB)  # less than the 330 KiB the run adds
    with pytest.raises(room.CacheSpaceError, match="not started"):
        room.before_run(case, None, now=now)
    assert not room.may_prepare(330 * KIB, None, now=now)
    monkeypatch.setattr(inv, "_free", lambda root: 10 * GiB)
    monkeypatch.setenv("LAB_CACHE_CAP", str(10 * GiB))
    assert room.may_prepare(330 * KIB, None, now=now)


def test_a_recent_count_far_under_the_cap_answers_without_walking_the_cache(cache, monkeypatch):
    now = time.time()
    monkeypatch.setenv("LAB_CACHE_CAP", str(100 * GiB))
    inv._remember(cache, now, 1 * GiB, 100 * GiB)
    walked = []
    monkeypatch.setattr(inv, "take_inventory", lambda *a, **k: walked.append(1))
    got = room.make_room(5 * GiB, None, now=now + 1)
    assert got.ok and not got.counted and walked == []


def test_quick_answers_count_what_they_promised_when_the_disk_does_not_show_it(cache, monkeypatch):
    """Another process's deletions on the same disk can hide what the runs added: the quick answers
    still add up what each run said it would add, and walk the cache once that nears the cap."""
    now = time.time()
    monkeypatch.setenv("LAB_CACHE_CAP", str(100 * GiB))
    inv._remember(cache, now, 1 * GiB, 100 * GiB)
    monkeypatch.setattr(inv, "_free", lambda root: 500 * GiB)  # the disk's free space never drops
    walked = []

    def count(*a, **k):
        walked.append(1)
        raise RuntimeError("walked")
    monkeypatch.setattr(inv, "take_inventory", count)
    for i in range(4):  # 1 + 4 x 15 = 61 GiB with the next 15: under three quarters of the cap
        got = room.make_room(15 * GiB, None, now=now + 1 + i)
        assert got.ok and not got.counted and got.total == (1 + 15 * i) * GiB
    with pytest.raises(RuntimeError, match="walked"):  # 61 + 15 > 75: a real count
        room.make_room(15 * GiB, None, now=now + 10)
    assert walked == [1]


# ----------------------------------------------------------------------------- through a bisection

def _case(tmp_path: Path, torch: str):
    from lab.image.resolve import resolve
    scenario = tiny_scenario(tmp_path, "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\n"
                                       "expect:\n  exit_code: 1\n")
    return resolve(scenario, torch=torch, arch="arm64")


class TreeMakingRuns:
    """Stands in for pipeline.run_case as the cache sees it: the room check before it starts, a
    lease while it runs, and a 200 KiB site tree per release; records the cache's total at each start."""

    def __init__(self, cache: Path, verdicts: dict[str, str]) -> None:
        self.cache, self.verdicts, self.totals, self.ran = cache, verdicts, [], []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose, collect_env):
        room.before_run(case, None, events)
        self.totals.append(inv.take_inventory(None).total)
        with inv.lease():
            folder = tree(self.cache, f"k{case.torch.replace('.', '')}", case.torch, 200, time.time(),
                          target=target_for(case).label)
            inv.note_use(paths=(folder,))
            self.ran.append(case.torch)
            key = content_key(case)
            result = fake_result(case, self.verdicts[case.torch], run_dir, image=ImageRef(
                tag=f"torch-repro-lab/case:b-{case.torch}", id="sha256:00", cached=True),
                content_key=key.digest, content_parts=dict(key.parts))
            result.write(run_dir / "result.json")
            return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


class NoImages:
    name = "fake"

    def managed_images(self):
        return []

    def discard(self, tag: str) -> None:
        pass


def test_a_bisection_releases_each_finished_probe_and_stays_under_its_cap(cache, monkeypatch, tmp_path):
    """The triage of issue 34: every probe's tree stayed "in use" until the bisection ended, because
    one lease covered it whole. Now a finished probe's tree goes before the next probe starts."""
    versions = ["2.3.0", "2.3.1", "2.4.0", "2.4.1", "2.5.0", "2.5.1", "2.6.0"]
    monkeypatch.setenv("LAB_CACHE_CAP", str(520 * KIB))  # two trees and the bookkeeping, not three
    verdicts = {v: ("reproduced" if v < "2.5.0" else "not_reproduced") for v in versions}
    runs = TreeMakingRuns(cache, verdicts)
    tree(cache, "earlier", "2.2.0", 200, time.time() - DAY, target="linux/arm64 cp311")  # measured: no typical guess
    scenario = tiny_scenario(tmp_path, "name: b\ntorch: '2.3.0'\narch: arm64\nbase: debian:bookworm\n"
                                       "expect:\n  exit_code: 1\n")
    said: list[str] = []
    result = bisect_run.run_bisect(
        bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.6.0", blame=False), engine=NoImages(), host=HostPip(),
        runs_root=tmp_path / "runs", run_case=runs, events=lambda stage, msg: said.append(msg),
        candidates=lambda **_: list(versions)).result
    assert (result.last_old, result.first_new) == ("2.4.1", "2.5.0")
    assert len(runs.ran) >= 4
    assert all(total <= 520 * KIB for total in runs.totals), runs.totals
    assert inv.take_inventory(None).total <= 520 * KIB
    assert not any("nothing more can be removed" in m or "will go over" in m for m in said), said
    assert inv.live_leases(cache) == []


def test_a_tree_and_the_wheels_it_is_hard_linked_to_are_released_together(cache, monkeypatch):
    """Each frees nothing alone (the other link keeps the data): both go, and the count sees it."""
    now = time.time()
    wheel = cache / "uv" / "archive-v0" / "abc"
    (wheel / "torch-2.5.1.dist-info").mkdir(parents=True)
    (wheel / "torch-2.5.1.dist-info" / "METADATA").write_bytes(os.urandom(300 * KIB))
    site = cache / "site" / "k" / "lib" / "python3.11" / "site-packages" / "torch-2.5.1.dist-info"
    site.mkdir(parents=True)
    os.link(wheel / "torch-2.5.1.dist-info" / "METADATA", site / "METADATA")
    for p in (wheel / "torch-2.5.1.dist-info" / "METADATA", *wheel.parent.rglob("*"), *(cache / "site").rglob("*")):
        os.utime(p, (now - DAY, now - DAY))
    monkeypatch.setenv("LAB_CACHE_CAP", str(100 * KIB))
    monkeypatch.setattr(inv, "prune_uv", lambda *a, **k: None)  # (uv's own prune is tested apart)
    pruned = inv.prune(None, now=now)
    assert {e.part for e in pruned.removed} == {"site", "uv"}
    assert not wheel.exists() and not (cache / "site" / "k").exists()
    assert pruned.before.total - pruned.freed <= 100 * KIB


def test_cache_info_says_where_the_bytes_are_and_pin_keeps_an_entry(tmp_path):
    from tests.conftest import last_json, run_lab
    cache = tmp_path / "cache"
    now = time.time()
    tree(cache, "k1", "2.5.1", 300, now - DAY)
    runs = tmp_path / "runs" / "s" / "one"
    runs.mkdir(parents=True)
    (runs / "result.json").write_bytes(b"x" * 5000)
    env = {"LAB_CACHE_DIR": str(cache), "LAB_CACHE_CAP": "0", "LAB_RUNS_DIR": str(tmp_path / "runs"),
           "LAB_DISK_MARGIN": "3GiB", "DOCKER_HOST": "unix:///nonexistent.sock"}
    pinned = run_lab("cache", "pin", "torch==2.5.1", "--json", env=env)
    assert pinned.returncode == 0 and last_json(pinned.stdout) == {"pins": ["torch==2.5.1"]}, pinned.stderr
    info = run_lab("cache", "info", "--json", env=env)
    assert info.returncode == 0, info.stderr
    data = last_json(info.stdout)
    entry = next(e for e in data["entries"] if e["name"] == "k1")
    assert entry["pinned"] and entry["label"] == "torch==2.5.1 linux/arm64 cp311" and entry["bytes"] >= 300 * KIB
    assert data["disk_margin_bytes"] == 3 * GiB and data["free_bytes"] > 0
    assert data["runs"][0]["dir"] == str(tmp_path / "runs") and data["runs"][0]["bytes"] >= 5000
    assert "images_by_engine" in data and {p["part"] for p in data["parts"]} >= {"images", "site", "uv", "bases"}
    pruned = run_lab("cache", "prune", "--all", "--json", env=env)
    assert pruned.returncode == 0 and last_json(pruned.stdout)["removed"] == [] and (cache / "site" / "k1").is_dir()
    assert run_lab("cache", "unpin", "torch==2.5.1", env=env).returncode == 0 and inv.pins(cache) == []


def test_a_tree_a_container_mounts_stays(cache, monkeypatch):
    now = time.time()
    mounted = tree(cache, "m", "2.5.1", 100, now - DAY)
    loose = tree(cache, "l", "2.5.0", 100, now - DAY)

    class Mounting(NoImages):
        def mounted_sources(self):
            return {str(mounted): "probe-1 (exited)"}

    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    monkeypatch.setattr(inv, "prune_uv", lambda *a, **k: None)
    pruned = inv.prune(Mounting(), now=now)
    assert mounted.exists() and not loose.exists()
    kept = next(e for e in pruned.before.entries if e.name == "m")
    assert kept.in_use == "mounted by container probe-1 (exited)"
