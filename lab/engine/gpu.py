"""Whether a Docker engine gives its containers the GPUs, in the engine's own words.

A registered `nvidia` runtime says little: `--gpus all` works through the NVIDIA Container
Toolkit's hook, and an engine without it refuses the request when the container starts
(`could not select device driver "" with capabilities: [[gpu]]`). So the lab asks the engine the
way a GPU run will: a tiny container with a device request for all GPUs (as `--gpus all`),
confined like a run, that runs `true`. The answer is kept per engine for the process: routing,
the pre-build check of `lab run`/`bisect`/`matrix` and `lab doctor` all read the same one.

The test container's image is one already on the engine (the lab's own test image, or a Debian
base it bootstrapped, of the engine's arch). When there is none, `lab doctor` says what it did not
check; a run makes the lab's test image: one static `true` program (129 bytes for amd64, 132 for
arm64), imported in milliseconds.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, replace
from typing import BinaryIO

from lab.core.arch import Arch
from lab.core.errors import EngineError, NoGpuRuntimeError
from lab.core.tarwrite import add_bytes, add_dir, stream_tar
from lab.image.resolve import Case
from lab.scenario.bases import DEFAULT_BASE

TEST_REPO = "torch-repro-lab/gpu-check"  # the lab's test image: `<repo>:<arch>`, one static `true`
BASE_REPO = "torch-repro-lab/debian"     # bootstrapped Debian bases (lab.image.base.BOOTSTRAP_REPO)
REQUEST_WORDS = "a device request for all GPUs (as `docker run --gpus all`)"
FIX = ("On the engine's host, install the NVIDIA Container Toolkit (nvidia-container-toolkit), run "
       "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd; or, on a GPU host without "
       "Docker, run it with `--engine local`.")


@dataclass(frozen=True)
class GpuCheck:
    """The engine's answer to the test container. `ok` None: not asked (`answer` says why)."""

    ok: bool | None
    answer: str
    image: str | None = None


_ANSWERS: dict[tuple[str, str], GpuCheck] = {}
_LOCK = threading.Lock()


def where(engine) -> str:
    """'default (unix:///var/run/docker.sock)': the engine's name and address."""
    url = getattr(engine, "url", None)
    return f"{engine.name} ({url})" if url and url != engine.name else str(engine.name)


def check(engine, make_image: bool = False) -> GpuCheck:
    """Ask `engine` (once per process) whether a container that requests all GPUs starts and runs.
    Without an image to test with, `make_image` makes the lab's test image; otherwise nothing is
    asked and `ok` is None."""
    key = (str(getattr(engine, "url", None) or engine.name), engine.engine_id)
    with _LOCK:
        if key in _ANSWERS:
            return _ANSWERS[key]
        found = test_image(engine, make_image)
        if found is None:
            return GpuCheck(None, "not checked: the engine has no image to start a test container from "
                                  f"(the lab's Debian base of {engine.arch.value} would do: "
                                  f"`lab build-base {DEFAULT_BASE} --arch {engine.arch.value}`)")
        ref, command = found
        try:
            ok, answer = engine.try_gpu_request(ref, command)
        except EngineError as exc:  # creating the container was refused: that is the answer too
            ok, answer = False, exc.message
        result = GpuCheck(ok, answer, ref)
        _ANSWERS[key] = result
        return result


def forget() -> None:
    """Drop the kept answers (tests)."""
    with _LOCK:
        _ANSWERS.clear()


def test_image(engine, make: bool) -> tuple[str, list[str]] | None:
    """(image, command) of a test container of the engine's arch: the lab's test image, else a
    Debian base the lab bootstrapped, else (with `make`) a new test image; None when there is none."""
    arch = engine.arch
    ref = f"{TEST_REPO}:{arch.value}"
    if engine.image_id(ref, arch):
        return ref, ["/true"]
    for tag in engine.image_tags(f"{BASE_REPO}:*"):
        if f"-{arch.value}" in tag and engine.image_id(tag, arch):
            return tag, ["true"]
    if not make:
        return None
    try:
        engine.import_layer(lambda out: write_test_tar(out, arch), ref)
    except EngineError:
        return None
    return ref, ["/true"]


def write_test_tar(out: BinaryIO, arch: Arch) -> None:
    """The test image's filesystem: /true (a static program that exits 0), /etc and /tmp."""
    program = true_program(arch)
    with stream_tar(out) as tar:
        for folder in ("etc", "tmp"):
            add_dir(tar, folder)
        add_bytes(tar, "true", program, mode=0o755)


def true_program(arch: Arch) -> bytes:
    """A static ELF for `arch` whose one instruction sequence is exit(0): an ELF header, one
    loadable segment, and the code (x86-64: xor edi,edi; mov eax,60; syscall. AArch64: mov x0,#0;
    mov x8,#93; svc #0)."""
    machine, code = ((0x3E, bytes.fromhex("31ffb83c0000000f05")) if arch is Arch.AMD64 else
                     (0xB7, struct.pack("<3I", 0xD2800000, 0xD2800BA8, 0xD4000001)))
    base, headers = 0x400000, 64 + 56
    size = headers + len(code)
    elf = (b"\x7fELF\x02\x01\x01" + bytes(9)
           + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, base + headers, 64, 0, 0, 64, 56, 1, 0, 0, 0))
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return elf + segment + code


def cpu_variant_hint(variant: str | None) -> str:
    return f" Or run its CPU variant: `lab run {variant}`." if variant else ""


def check_case(case: Case, engine) -> None:
    """Refuse a GPU scenario before its build where the Docker `engine` cannot give it the GPUs:
    the engine answers a test container that requests them all, so what stops the run is the
    engine's own refusal. A CPU scenario asks nothing."""
    if not case.scenario.gpu:
        return
    answer = check(engine, make_image=True)
    if answer.ok is None and not engine.has_gpu_runtime():  # no test container could be started
        answer = replace(answer, ok=False, answer=f"{answer.answer}; and it lists no nvidia runtime")
    if answer.ok is False:
        raise refusal(case.scenario.name, engine, answer, case.scenario.cpu_variant)


def refusal(name: str, engine, answer: GpuCheck, cpu_variant: str | None = None) -> NoGpuRuntimeError:
    """The one paragraph that stops a GPU scenario before its build on an engine without GPUs."""
    return NoGpuRuntimeError(
        f"{name} needs a GPU, and the Docker engine {where(engine)} gives its containers none: a test "
        f"container with {REQUEST_WORDS} was refused ({answer.answer}).",
        hint=FIX + cpu_variant_hint(cpu_variant))
