"""RawRun -> Evidence on real captured loader logs (tests/data/ld_debug)."""

from __future__ import annotations

from pathlib import Path

from lab.analyze.evidence import analyze
from lab.core.records import RawRun, RunLimits
from lab.core.results import EvidenceRecord, Judgement, Verdict
from tests.conftest import DATA


def _raw(tmp_path: Path, ld: Path, **kw) -> RawRun:
    (tmp_path / "stdout.txt").write_text("")
    (tmp_path / "stderr.txt").write_text(kw.pop("stderr", ""))
    base = dict(exit_code=0, timed_out=False, oom_killed=False, duration_s=1.0, stdout_path=tmp_path / "stdout.txt",
                stderr_path=tmp_path / "stderr.txt", loader_dir=ld, emulated=False, command=("python", "s.py"),
                env=())
    return RawRun(**{**base, **kw})


def test_one_libgomp_is_named_when_there_is_no_duplicate(tmp_path):
    ev = analyze(_raw(tmp_path, DATA / "ld_debug" / "host-x86_64-torch2.13-inductor"))
    assert not ev.duplicate_runtimes
    (gomp,) = [s for s in ev.single_runtimes if s[0] == "libgomp"]
    assert gomp[1].endswith("torch/lib/libgomp.so.1")
    assert any(w.startswith("one GNU OpenMP runtime in every process that loaded one: ") for w in ev.plain_words())
    record = ev.record(Judgement(verdict=Verdict.NOT_REPRODUCED, reason="one libgomp"))
    assert [(s.family, s.path) for s in record.single_runtimes] == [(f, p) for f, p, _ in ev.single_runtimes]
    assert EvidenceRecord.model_validate_json(record.model_dump_json()) == record


def test_two_libgomps_are_not_a_single_runtime(tmp_path):
    ev = analyze(_raw(tmp_path, DATA / "ld_debug" / "arm64-torch2.5.1-libgomp"))
    assert [d.family for d in ev.duplicate_runtimes] == ["libgomp"]
    assert "libgomp" not in [s[0] for s in ev.single_runtimes]


def test_oom_words_name_the_limit(tmp_path):
    ev = analyze(_raw(tmp_path, tmp_path / "none", exit_code=137, oom_killed=True,
                      limits=RunLimits(memory_bytes=256 * 2**20)))
    assert ev.oom_words == "killed: out of memory (limit 256 MiB)"
    assert "the container was killed: out of memory (limit 256 MiB)" in ev.plain_words()


def test_emulator_crash_stopped_by_the_lab(tmp_path):
    ev = analyze(_raw(tmp_path, tmp_path / "none", exit_code=137, stopped_for="emulator crash", emulated=True,
                      stderr="qemu: uncaught target signal 11 (Segmentation fault) - core dumped\n"))
    assert ev.emulator_crash.startswith("qemu: uncaught target signal 11")
    assert any("the lab stopped the container" in w for w in ev.plain_words())


def test_a_cuda_run_names_the_cuda_libraries_it_loaded(tmp_path):
    """Issue 14's seed on a real H200 (tests/data/local-gpu): the loader evidence names the driver
    and the CUDA runtime libraries of the wheel, one copy of each."""
    ev = analyze(_raw(tmp_path, DATA / "local-gpu" / "ld", exit_code=1))
    assert not ev.duplicate_runtimes
    (words,) = [w for w in ev.plain_words() if w.startswith("CUDA libraries loaded, one copy of each: ")]
    loaded = dict((family, path) for family, path, _ in ev.single_runtimes)
    assert loaded["libcuda"].endswith("/libcuda.so.1")
    assert loaded["cudart"].endswith("nvidia/cu13/lib/libcudart.so.13")
    assert loaded["cudnn"].endswith("nvidia/cudnn/lib/libcudnn.so.9")
    assert all(loaded[f] in words for f in ("libcuda", "cudart", "cublas", "cudnn", "nccl"))
