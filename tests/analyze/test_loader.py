"""Tests for lab.loader on real glibc LD_DEBUG=libs,files logs (see tests/data/README.md)."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.analyze.loader import (
    RUNTIME_FAMILIES,
    DuplicateRuntime,
    LoadedObject,
    canonical_path,
    describe,
    family_of,
    find_duplicate_runtimes,
    parse_dir,
    parse_lines,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "ld_debug"
INDUCTOR = DATA / "host-x86_64-torch2.13-inductor"
EAGER = DATA / "host-x86_64-torch2.13-eager"
KILLED = DATA / "host-x86_64-torch2.13-killed"
PRELOAD = DATA / "host-x86_64-torch2.13-preload-system-libgomp"
ARM64_TORCH_GOMP = "/opt/venv/lib/python3.11/site-packages/torch.libs/libgomp-f3febf51.so.1.0.0"
REAL_ARM64 = DATA / "arm64-torch2.5.1-libgomp"

VENV = "/tmp/torchvenv/lib/python3.11/site-packages"
TORCH_GOMP = f"{VENV}/torch/lib/libgomp.so.1"
KERNEL = "/tmp/torchinductor_root/js/cjsn7m2ebjumisz4o6clqb7ylnvhuu5pdefu6m34izg4jjjj22fd.main.so"
LIBPYTHON = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"


@pytest.fixture(scope="module")
def inductor():
    return parse_dir(INDUCTOR)


def _by_path(proc, path: str) -> LoadedObject:
    (obj,) = [o for o in proc.objects if o.path == path]
    return obj


# --- the real x86_64 inductor run ----------------------------------------------------------------


def test_inductor_run_has_one_entry_per_process_with_the_program(inductor):
    assert sorted(inductor) == [5818, 6080, 6084, 6189, 6193, 6194, 6225, 6686]
    programs = {pid: proc.program for pid, proc in inductor.items()}
    assert programs[5818] == "/tmp/torchvenv/bin/python"
    assert programs[6080] == "g++"
    assert programs[6084] == "/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus"
    assert programs[6225] == "/tmp/torchvenv/bin/python"


def test_torch_bundled_libgomp_is_initialised_and_needed_by_torch(inductor):
    main = inductor[5818]
    gomp = _by_path(main, TORCH_GOMP)
    assert gomp == LoadedObject(
        TORCH_GOMP, "libgomp.so.1", f"{VENV}/torch/lib/libtorch_global_deps.so", "needed", True
    )
    assert main.searches["libgomp.so.1"] == (TORCH_GOMP,)
    assert main.find("libgomp.so.1") == (gomp,)


def test_inductor_kernel_is_dlopened_and_initialised_last(inductor):
    main = inductor[5818]
    kernel = _by_path(main, KERNEL)
    assert (kernel.soname, kernel.needed_by, kernel.how, kernel.initialised) == (
        KERNEL, LIBPYTHON, "dlopen", True)
    assert main.init_order[-1] == KERNEL
    assert main.init_order[0] == "/lib64/ld-linux-x86-64.so.2"


def test_x86_inductor_run_initialises_a_single_libgomp(inductor):
    """On x86_64 the torch 2.13 wheel ships torch/lib/libgomp.so.1 whose soname is libgomp.so.1,
    so the kernel's DT_NEEDED libgomp.so.1 is satisfied by it: no second OpenMP runtime."""
    gomps = [o.path for o in inductor[5818].initialised if family_of(o.path) == "libgomp"]
    assert gomps == [TORCH_GOMP]
    assert find_duplicate_runtimes(inductor) == []


def test_isa_probe_subprocess_loads_torch_through_an_inductor_so(inductor):
    probe = inductor[6225]
    gomp = _by_path(probe, TORCH_GOMP)
    assert gomp.needed_by == f"{VENV}/torch/lib/libtorch_cpu.so"
    stdcxx = _by_path(probe, "/lib/x86_64-linux-gnu/libstdc++.so.6")
    assert "torchinductor_" in (stdcxx.needed_by or "")


def test_every_initialised_object_matches_an_init_line(inductor):
    for proc in inductor.values():
        assert [o.path for o in proc.initialised] == sorted(
            set(proc.init_order), key=[o.path for o in proc.objects].index)
        assert len(proc.init_order) == len(set(proc.init_order))


