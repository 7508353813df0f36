"""lab.compare.diff on real run folders: the probe pair of a real bisection (tests/data/compare/
bisect-vmap-newapi/, arm64 under QEMU) and a real amd64 run."""

from __future__ import annotations

import json

from lab.compare.diff import boundary_pair, compare_runs, freeze, library_key, loaded_libraries, resolve_pair
from tests.conftest import DATA, last_json, run_lab

BISECT = DATA / "compare" / "bisect-vmap-newapi"
OLD, NEW, FD = BISECT / "torch2.3.1", BISECT / "torch2.4.0", BISECT / "torch2.2.2"
RELU = DATA / "compare" / "relu-inject-2.13.0"


def test_library_names_drop_versions_and_hashes():
    assert library_key("/opt/venv/lib/python3.11/site-packages/torch.libs/libgomp-f3febf51.so.1.0.0") == \
        ("libgomp", "1.0.0")
    assert library_key("/lib/aarch64-linux-gnu/libgomp.so.1") == ("libgomp", "1")
    assert library_key("/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so") == ("libtorch_cpu", None)
    assert library_key("/tmp/torchinductor_lab/ab/cabcdefghijklmnopqrstuvwxyz0123456789.so") == \
        ("inductor kernel", None)
    # torch >= 2.9 names its kernels c<hash>.main.so
    assert library_key("/tmp/torchinductor_lab/56/c56tdmqqskl6cjwfklfigwdw2vles4r4ovoq2vl4zsddwrupckos.main.so") == \
        ("inductor kernel", None)


def test_the_libgomp_boundary_shows_the_second_runtime_going_away():
    """The real libgomp-aarch64 bisection from 2.5.1 to 2.15.0 (QEMU 10): on 2.9.1 the kernel loads the
    system's libgomp beside the wheel's hashed copy; on 2.10.0 the wheel's libgomp.so.1 serves both."""
    folder = DATA / "compare" / "bisect-libgomp-aarch64"
    old, new = boundary_pair(folder)
    assert (old.name, new.name) == ("torch2.9.1", "torch2.10.0")
    c = compare_runs(old, new)
    assert (c.verdict.a, c.verdict.b) == ("reproduced", "not_reproduced")
    removed = {lib.name: lib for lib in c.libraries.removed}
    assert removed["libgomp (copy 2)"].path == "/lib/aarch64-linux-gnu/libgomp.so.1"
    assert removed["libgomp (copy 2)"].needed_by.endswith(".main.so")   # an Inductor kernel needed it
    gomp = next(ch for ch in c.libraries.changed if ch.name == "libgomp")
    assert "torch.libs/libgomp-a49a47f9.so.1.0.0" in gomp.a.path and gomp.b.path.endswith("torch/lib/libgomp.so.1")
    assert all(ch.name != "inductor kernel" for ch in c.libraries.changed)   # a new hash is not a change
    assert any("- libgomp (copy 2): /lib/aarch64-linux-gnu/libgomp.so.1" in line for line in c.summary)


def test_the_boundary_pair_of_a_bisect_folder():
    assert boundary_pair(BISECT) == (OLD, NEW)
    assert resolve_pair(BISECT, None) == (OLD, NEW)


def test_a_real_probe_pair():
    c = compare_runs(OLD, NEW)
    assert (c.a.torch, c.b.torch) == ("2.3.1", "2.4.0")
    assert c.verdict is not None and (c.verdict.a, c.verdict.b) == ("reproduced", "not_reproduced")
    assert c.exception_a is not None and c.exception_a.type == "torch._dynamo.exc.Unsupported"
    assert "torch.func.vmap capture is disabled" in c.exception_a.message
    assert c.exception_a.user_frame is not None and "/lab/repro/vmap_newapi.py" in c.exception_a.user_frame
    assert c.exception_b is None and not c.same_signature
    assert c.a.git_version and c.b.git_version and c.a.git_version != c.b.git_version
    changed = {p.field: (p.a, p.b) for p in c.packages.changed}
    assert changed["torch"] == ("2.3.1", "2.4.0")
    assert c.libraries.available
    env = {e.field: (e.a, e.b) for e in c.environment}
    assert env["torch.version.git_version"] == (c.a.git_version, c.b.git_version)
    assert any("torch==2.3.1" in line for line in c.dockerfile) or any("2.3.1" in line for line in c.dockerfile)
    # the order: verdict and signature first, the Dockerfile last
    s = c.summary
    assert s[2].startswith("verdict: reproduced → not_reproduced")
    assert s[3].startswith("exception: torch._dynamo.exc.Unsupported")
    assert [line.split(":")[0] for line in s if not line.startswith(("  ", "A:", "B:"))] == [
        "verdict", "exception", "graph breaks", "loaded libraries", "pip packages", "environment", "Dockerfile"]


def test_a_different_failure_side_by_side():
    c = compare_runs(FD, OLD)
    assert (c.verdict.a, c.verdict.b) == ("failed_differently", "reproduced")
    assert c.exception_a.type == "AttributeError" and "is_compiling" in c.exception_a.message
    assert c.exception_b.type == "torch._dynamo.exc.Unsupported"


def test_libraries_and_packages_are_read_from_the_folders():
    libs = loaded_libraries(OLD)
    assert libs is not None and "libtorch_cpu" in libs and libs["libtorch_cpu"].needed_by
    assert freeze(OLD)["torch"] == "2.3.1"


def test_the_cli_text_and_json():
    proc = run_lab("compare", str(BISECT), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = last_json(proc.stdout)
    assert doc["kind"] == "compare" and doc["schema_version"] == 1
    assert doc == json.loads(compare_runs(OLD, NEW).model_dump_json())
    assert "verdict: reproduced → not_reproduced" in proc.stderr  # the summary, on stderr with --json
    text = run_lab("compare", str(OLD), str(NEW))
    assert text.returncode == 0 and text.stdout.splitlines()[2] == "verdict: reproduced → not_reproduced"


def test_a_run_against_itself_is_the_same():
    c = compare_runs(RELU, RELU)
    assert c.verdict is None and c.same_signature
    assert not (c.libraries.added or c.libraries.removed or c.libraries.changed)
    assert c.environment == () and c.dockerfile == ()


def test_a_venv_of_its_own_per_release_is_not_a_change_of_every_library(tmp_path):
    # the local engine gives each release its own venv: the same wheel's libraries under another folder
    import shutil

    from lab.compare.diff import compare_libraries
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(RELU, a)
    shutil.copytree(RELU, b)
    for log in (b / "out" / "ld").iterdir():
        log.write_text(log.read_text().replace("/opt/venv/", "/root/.cache/torch-repro-lab/venv/c5b584b0/"))
    libs = compare_libraries(a, b)
    assert libs.available and not libs.changed and not libs.added and not libs.removed
    # a library that leaves site-packages for the system's copy is still a change
    for log in (b / "out" / "ld").iterdir():
        log.write_text(log.read_text().replace(
            "/root/.cache/torch-repro-lab/venv/c5b584b0/lib/python3.11/site-packages/torch/lib/libtorch_global_deps.so",
            "/usr/lib/x86_64-linux-gnu/libtorch_global_deps.so"))
    changed = {c.name for c in compare_libraries(a, b).changed}
    assert changed == {"libtorch_global_deps"}
