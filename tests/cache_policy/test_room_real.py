"""The cap through a real multi-probe run: real uv installs (PyPI) into real site trees and uv's real
cache, through the bisect driver's probe loop, with a cap that holds about two trees. The cheapest
real releases stand in for torch's: Pygments' wheels (about 1.2 MB each, 5 MB installed), since what the
policy weighs is bytes on the disk, not what the package is."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.cache_policy import inventory as inv
from lab.cache_policy import room
from lab.core.results import ImageRef, Judgement
from lab.drivers import bisect_run
from lab.image import crossinstall
from lab.image.casekey import content_key
from lab.image.crossinstall import InstallJob, ensure_site, target_for
from lab.image.hostpip import HostPip, discover
from lab.image.resolve import resolve
from lab.pipeline import RunOutcome
from tests.cache_policy.test_room import NoImages
from tests.conftest import fake_result, tiny_scenario

# torch release of the bisection -> the small real release installed for it
PIP = {"2.3.0": "2.15.1", "2.3.1": "2.16.1", "2.4.0": "2.17.2", "2.4.1": "2.18.0", "2.5.0": "2.19.1"}
BODY = "name: b\ntorch: '2.3.0'\narch: amd64\nbase: debian:bookworm\nexpect:\n  exit_code: 1\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    monkeypatch.setenv("LAB_DISK_MARGIN", "0")
    monkeypatch.delenv("LAB_CROSS_INSTALL", raising=False)
    return root


class RealTrees:
    """pipeline.run_case as the cache sees it, for real: the room check, a lease, a real uv install
    of the probe's release into a site tree (marking it and its wheels used), and the verdict."""

    def __init__(self, cache: Path, host: HostPip, said: list[str]) -> None:
        self.cache, self.host, self.said = cache, host, said
        self.totals: list[int] = []     # the cache's total when each probe had made its tree
        self.ran: list[str] = []

    def __call__(self, case, engine, host, runs_root, events, *, run_dir, diagnose, collect_env):
        target = target_for(case)
        version = PIP[case.torch]
        room.check_room(room.estimate_bytes(version, "amd64", target.label, copies=False, project="pygments"),
                        f"pygments {version}", None, events)
        with inv.lease():
            job = InstallJob((f"pygments=={version}",), target, self.host, compile_bytecode=False,
                             uv_cache=self.cache / "uv")
            site = ensure_site(job, crossinstall.install_with_uv, events)
            inv.note_use(paths=(site.root,))
            inv.note_wheels_used(site.root)
            self.totals.append(inv.take_inventory(None).total)
            self.ran.append(case.torch)
            key = content_key(case)
            verdict = "reproduced" if case.torch < "2.4.1" else "not_reproduced"
            result = fake_result(case, verdict, run_dir, image=ImageRef(tag="torch-repro-lab/case:b", id="sha256:00",
                                                                        cached=True),
                                 content_key=key.digest, content_parts=dict(key.parts))
            result.write(run_dir / "result.json")
            return RunOutcome(run_dir, result, Judgement(verdict=result.verdict, reason=result.reason))


def _one_tree(cache: Path, target, host: HostPip, version: str) -> tuple[int, int]:
    job = InstallJob((f"pygments=={version}",), target, host, compile_bytecode=False, uv_cache=cache / "uv")
    site = ensure_site(job, crossinstall.install_with_uv)
    return inv.take_inventory(None).total, site.size


def test_a_real_multi_probe_run_stays_under_a_small_cap_and_a_too_small_one_is_said_first(
        cache, tmp_path, monkeypatch):
    host = discover()
    scenario = tiny_scenario(tmp_path, BODY)
    target = target_for(resolve(scenario, torch="2.3.0", arch="amd64"))
    # measure one real tree (and uv's cache beside it), then cap the cache at about two of them
    first_total, tree = _one_tree(cache, target, host, "2.14.0")
    assert tree > 1024**2
    cap = first_total + int(1.5 * tree)
    monkeypatch.setenv("LAB_CACHE_CAP", str(cap))

    said: list[str] = []
    runs = RealTrees(cache, host, said)
    result = bisect_run.run_bisect(
        bisect_run.BisectRequest(scenario, "b", "2.3.0", "2.5.0", arch="amd64", blame=False, localize=False),
        engine=NoImages(), host=host, runs_root=tmp_path / "runs", run_case=runs,
        events=lambda stage, msg: said.append(msg), candidates=lambda **_: list(PIP)).result
    assert (result.last_old, result.first_new) == ("2.4.0", "2.4.1")
    assert len(runs.ran) >= 3
    # every probe ran with its tree, uv's wheels and the rest under the cap: the earlier probes' went
    assert all(total <= cap for total in runs.totals), (cap, runs.totals, said)
    assert inv.take_inventory(None).total <= cap
    assert len(list((cache / "site").glob("*.json"))) <= 2
    assert not any("will go over" in m or "nothing more can be removed" in m for m in said), "\n".join(said)

    # a cap smaller than one tree: said before the probe installs anything
    monkeypatch.setenv("LAB_CACHE_CAP", str(tree // 2))
    events: list[str] = []
    job = InstallJob(("pygments==2.13.0",), target, host, compile_bytecode=False, uv_cache=cache / "uv")
    got = room.check_room(room.estimate_bytes("2.13.0", "amd64", target.label, copies=False, project="pygments"),
                          "pygments 2.13.0", None, lambda stage, msg: events.append(msg))
    ensure_site(job, crossinstall.install_with_uv, lambda stage, msg: events.append(msg))
    warned = next(i for i, m in enumerate(events) if "will go over its cap" in m)
    installed = next(i for i, m in enumerate(events) if m.startswith("installing"))
    assert got is not None and not got.cap_kept and warned < installed

    # a disk that would keep less than disk_margin free: refused before anything is made
    monkeypatch.setenv("LAB_DISK_MARGIN", "1000TB")
    before = sorted(p.name for p in (cache / "site").iterdir())
    with pytest.raises(room.CacheSpaceError, match="disk_margin"):
        room.check_room(room.estimate_bytes("2.12.0", "amd64", target.label, copies=False, project="pygments"),
                        "pygments 2.12.0", None)
    assert set(p.name for p in (cache / "site").iterdir()) <= set(before)  # nothing new was made
