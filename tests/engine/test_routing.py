"""Routing and slots: pure logic over engine facts (no engine needed)."""

from __future__ import annotations

import threading
import time

import pytest

from lab.engine.engines import EngineFacts, GiB, engine_specs, parse_spec
from lab.engine.routing import Fleet, NoEngineError, routes, share


def facts(name, arch="amd64", cpus=8, mem=32 * GiB, gpu=False, emulates=("arm64",), reachable=True):
    return EngineFacts(name, f"unix:///{name}.sock", "config", reachable=reachable,
                       reason=None if reachable else "refused", arch=arch if reachable else None, cpus=cpus,
                       memory=mem, gpu=gpu, emulates=emulates)


def test_native_arm64_comes_before_qemu_and_a_remote_unknown_after_a_known_emulator():
    x86, arm, remote = facts("x86"), facts("arm", arch="arm64", emulates=()), facts("far", emulates=None)
    assert [r.engine for r in routes("arm64", False, [x86, remote, arm])] == ["arm", "x86", "far"]
    assert [r.emulated for r in routes("arm64", False, [x86, remote, arm])] == [False, True, True]
    assert [r.engine for r in routes("amd64", False, [arm, x86, remote])] == ["x86", "far"]


def test_a_gpu_case_goes_only_where_the_nvidia_runtime_is_and_says_why_not():
    plain, gpu = facts("plain"), facts("gpu", gpu=True)
    assert [r.engine for r in routes("amd64", True, [plain, gpu])] == ["gpu"]
    with pytest.raises(NoEngineError) as e:
        routes("amd64", True, [plain], what="dlpack-cuda", gpu_hint="Run its CPU variant: `lab run dlpack-cpu`.")
    assert "plain: no NVIDIA runtime" in e.value.message and "dlpack-cpu" in e.value.hint


def test_unreachable_engines_are_skipped_with_their_reason():
    down = facts("down", reachable=False)
    assert [r.engine for r in routes("amd64", False, [down, facts("up")])] == ["up"]
    with pytest.raises(NoEngineError, match="down: unreachable"):
        routes("amd64", False, [down])


def test_a_pinned_engine_is_used_even_when_emulating_and_an_unknown_name_is_an_error():
    x86, arm = facts("x86"), facts("arm", arch="arm64", emulates=())
    assert routes("arm64", False, [x86, arm], pinned="x86")[0].emulated
    with pytest.raises(NoEngineError, match="no engine named 'nope'"):
        routes("amd64", False, [x86], pinned="nope")


def test_slots_come_from_cpus_and_memory():
    assert facts("a", cpus=2, mem=24 * GiB).slots == 1
    assert facts("b", cpus=16, mem=64 * GiB).slots == 8
    assert facts("c", cpus=64, mem=16 * GiB).slots == 4
    assert facts("d", reachable=False).slots == 0


def test_jobs_are_shared_in_proportion_with_one_each_while_they_last():
    assert share([1, 1], None) == [1, 1]
    assert share([4, 1], 10) == [8, 2]
    assert share([4, 1], 2) == [1, 1]
    assert share([4, 1], 1) == [1, 0]
    assert share([0, 3], None) == [0, 3]


def test_specs_name_urls_and_contexts_and_refuse_other_schemes(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert parse_spec("ssh://lab@arm-box", "--engine").url == "ssh://lab@arm-box"
    assert "not a Docker engine address" in parse_spec("ftp://x", "--engine").problem
    assert "no Docker context named 'ghost'" in parse_spec("ghost", "--engine").problem
    specs = engine_specs(["tcp://10.0.0.2:2376", "tcp://10.0.0.2:2376"], ["ssh://a"])
    assert [s.source for s in specs] == ["current", "config", "--engine"]  # each address once


def test_the_fleet_waits_for_a_free_slot_and_moves_on_when_an_engine_is_down():
    fleet = Fleet([(facts("a", cpus=2), object()), (facts("b", cpus=2), object())], jobs=2)
    held = []
    with fleet.acquire("amd64", False) as (first, _), fleet.acquire("amd64", False) as (second, _):
        held = [first, second]
    assert held[0] is not held[1]
    fleet.mark_down("a", "stopped answering")
    with fleet.acquire("amd64", False) as (engine, _):
        assert engine is fleet.engines["b"]
    fleet.mark_down("b", "stopped answering")
    with pytest.raises(NoEngineError, match="stopped answering"), fleet.acquire("amd64", False):
        pass


def test_a_third_case_waits_until_a_slot_frees():
    fleet = Fleet([(facts("a", cpus=2), object())], jobs=1)
    order = []

    def second():
        with fleet.acquire("amd64", False):
            order.append("second")

    with fleet.acquire("amd64", False):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"]
