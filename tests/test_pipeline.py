"""When the diagnose step runs by default (lab.pipeline.diagnose_decision), judged on real stderr."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lab.analyze.evidence import Evidence
from lab.analyze.tracebacks import extract_exceptions
from lab.core.arch import Arch
from lab.image.resolve import resolve
from lab.pipeline import compile_exception, diagnose_decision
from lab.scenario.lookup import load_scenario

DATA = Path(__file__).parent / "data" / "tracebacks"
SCENARIOS = Path(__file__).parent.parent / "scenarios"


def evidence(stderr_file: str | None, timed_out: bool = False) -> Evidence:
    text = (DATA / stderr_file).read_text() if stderr_file else ""
    return Evidence(exit_code=1 if text else 0, timed_out=timed_out, oom_killed=False, duration_s=1.0,
                    emulated=False, processes=1, duplicate_runtimes=(),
                    exceptions=tuple(extract_exceptions(text)), emulator_crash=None)


def case(name: str = "libgomp-amd64"):
    return resolve(load_scenario(SCENARIOS / f"{name}.yaml"), arch=Arch.AMD64)


@pytest.mark.parametrize("stderr_file", ["dlpack-torch2.13-cpu.stderr", "dlpack-torch2.9.0-arm64.stderr",
                                         "graph-break-data-dependent-if-torch2.13.stderr"])
def test_a_compiler_stack_exception_runs_diagnose_by_default(stderr_file):
    run, why = diagnose_decision(None, False, case(), evidence(stderr_file))
    assert run and "compiler stack" in why
    assert compile_exception(evidence(stderr_file)) is not None


@pytest.mark.parametrize("stderr_file", [None, "warnings-then-matmul-error-torch2.13.stderr",
                                         "syntax-error-script-py3.11.stderr", "keyboard-interrupt-py3.11.stderr"])
def test_a_clean_run_or_an_eager_error_skips_diagnose_and_says_how_to_get_it(stderr_file):
    run, why = diagnose_decision(None, False, case(), evidence(stderr_file))
    assert not run and "skipped by default" in why and "lab run --diagnose" in why


def test_asking_always_runs_and_no_diagnose_never_unless_an_expectation_needs_it():
    clean = evidence(None)
    assert diagnose_decision(True, False, case(), clean) == (True, "asked for (`--diagnose`)")
    assert diagnose_decision(None, True, case(), clean)[0]  # --compile-debug needs the diagnose run
    assert diagnose_decision(False, False, case(), evidence("dlpack-torch2.13-cpu.stderr")) == \
        (False, "`--no-diagnose`")
    counting = case("graph-break-explain")
    assert counting.scenario.expect.graph_breaks is not None
    run, why = diagnose_decision(False, False, counting, clean)
    assert run and "graph-break count" in why


def test_a_timed_out_run_is_never_diagnosed():
    run, why = diagnose_decision(True, True, case(), replace(evidence(None), timed_out=True))
    assert not run and "timed out" in why


class _Engine:
    engine_id = "ENGINE:ID"
    arch = Arch.AMD64
    native_arches = frozenset({Arch.AMD64})

    def __init__(self):
        self.calls = 0
        self.background = []
        self.envs = []

    def output_of(self, tag, command, arch, timeout, labels, background=False, env=None, gpus=False):
        self.calls += 1
        self.background.append(background)
        self.envs.append(env)
        return 0, "PyTorch version: 2.13.0+cpu\n"


def test_collect_env_is_asked_once_per_engine_and_image(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lab import pipeline

    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    engine, image = _Engine(), SimpleNamespace(tag="t", ref="t", image_id="sha256:abc")
    seen = []
    first = pipeline._collect_env(engine, image, case(), lambda stage, text: seen.append(text))
    again = pipeline._collect_env(engine, image, case(), lambda stage, text: seen.append(text))
    assert first == again == "PyTorch version: 2.13.0+cpu\n" and engine.calls == 1
    assert "kept from an earlier run" in seen[-1]
    other = SimpleNamespace(tag="t", ref="t", image_id="sha256:def")
    pipeline._collect_env(engine, other, case(), lambda *a: None, background=True)  # beside an emulated script
    assert engine.calls == 2 and engine.background == [False, True]
    assert engine.envs == [{}, {}]    # native: no emulated defaults


def test_an_emulated_collect_env_gets_the_emulated_env(tmp_path, monkeypatch):
    """collect_env under QEMU imports torch as the script does: one OpenBLAS thread, not a spinning pool."""
    from types import SimpleNamespace

    from lab import pipeline
    from lab.core.arch import EMULATED_ENV

    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    engine, image = _Engine(), SimpleNamespace(tag="t", ref="t", image_id="sha256:abc")
    arm = resolve(load_scenario(SCENARIOS / "libgomp-aarch64.yaml"))
    pipeline._collect_env(engine, image, arm, lambda *a: None, background=True)
    assert engine.envs == [EMULATED_ENV]


def test_an_emulated_run_compiles_in_one_process_unless_the_scenario_says_otherwise():
    """Under QEMU, torch 2.3.1's forked compile workers deadlocked at exit (lab.core.arch.EMULATED_ENV)."""
    from types import SimpleNamespace

    from lab.pipeline import emulated_env
    arm = resolve(load_scenario(SCENARIOS / "vmap-inside-compile.yaml"))
    on_amd64 = SimpleNamespace(arch=Arch.AMD64, native_arches=frozenset({Arch.AMD64}))
    on_arm64 = SimpleNamespace(arch=Arch.ARM64, native_arches=frozenset({Arch.ARM64}))
    assert emulated_env(arm.run_env(), arm, on_amd64)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in emulated_env(arm.run_env(), arm, on_arm64)    # native
    own = replace(arm, scenario=arm.scenario.model_copy(update={"env": {"TORCHINDUCTOR_COMPILE_THREADS": "4"}}))
    assert emulated_env(own.run_env(), own, on_amd64)["TORCHINDUCTOR_COMPILE_THREADS"] == "4"