def test_relocation_dependency_lines_do_not_change_the_requester(inductor):
    # ld.5818 also says libgomp.so.1 is "needed by ...libscipy_openblas... (relocation dependency)".
    assert _by_path(inductor[5818], TORCH_GOMP).needed_by.endswith("libtorch_global_deps.so")


def test_searches_record_every_path_tried_in_order(inductor):
    tried = inductor[5818].searches["libpython3.11.so.1.0"]
    assert tried[0].endswith("/glibc-hwcaps/x86-64-v4/libpython3.11.so.1.0")
    assert tried[-1] == LIBPYTHON
    assert len(tried) == 19


def test_compiler_subprocess_loads_only_system_libraries(inductor):
    gxx = inductor[6080]
    assert [o.path for o in gxx.initialised] == [
        "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
    assert gxx.init_order == ("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6")


# --- other real logs ------------------------------------------------------------------------------


def test_eager_import_torch():
    procs = parse_dir(EAGER)
    assert list(procs) == [7410]
    proc = procs[7410]
    assert _by_path(proc, TORCH_GOMP).initialised
    assert not any("torchinductor_" in o.path for o in proc.objects)
    assert find_duplicate_runtimes(procs) == []


def test_killed_process_keeps_what_was_logged():
    procs = parse_dir(KILLED)
    proc = procs[9576]
    assert len(proc.initialised) == 51
    assert proc.initialised[-1].path.endswith("_queue.cpython-311-x86_64-linux-gnu.so")
    assert _by_path(proc, TORCH_GOMP).initialised


def test_preloaded_system_libgomp_is_marked_preload_and_torch_copy_is_skipped():
    proc = parse_dir(PRELOAD)[10155]
    gomp = _by_path(proc, "/lib/x86_64-linux-gnu/libgomp.so.1")
    assert (gomp.how, gomp.needed_by, gomp.initialised) == ("preload", "/tmp/torchvenv/bin/python", True)
    assert proc.objects[0] == gomp
    assert not any(o.path == TORCH_GOMP for o in proc.objects)
    assert _by_path(proc, LIBPYTHON).how == "needed"


def test_truncated_last_line_is_ignored(tmp_path):
    text = (KILLED / "ld.9576").read_text()
    cut = text.rindex("calling init:") + len("calling init: /root/.py")
    (tmp_path / "ld.9576").write_text(text[:cut])
    proc = parse_dir(tmp_path)[9576]
    assert not any(o.path.startswith("/root/.py") and o.path.endswith(".py") for o in proc.objects)
    assert len(proc.initialised) == 50
    assert parse_lines(text[:cut].splitlines(keepends=True))[9576] == proc


def test_parse_lines_is_lazy_over_a_generator():
    consumed = []

    def lines():
        for line in (INDUCTOR / "ld.6080").open():
            consumed.append(1)
            yield line

    procs = parse_lines(lines())
    assert len(consumed) == sum(1 for _ in (INDUCTOR / "ld.6080").open())
    assert procs[6080].program == "g++"


def test_memory_grows_with_libraries_not_with_log_size():
    lines = (INDUCTOR / "ld.5818").read_text().splitlines(keepends=True)

    def peak(repeats: int) -> int:
        tracemalloc.start()
        parse_lines(line for _ in range(repeats) for line in lines)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    once, many = peak(1), peak(40)
    assert many < once * 1.5


def test_pid_prefix_is_authoritative_over_file_name(tmp_path):
    (tmp_path / "ld.1").write_text((INDUCTOR / "ld.6080").read_text())
    assert list(parse_dir(tmp_path)) == [6080]


def test_lines_without_prefix_and_junk(tmp_path):
    raw = (
        b"garbage before anything\n"
        b"calling init: /lib/x86_64-linux-gnu/libc.so.6\n"
        b"     42:\tcalling init: /opt/lib/libgomp.so.1\n"
        b"\xff\xfe not utf-8 \x80\n"
        b"calling init: /opt/lib/libomp.so\n"
        b"     42:\tfile=\n"
        b"     42:\tfind library=; searching\n"
        b"     42:\t  trying file=\n"
        b"     42:\tfile= [0];  generating link map\n"
        b":\t\t\n"
        b"99999999999:\tcalling init: /x\n"
    )
    (tmp_path / "ld.7").write_bytes(raw)
    procs = parse_dir(tmp_path)
    assert sorted(procs) == [7, 42]
    assert [o.path for o in procs[7].initialised] == ["/lib/x86_64-linux-gnu/libc.so.6"]
    assert [o.path for o in procs[42].initialised] == ["/opt/lib/libgomp.so.1", "/opt/lib/libomp.so"]


# --- runtime families ----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "family"), [
    ("/lib/aarch64-linux-gnu/libgomp.so.1", "libgomp"),
    ("/x/torch.libs/libgomp-0f1e2d3c.so.1.0.0", "libgomp"),
    ("/x/torch.libs/libgomp-a34b3233.so.1", "libgomp"),
    ("/opt/intel/lib/libiomp5.so", "libiomp5"),
    ("/x/libomp.so", "libomp"),
    ("/x/.dylibs/libomp-1a2b3c.so", "libomp"),
    ("/usr/local/cuda/lib64/libcudart.so.12", "cudart"),
    ("/x/nvidia/cuda_runtime/lib/libcudart-d0da41ae.so.11.0", "cudart"),
    ("/x/libcublas.so.12", "cublas"),
    ("/x/libcublasLt.so.12", "cublasLt"),
    ("/x/libcudnn.so.9", "cudnn"),
    ("/x/libnccl.so.2", "nccl"),
    ("/lib/x86_64-linux-gnu/libstdc++.so.6", "libstdcxx"),
    ("/x/torch.libs/libstdc++-6f2e1b4c.so.6.0.30", "libstdcxx"),
    ("/x/libcudnn_ops.so.9", None),
    ("/x/libcudnn_cnn_infer.so.8", None),
    ("/x/libomptarget.so", None),
    ("/x/libgomp-plugin-nvptx.so.1", None),
    ("/x/libstdc++fs.so", None),
    ("/x/libtorch_cpu.so", None),
])
def test_family_of(path, family):
    assert family_of(path) == family


