"""GPU scenarios request the GPUs: the device request, the engine's answer to a test container (kept
per engine), and how routing, the pre-build check and `lab doctor` read it. Fakes of the engine
only; the real engine's answer is in tests/engine/test_gpu_engine.py and tests/test_e2e.py."""

from __future__ import annotations

import io
import platform
import subprocess
import tarfile

import pytest

from lab import doctor
from lab.core.arch import Arch
from lab.core.errors import EngineError, NoGpuRuntimeError
from lab.core.records import RunLimits
from lab.engine import gpu
from lab.engine.docker_containers import container_options
from lab.engine.engines import EngineFacts, GiB
from lab.engine.gpu import check_case as check_gpu  # (was lab.pipeline.check_gpu)
from lab.engine.routing import Fleet, NoEngineError
from lab.pipeline import run_limits
from tests.image.test_render import case

REFUSED = 'could not select device driver "" with capabilities: [[gpu]]'


class FakeEngine:
    """What lab.engine.gpu asks of an engine: its images, and its answer to the test container."""

    kind = "docker"

    def __init__(self, name="gpu-box", images=(), answer=(False, REFUSED), runtimes=None, importable=True):
        self.name, self.url, self.engine_id = name, f"ssh://{name}", f"id-{name}"
        self.arch = Arch.AMD64
        self.images = dict.fromkeys(images, "amd64")
        self.answer, self.runtimes, self.importable = answer, runtimes or {"runc": {}}, importable
        self.asked: list[tuple[str, list[str]]] = []

    def image_id(self, ref, arch=None):
        return f"sha256:{ref}" if ref in self.images and (arch is None or self.images[ref] == arch.value) else None

    def image_tags(self, pattern):
        prefix = pattern.rstrip("*")
        return sorted(t for t in self.images if t.startswith(prefix))

    def import_layer(self, write_tar, ref):
        if not self.importable:
            raise EngineError("the engine could not import it")
        buf = io.BytesIO()
        write_tar(buf)
        self.imported = buf.getvalue()
        self.images[ref] = "amd64"
        return f"sha256:{ref}"

    def try_gpu_request(self, image, command):
        self.asked.append((image, command))
        return self.answer

    def info(self):
        return {"Runtimes": self.runtimes}

    def has_gpu_runtime(self):
        return "nvidia" in self.runtimes

    def alive(self):
        return True


@pytest.fixture(autouse=True)
def _fresh_answers():
    gpu.forget()
    yield
    gpu.forget()


def test_a_gpu_case_requests_every_gpu_of_the_engine_and_says_so_in_its_limits():
    limits = run_limits(case("dlpack-cuda"))
    assert limits.gpus and "gpus: all" in limits.describe()
    (request,) = container_options(Arch.AMD64, {}, limits, True)["device_requests"]
    assert (request["Count"], request["Capabilities"]) == (-1, [["gpu"]])  # as `docker run --gpus all`
    cpu = run_limits(case("dlpack-cpu"))
    assert not cpu.gpus and "gpus" not in cpu.describe()
    assert "device_requests" not in container_options(Arch.AMD64, {}, cpu, True)


def test_evidence_records_the_gpu_request():
    from lab.analyze.evidence import Evidence
    from lab.core.results import Judgement, Verdict
    ev = Evidence(exit_code=0, timed_out=False, oom_killed=False, duration_s=1.0, emulated=False, processes=1,
                  duplicate_runtimes=(), exceptions=(), emulator_crash=None, limits=RunLimits(gpus=True))
    record = ev.record(Judgement(verdict=Verdict.NOT_REPRODUCED, reason="r"))
    assert record.limits.gpus == "all" and "gpus: all" in ev.limits.describe()
    cpu = Evidence(exit_code=0, timed_out=False, oom_killed=False, duration_s=1.0, emulated=False, processes=1,
                   duplicate_runtimes=(), exceptions=(), emulator_crash=None, limits=RunLimits())
    assert cpu.record(Judgement(verdict=Verdict.NOT_REPRODUCED, reason="r")).limits.gpus is None


def test_the_test_program_is_a_static_true_for_each_arch():
    for arch in Arch:
        program = gpu.true_program(arch)
        assert program.startswith(b"\x7fELF\x02\x01\x01") and len(program) < 200
    tar = io.BytesIO()
    gpu.write_test_tar(tar, Arch.AMD64)
    tar.seek(0)
    with tarfile.open(fileobj=tar) as t:
        members = {m.name: m for m in t.getmembers()}
    assert members["true"].mode == 0o755 and members["etc"].isdir() and members["tmp"].isdir()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="runs the amd64 program on this host")
def test_the_amd64_test_program_runs_and_exits_0(tmp_path):
    program = tmp_path / "true"
    program.write_bytes(gpu.true_program(Arch.AMD64))
    program.chmod(0o755)
    assert subprocess.run([str(program)], timeout=10).returncode == 0


