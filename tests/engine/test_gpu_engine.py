"""The device request reaches the real engine: the container it makes carries it, and an engine
without the NVIDIA Container Toolkit answers it with its own refusal (`could not select device
driver`), which is what stops a GPU run before its build (lab.engine.gpu)."""

from __future__ import annotations

import pytest

from lab.core.records import RunLimits
from lab.engine import gpu
from lab.engine.docker_containers import _remove
from lab.engine.docker_engine import Engine

pytestmark = pytest.mark.docker


@pytest.fixture
def engine():
    gpu.forget()
    yield Engine.connect()
    gpu.forget()


def test_a_gpu_container_carries_a_device_request_for_all_gpus_and_the_engine_answers_it(engine):
    image, command = gpu.test_image(engine, make=True)
    container = engine._create(image, command, {}, None, {"org.torch-repro-lab.step": "test-gpu"},
                               limits=RunLimits(gpus=True))
    try:
        requests = engine.client.api.inspect_container(container.id)["HostConfig"]["DeviceRequests"]
    finally:
        _remove(container)
    assert [(r["Count"], r["Capabilities"]) for r in requests] == [(-1, [["gpu"]])]

    ok, answer = engine.try_gpu_request(image, command)
    if "nvidia" not in (engine.info().get("Runtimes") or {}):  # this machine: no GPU, no toolkit
        assert ok is False and "could not select device driver" in answer, answer
    else:
        assert ok is True, answer
    assert gpu.check(engine, make_image=True).ok is ok  # the check routing and `lab run` read


def test_a_cpu_container_requests_no_device(engine):
    image, command = gpu.test_image(engine, make=True)
    container = engine._create(image, command, {}, None, {}, limits=RunLimits())
    try:
        assert not engine.client.api.inspect_container(container.id)["HostConfig"].get("DeviceRequests")
    finally:
        _remove(container)