def test_families_have_labels():
    assert RUNTIME_FAMILIES["libgomp"].label == "GNU OpenMP"
    assert RUNTIME_FAMILIES["libomp"].label == "LLVM OpenMP"
    assert RUNTIME_FAMILIES["cudart"].label == "CUDA"
    assert {"libgomp", "libiomp5", "libomp", "cudart", "cublas", "cublasLt", "cudnn", "nccl",
            "libstdcxx"} <= set(RUNTIME_FAMILIES)


def test_canonical_path_folds_merged_usr_and_dot_dot():
    assert canonical_path("/usr/lib/aarch64-linux-gnu/libgomp.so.1") == "/lib/aarch64-linux-gnu/libgomp.so.1"
    assert canonical_path("/a/torch/lib/../../torch.libs/x.so") == "/a/torch.libs/x.so"


# --- duplicates ---------------------------------------------------------------------------------



def test_real_arm64_two_libgomp_is_a_duplicate():
    """Captured by `lab run libgomp-aarch64` (torch 2.5.1, arm64 under QEMU): pid 1 is the script."""
    procs = parse_dir(REAL_ARM64)
    dups = find_duplicate_runtimes(procs)
    assert [(d.family, d.pid) for d in dups] == [("libgomp", 1)]
    (dup,) = dups
    assert dup.paths == (ARM64_TORCH_GOMP, "/lib/aarch64-linux-gnu/libgomp.so.1")
    assert dup.objects[0].needed_by == "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
    kernel = dup.objects[1].needed_by
    assert kernel.startswith("/tmp/torchinductor_root/") and kernel.endswith(".so")
    assert describe(dup) == (
        f"two GNU OpenMP runtimes in pid 1: {ARM64_TORCH_GOMP} (needed by libtorch_cpu.so) and "
        f"/lib/aarch64-linux-gnu/libgomp.so.1 (needed by the Inductor kernel {kernel})"
    )
    # the g++/cc1plus/as/ld processes Inductor started each load one libstdc++ at most
    assert len(procs) > 1 and all(d.pid == 1 for d in dups)