def test_an_emulated_run_has_one_openblas_thread_unless_the_scenario_says_otherwise():
    """Under QEMU, OpenBLAS's idle pool thread holds a core for the whole run (lab.core.arch.EMULATED_ENV);
    torch's own OpenMP threads are the scenario's."""
    from types import SimpleNamespace

    from lab.pipeline import emulated_env
    arm = resolve(load_scenario(SCENARIOS / "libgomp-aarch64.yaml"))
    on_amd64 = SimpleNamespace(arch=Arch.AMD64, native_arches=frozenset({Arch.AMD64}))
    on_arm64 = SimpleNamespace(arch=Arch.ARM64, native_arches=frozenset({Arch.ARM64}))
    env = emulated_env(arm.run_env(), arm, on_amd64)
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert "OPENBLAS_NUM_THREADS" not in emulated_env(arm.run_env(), arm, on_arm64)    # native
    own = replace(arm, scenario=arm.scenario.model_copy(update={"env": {"OPENBLAS_NUM_THREADS": "2"}}))
    assert emulated_env(own.run_env(), own, on_amd64)["OPENBLAS_NUM_THREADS"] == "2"


def test_work_started_beside_the_run_answers_when_asked_and_raises_its_own_error():
    """The base made beside the cross-install (lab.pipeline._beside): both start at once, the
    answer waits for the work, and an error reaches the one who asks."""
    import threading

    from lab import pipeline
    from lab.core.errors import BaseImageError

    gate = threading.Event()
    answer = pipeline._beside(lambda: gate.wait(5) and "collected")
    started_side_by_side = not gate.is_set()
    gate.set()
    assert started_side_by_side and answer() == "collected"

    def bootstrap():
        raise BaseImageError("mmdebstrap failed (exit 1)")
    failed = pipeline._beside(bootstrap)
    with pytest.raises(BaseImageError, match="mmdebstrap failed"):
        failed()