def test_the_engine_is_asked_once_per_process_with_an_image_it_has():
    engine = FakeEngine(images=["torch-repro-lab/debian:bookworm-arm64", "torch-repro-lab/debian:bookworm-amd64-abc"])
    first, again = gpu.check(engine), gpu.check(engine)
    assert first == again and first.ok is False and REFUSED in first.answer
    assert engine.asked == [("torch-repro-lab/debian:bookworm-amd64-abc", ["true"])]  # its own arch


def test_without_an_image_doctor_says_what_was_not_checked_and_a_run_makes_the_test_image():
    engine = FakeEngine()
    unknown = gpu.check(engine)
    assert unknown.ok is None and "not checked" in unknown.answer and not engine.asked
    made = gpu.check(engine, make_image=True)
    assert made.ok is False and engine.asked == [(f"{gpu.TEST_REPO}:amd64", ["/true"])]
    with tarfile.open(fileobj=io.BytesIO(engine.imported)) as t:
        assert t.extractfile("true").read() == gpu.true_program(Arch.AMD64)


def test_a_refused_gpu_case_stops_before_the_build_naming_the_engine_its_answer_and_the_fix():
    engine = FakeEngine()
    with pytest.raises(NoGpuRuntimeError) as e:
        check_gpu(case("dlpack-cuda"), engine)
    text = str(e.value)
    assert "gpu-box (ssh://gpu-box)" in text and REFUSED in text and "--gpus all" in text
    assert "nvidia-container-toolkit" in text and "nvidia-ctk runtime configure --runtime=docker" in text
    assert "restart dockerd" in text and "--engine local" in text and "lab run dlpack-cpu" in text
    check_gpu(case("dlpack-cpu"), engine)  # a CPU case asks nothing
    assert len(engine.asked) == 1


def test_an_engine_whose_test_container_runs_gets_the_gpu_case_even_without_a_registered_runtime():
    engine = FakeEngine(answer=(True, "a test container started with the GPUs and ran"))
    check_gpu(case("dlpack-cuda"), engine)  # no `nvidia` in its runtimes: the answer decides


def test_when_no_test_container_can_start_the_runtime_list_decides():
    with pytest.raises(NoGpuRuntimeError, match="not checked.*lists no nvidia runtime"):
        check_gpu(case("dlpack-cuda"), FakeEngine(importable=False))
    check_gpu(case("dlpack-cuda"), FakeEngine(name="other", importable=False, runtimes={"nvidia": {}}))


def _facts(name, gpu_registered):
    return EngineFacts(name, f"ssh://{name}", "config", reachable=True, arch="amd64", cpus=8, memory=32 * GiB,
                       gpu=gpu_registered, emulates=())


def test_routing_sends_a_gpu_case_where_the_test_container_ran_not_where_a_runtime_is_listed():
    listed = FakeEngine("listed", runtimes={"nvidia": {}})            # registered, but refuses
    working = FakeEngine("working", answer=(True, "ran"))              # not registered, but runs
    fleet = Fleet([(_facts("listed", True), listed), (_facts("working", False), working)])
    assert [r.engine for r in fleet.routes("amd64", True, "dlpack-cuda")] == ["working"]
    assert [r.engine for r in fleet.routes("amd64", False, "cpu")] == ["listed", "working"]
    assert len(listed.asked) == len(working.asked) == 1


def test_no_engine_for_a_gpu_case_names_each_engine_its_answer_and_the_fix():
    fleet = Fleet([(_facts("a", True), FakeEngine("a")), (_facts("b", False), FakeEngine("b"))])
    with pytest.raises(NoEngineError) as e:
        fleet.routes("amd64", True, "dlpack-cuda", "Or run its CPU variant: `lab run dlpack-cpu`.")
    text = str(e.value)
    assert "a: no NVIDIA runtime (ssh://a refused a test container" in text and REFUSED in text
    assert "b: no NVIDIA runtime" in text
    assert "nvidia-ctk runtime configure --runtime=docker" in text and "lab run dlpack-cpu" in text


@pytest.mark.parametrize(("engine", "status", "words"), [
    (FakeEngine(images=["torch-repro-lab/gpu-check:amd64"]), "warn", REFUSED),
    (FakeEngine(images=["torch-repro-lab/gpu-check:amd64"], answer=(True, "ran")), "ok", "gpu scenarios can run"),
    (FakeEngine(), "warn", "not checked"),
])
def test_doctor_asks_the_engine_with_a_test_container(engine, status, words):
    check = doctor._gpu(engine)
    assert check.status == status and words in check.detail
    if status == "warn" and words == REFUSED:
        assert "nvidia-ctk runtime configure --runtime=docker" in check.fix
    if words == "not checked":
        assert not engine.asked and "lab build-base" in check.fix and "runc" in check.detail