def _snippet(pid: int, *inits: str) -> list[str]:
    return [f"{pid:>10}:\tcalling init: {path}\n" for path in inits]


def test_one_libgomp_through_two_symlinked_names_is_not_a_duplicate():
    procs = parse_lines(_snippet(
        7, "/lib/aarch64-linux-gnu/libgomp.so.1", "/usr/lib/aarch64-linux-gnu/libgomp.so.1",
        "/usr/lib/aarch64-linux-gnu/../aarch64-linux-gnu/libgomp.so.1"))
    assert len(procs[7].init_order) == 3
    assert len(procs[7].initialised) == 2  # the ".." spelling folds into its normalised twin
    assert find_duplicate_runtimes(procs) == []


def test_existing_host_symlink_is_resolved(tmp_path):
    real = tmp_path / "libgomp.so.1.0.0"
    real.write_bytes(b"")
    os.symlink(real, tmp_path / "libgomp.so.1")
    procs = parse_lines(_snippet(3, str(tmp_path / "libgomp.so.1"), str(real)))
    assert find_duplicate_runtimes(procs) == []


def test_duplicates_need_initialisation_and_one_pid():
    lines = [
        "        10:\tfile=libgomp.so.1 [0];  needed by /x/a.so [0]\n",
        "        10:\tfind library=libgomp.so.1 [0]; searching\n",
        "        10:\t  trying file=/lib/libgomp.so.1\n",
        "        10:\tfile=libgomp.so.1 [0];  generating link map\n",
        *_snippet(10, "/opt/torch.libs/libgomp-abc123.so.1"),
        *_snippet(11, "/lib/libgomp.so.1"),
    ]
    assert find_duplicate_runtimes(parse_lines(lines)) == []
    lines.append("        10:\tcalling init: /lib/libgomp.so.1\n")
    (dup,) = find_duplicate_runtimes(parse_lines(lines))
    assert dup.pid == 10 and dup.paths == ("/lib/libgomp.so.1", "/opt/torch.libs/libgomp-abc123.so.1")
    assert describe(dup) == ("two GNU OpenMP runtimes in pid 10: /lib/libgomp.so.1 (needed by a.so) and "
                             "/opt/torch.libs/libgomp-abc123.so.1 (requester unknown)")


def test_duplicates_sorted_by_pid_then_family():
    lines = [
        *_snippet(20, "/a/libstdc++.so.6", "/b/libstdc++-1a2b.so.6", "/a/libomp.so", "/b/libomp.so"),
        *_snippet(5, "/a/libcudart.so.12", "/b/libcudart-d0da41ae.so.12", "/c/libcudart.so.12.1"),
        *_snippet(5, "/a/libcudnn.so.9", "/a/libcudnn_ops.so.9", "/a/libcublas.so.12", "/a/libcublasLt.so.12"),
    ]
    dups = find_duplicate_runtimes(parse_lines(lines))
    assert [(d.pid, d.family) for d in dups] == [(5, "cudart"), (20, "libomp"), (20, "libstdcxx")]
    assert describe(dups[0]).startswith("three CUDA runtimes in pid 5: /a/libcudart.so.12 (")
    assert isinstance(dups[0], DuplicateRuntime)


@pytest.mark.skipif(not REAL_ARM64.is_dir(), reason="real arm64 log not captured yet")
def test_real_arm64_log_has_two_libgomp():
    dups = [d for d in find_duplicate_runtimes(parse_dir(REAL_ARM64)) if d.family == "libgomp"]
    assert dups
    assert any("torchinductor_" in (o.needed_by or "") for o in dups[0].objects)


# --- robustness ---------------------------------------------------------------------------------

_REAL_LINES = (INDUCTOR / "ld.5818").read_text().splitlines(keepends=True)[::7]


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.sampled_from(_REAL_LINES),
    st.sampled_from(_REAL_LINES).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n])),
    st.text(max_size=80),
    st.builds(lambda pid, body: f"{pid}:\t{body}", st.integers(-5, 10**12), st.text(max_size=40)),
), max_size=40))
def test_parse_lines_never_raises(lines):
    procs = parse_lines(lines)
    find_duplicate_runtimes(procs)
    for proc in procs.values():
        assert all(o.initialised for o in proc.initialised)
