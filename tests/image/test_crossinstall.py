import dataclasses
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from lab.image import crossinstall
from lab.image.crossinstall import (
    CrossInstallError,
    Installed,
    InstallJob,
    Locked,
    Pending,
    Target,
    ensure_site,
    fix_scripts,
    freeze_text,
    prepare_site,
    reshebang,
    seeded_needs,
    site_key,
    target_for,
    tree_digest,
    unfinished,
    walk_tree,
    write_tree_tar,
)
from lab.image.hostpip import HostPip, discover
from lab.image.resolve import resolve
from lab.scenario.lookup import load_scenario
from tests.conftest import ROOT, SCENARIOS, tiny_scenario


def case(name="libgomp-aarch64", **kw):
    return resolve(load_scenario(name, SCENARIOS), **kw)


def fake_installer(job: InstallJob, prefix: Path) -> Installed:
    """Lays out what uv would: a package, its dist-info with RECORD, a script with the host's
    shebang. With LAB_TEST_INSTALL_LOG set it appends a line per call and takes a while (races)."""
    site = prefix / "lib" / "python3.11" / "site-packages"
    (site / "fake").mkdir(parents=True)
    (site / "fake" / "__init__.py").write_text(f"REQS = {list(job.requirements)!r}\n")
    info = site / "fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake\nVersion: 1.0\n")
    (prefix / "bin").mkdir()
    script = prefix / "bin" / "fake"
    script.write_text(f"#!{sys.executable}\nimport fake\n")
    script.chmod(0o755)
    (info / "RECORD").write_text("fake/__init__.py,sha256=x,1\n../../../bin/fake,sha256=old,10\n"
                                 "fake-1.0.dist-info/RECORD,,\n")
    log = os.environ.get("LAB_TEST_INSTALL_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(1.5)
    pending = tuple(Pending(r, "no usable wheels", "no_wheel") for r in job.requirements
                    if r.startswith("sdist-only"))
    return Installed((Locked("fake", "1.0", "fake-1.0-py3-none-any.whl", "ab" * 32),), pending, "fake")


def failing_installer(job: InstallJob, prefix: Path) -> Installed:
    raise CrossInstallError("the index is unreachable")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAB_CROSS_INSTALL", raising=False)
    return tmp_path / "cache"


def job(requirements=("torch==2.5.1", "numpy"), host=None, arch="arm64"):
    return InstallJob(requirements, target_for(case(arch=arch)), host or HostPip(), compile_bytecode=False,
                      uv_cache=Path("/nonexistent"))


def unknown_base(folder: Path):
    return resolve(tiny_scenario(folder, "name: other\ntorch: '2.5.1'\narch: arm64\nbase: example.org/distro:1\n"
                                         "expect: {exit_code: 0}\n"))


def test_target_follows_the_base_image(tmp_path: Path):
    t = target_for(case())
    assert (t.uv_platform, t.label, t.python) == ("aarch64-manylinux_2_36", "linux/arm64 cp311", "3.11")
    assert target_for(case(arch="amd64")).uv_platform == "x86_64-manylinux_2_36"
    cuda = target_for(case("dlpack-cuda"))  # nvidia/cuda:...-ubuntu22.04: python3 is 3.10
    assert (cuda.uv_platform, cuda.label) == ("x86_64-manylinux_2_35", "linux/amd64 cp310")
    assert target_for(unknown_base(tmp_path)) is None


def test_site_key_covers_requirements_platform_and_indexes():
    base = site_key(job())
    assert base == site_key(job())
    assert base != site_key(job(("torch==2.6.0", "numpy")))
    assert base != site_key(job(arch="amd64"))
    assert base != site_key(job(host=HostPip(find_links=("/opt/wheels",))))
    assert base == site_key(job(host=HostPip(ca_bundle=Path("/etc/ssl/ca.pem"))))  # the CA decides nothing
    constrained = dataclasses.replace(job(), constraints=("numpy==1.26.4",))  # a replay's recorded versions
    assert base != site_key(constrained) != site_key(dataclasses.replace(job(), constraints=("numpy==2.0.0",)))


def test_real_uv_installs_exactly_the_constrained_versions(cache: Path, tmp_path: Path):
    """A replay constrains the same requirements to the versions its original run had: uv (real,
    PyPI) installs those, not today's."""
    scenario = tiny_scenario(tmp_path, "name: tiny\ntorch: '2.5.1'\narch: amd64\nbase: debian:bookworm\n"
                                       "expect: {exit_code: 0}\n")
    target = target_for(resolve(scenario))
    j = InstallJob(("six",), target, discover(), compile_bytecode=False, uv_cache=cache / "uv",
                   constraints=("six==1.15.0",))
    site = ensure_site(j, crossinstall.install_with_uv)
    assert {(p.name, p.version) for p in site.packages} == {("six", "1.15.0")}
    free = ensure_site(dataclasses.replace(j, constraints=()), crossinstall.install_with_uv)
    assert [p.version for p in free.packages] != ["1.15.0"]  # today's six is newer


def test_a_constrained_job_takes_the_plain_tree_when_it_has_exactly_those_versions(cache: Path):
    """A replay on the host that made the run: the tree without constraints is already there with the
    recorded versions, so it is the one (same bytes, same image); with other versions it is not."""
    plain = job(("numpy",))
    made = ensure_site(plain, fake_installer)  # fake==1.0
    taken = crossinstall._unconstrained_if_same(dataclasses.replace(plain, constraints=("fake==1.0",)))
    assert taken is not None and (taken.root, taken.digest) == (made.root, made.digest)
    assert crossinstall._unconstrained_if_same(dataclasses.replace(plain, constraints=("fake==2.0",))) is None
    assert crossinstall._unconstrained_if_same(plain) is None


@pytest.mark.parametrize("script, expected", [
    (b"#!/root/.venv/bin/python\nimport x\n", b"#!/opt/venv/bin/python\nimport x\n"),
    (b"#!/bin/sh\n'''exec' '/a very/long path/bin/python' \"$0\" \"$@\"\n' '''\nimport x\n",
     b"#!/opt/venv/bin/python\nimport x\n"),
    (b"#!/bin/bash\necho hi\n", b"#!/bin/bash\necho hi\n"),
    (b"\x7fELF\x02\x01", b"\x7fELF\x02\x01"),
])
def test_reshebang_points_python_scripts_at_the_image(script, expected):
    assert reshebang(script, "/opt/venv/bin/python") == expected


def test_fix_scripts_keeps_record_true_and_leaves_hard_links_alone(tmp_path: Path):
    fake_installer(job(), tmp_path)
    script = tmp_path / "bin" / "fake"
    original = tmp_path / "uv-cache-copy"
    os.link(script, original)  # uv installs hard links into its cache
    before = original.read_bytes()
    assert fix_scripts(tmp_path, "/opt/venv/bin/python") == [script.resolve()]
    assert script.read_text().startswith("#!/opt/venv/bin/python\n") and os.access(script, os.X_OK)
    assert original.read_bytes() == before
    record = (tmp_path / "lib/python3.11/site-packages/fake-1.0.dist-info/RECORD").read_text()
    line = next(ln for ln in record.splitlines() if ln.startswith("../../../bin/fake,"))
    assert line.endswith(f",{len(script.read_bytes())}") and "sha256=old" not in line


def test_walk_tree_keeps_inside_symlinks_and_refuses_others(tmp_path: Path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "real.so").write_bytes(b"elf")
    (tmp_path / "lib" / "alias.so").symlink_to("real.so")
    entries = {e.path: e for e in walk_tree(tmp_path)}
    assert list(entries) == sorted(entries)
    assert entries["lib/alias.so"].kind == "symlink" and entries["lib/alias.so"].link == "real.so"
    (tmp_path / "lib" / "out").symlink_to("/etc/passwd")
    with pytest.raises(CrossInstallError, match="outside"):
        list(walk_tree(tmp_path))


def test_tree_digest_sees_content_and_the_executable_bit(tmp_path: Path):
    (tmp_path / "a").write_text("x")
    first = tree_digest(tmp_path)
    assert first[1:3] == (1, 1)
    (tmp_path / "a").chmod(0o755)
    assert tree_digest(tmp_path)[0] != first[0]
    (tmp_path / "a").chmod(0o644)
    assert tree_digest(tmp_path) == first
    (tmp_path / "a").write_text("y")
    assert tree_digest(tmp_path)[0] != first[0]


def test_the_layer_counted_with_the_tree_is_the_tar_that_is_stacked(tmp_path: Path):
    """The image load is told the layer's digest and size before it reads it: the ones counted
    when the tree was made must be those of the tar written later, under the venv."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "m.py").write_text("x = 1\n" * 5000)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool").write_text("#!/opt/venv/bin/python\n")
    (tmp_path / "bin" / "tool").chmod(0o755)
    (tmp_path / "bin" / "alias").symlink_to("tool")
    digest, size, files, layer = tree_digest(tmp_path)
    out = io.BytesIO()
    write_tree_tar(tmp_path, out, "/opt/venv")
    data = out.getvalue()
    assert (layer.under, layer.sha256, layer.size) == ("opt/venv", hashlib.sha256(data).hexdigest(), len(data))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names[:2] == ["opt", "opt/venv"] and "opt/venv/bin/alias" in names and files == 2
    assert (digest, size) == tree_digest(tmp_path)[:2]  # the tree digest does not depend on the folder


def test_an_entry_is_made_once_then_read_from_the_cache(cache: Path):
    calls = []

    def counting(j, prefix):
        calls.append(j)
        return fake_installer(j, prefix)

    first = ensure_site(job(), counting)
    second = ensure_site(job(), counting)
    assert len(calls) == 1 and second.cached and not first.cached
    assert (first.root, first.digest, first.size) == (second.root, second.digest, second.size)
    assert first.root == cache / "site" / site_key(job())
    lock = (first.root / ".lab-lock.txt").read_text()
    assert "fake==1.0  fake-1.0-py3-none-any.whl  sha256:" + "ab" * 32 in lock
    assert (first.root / "bin" / "fake").read_text().startswith("#!/opt/venv/bin/python\n")
    assert not (first.root / ".lock").exists()
    meta = json.loads((cache / "site" / f"{site_key(job())}.json").read_text())
    assert meta["digest"] == first.digest
    assert not [p for p in (cache / "site").iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_entry_is_made_again(cache: Path):
    first = ensure_site(job(), fake_installer)
    (first.root / "lib/python3.11/site-packages/fake/__init__.py").unlink()
    again = ensure_site(job(), fake_installer)
    assert not again.cached
    assert (again.root / "lib/python3.11/site-packages/fake/__init__.py").is_file()


def test_what_a_dead_maker_leaves_is_found_and_cleared(cache: Path):
    key = site_key(job())
    site_dir = cache / "site"
    (site_dir / f"{key}.tmp" / "lib").mkdir(parents=True)  # died while uv was installing
    (site_dir / key).mkdir()                               # ... or between the rename and the .json
    assert unfinished(site_dir) == [site_dir / key, site_dir / f"{key}.tmp"]
    site = ensure_site(job(), fake_installer)
    assert not site.cached and unfinished(site_dir) == []


def test_the_same_install_made_again_has_the_same_digest(cache: Path):
    """Nothing in the tree depends on when it was made: clearing the cache keeps image tags."""
    first = ensure_site(job(), fake_installer)
    shutil.rmtree(cache / "site")
    again = ensure_site(job(), fake_installer)
    assert not again.cached and again.digest == first.digest


def test_requirements_without_wheels_are_left_to_pip_and_said(cache: Path):
    events = []
    site = prepare_site(case(), HostPip(), lambda s, m: events.append((s, m)),
                        installer=lambda j, p: fake_installer(
                            InstallJob((*j.requirements, "sdist-only==1"), j.target, j.host, False, j.uv_cache), p))
    assert site.root is not None
    assert site.in_image(("torch==2.5.1", "numpy")) == ("sdist-only==1",)
    note = "no wheel for sdist-only==1 on linux/arm64 cp311: installing it with pip inside the image"
    assert site.notes == (note,) and ("site", note) in events
    assert f"# {note}" in (site.root / ".lab-lock.txt").read_text()


def test_when_uv_fails_everything_is_left_to_pip(cache: Path):
    site = prepare_site(case(), HostPip(), installer=failing_installer)
    assert site.root is None and site.in_image(("torch==2.5.1",)) == ("torch==2.5.1",)
    assert "the index is unreachable" in site.notes[0] and "inside the image" in site.notes[0]
    assert not (cache / "site").exists() or not any((cache / "site").glob("*/"))


def test_unknown_python_or_switched_off_means_no_cross_install(cache: Path, monkeypatch, tmp_path: Path):
    site = prepare_site(unknown_base(tmp_path), HostPip(), installer=fake_installer)
    assert site.root is None and "Python version of example.org/distro:1 is unknown" in site.notes[0]
    monkeypatch.setenv("LAB_CROSS_INSTALL", "0")
    site = prepare_site(case(), HostPip(), installer=fake_installer)
    assert site.root is None and "LAB_CROSS_INSTALL=0" in site.notes[0]


RACER = """
import sys
from lab.image.crossinstall import ensure_site
from tests.image.test_crossinstall import fake_installer, job
site = ensure_site(job(), fake_installer, lambda s, m: print(m, file=sys.stderr))
print(site.digest, site.root, site.cached)
"""


def test_two_processes_making_one_entry_at_once(cache: Path, tmp_path: Path):
    log = tmp_path / "installs.log"
    env = {**os.environ, "LAB_CACHE_DIR": str(cache), "LAB_TEST_INSTALL_LOG": str(log)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outputs]
    results = [out.split() for out, _ in outputs]
    assert results[0][:2] == results[1][:2]  # one digest, one folder
    assert sorted(r[2] for r in results) == ["False", "True"]  # one made it, the other found it
    assert len(log.read_text().split()) == 1  # the installer ran once
    assert any("waiting for another lab process" in err for _, err in outputs)
    site_dir = cache / "site"
    assert sorted(p.suffix for p in site_dir.iterdir()) == ["", ".json", ".lock"]
    assert unfinished(site_dir) == []
    assert tree_digest(Path(results[0][1]))[0] == results[0][0]


@pytest.mark.timeout(600)
def test_real_uv_cross_installs_small_packages_for_aarch64(cache: Path, tmp_path: Path):
    """Real uv, the host's real pip settings (proxy CA, find-links, file:// indexes) and PyPI:
    two wheels (one with a console script) and an sdist-only project, for linux/arm64 cp311."""
    scenario = tiny_scenario(tmp_path, "name: tiny\ntorch: '2.5.1'\narch: arm64\nbase: debian:bookworm\n"
                                       "expect: {exit_code: 0}\n")
    tiny = resolve(scenario)
    events = []
    target = target_for(tiny)
    host = discover()
    j = InstallJob(("six", "wheel", "docopt", "setuptools>=70"), target, host,
                   compile_bytecode=f"{sys.version_info[0]}.{sys.version_info[1]}" == target.python,
                   uv_cache=cache / "uv")
    site = ensure_site(j, crossinstall.install_with_uv, lambda s, m: events.append(m))
    names = {p.name: p for p in site.packages}
    assert {"six", "wheel"} <= set(names) and "docopt" not in names, site.packages
    assert names["six"].wheel.endswith("-py2.py3-none-any.whl") and len(names["six"].sha256) == 64
    assert [(p.requirement, p.kind) for p in site.pending] == [("setuptools>=70", "venv"), ("docopt", "no_wheel")]
    assert site.notes[1] == "no wheel for docopt on linux/arm64 cp311: installing it with pip inside the image"
    assert "the image's venv has its own setuptools" in site.notes[0]
    packages = site.root / "lib" / "python3.11" / "site-packages"
    assert (packages / "six.py").is_file()
    assert not list(packages.glob("setuptools*")) and not list(packages.glob("pip*"))  # the venv's own stay
    assert (site.root / "bin" / "wheel").read_text().startswith("#!/opt/venv/bin/python\n")
    if j.compile_bytecode:  # checked-hash .pyc: valid whatever mtime the build context gives the .py
        pyc = next((packages / "__pycache__").glob("six.cpython-311.pyc"))
        assert struct.unpack("<I", pyc.read_bytes()[4:8])[0] == 0b11
    assert (cache / "uv").is_dir()
    again = ensure_site(j, crossinstall.install_with_uv)
    assert again.cached and again.digest == site.digest


def _dist(prefix: Path, name: str, version: str, *requires: str) -> None:
    info = prefix / "lib" / "python3.11" / "site-packages" / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                         + "".join(f"Requires-Dist: {r}\n" for r in requires))


ARM = Target("arm64", "aarch64", "3.11", (2, 36))


def test_freeze_text_is_what_pip_freeze_prints(tmp_path):
    _dist(tmp_path, "torch", "2.5.1", "filelock", 'setuptools; python_version >= "3.12"')
    _dist(tmp_path, "Jinja2", "3.1.6", "MarkupSafe>=2.0")
    _dist(tmp_path, "filelock", "3.16.1")
    _dist(tmp_path, "wheel", "0.45.0")  # pip freeze leaves pip, setuptools, wheel out
    assert freeze_text(tmp_path) == "filelock==3.16.1\nJinja2==3.1.6\ntorch==2.5.1\n"


def test_a_tree_is_complete_unless_a_package_needs_the_venvs_own_setuptools_or_pip(tmp_path):
    _dist(tmp_path, "torch", "2.5.1", "filelock", 'setuptools; python_version >= "3.12"', "sympy; extra == 'opt'")
    assert seeded_needs(tmp_path, ARM) == []  # the marker is false for cp311
    assert seeded_needs(tmp_path, Target("arm64", "aarch64", "3.12", (2, 36))) == \
        ['torch: setuptools; python_version >= "3.12"']
    _dist(tmp_path, "newer", "1.0", "setuptools>=77")
    assert seeded_needs(tmp_path, ARM) == ["newer: setuptools>=77"]


def test_a_complete_tree_carries_its_freeze_and_one_with_pending_requirements_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    complete = ensure_site(job(("torch==2.5.1",)), fake_installer)
    assert (complete.root / ".lab-freeze.txt").read_text() == "fake==1.0\n"
    partial = ensure_site(job(("torch==2.5.1", "sdist-only==1")), fake_installer)
    assert partial.pending and not (partial.root / ".lab-freeze.txt").exists()


def test_uv_yields_the_cpu_to_a_bootstrap_beside_it(monkeypatch, tmp_path):
    """On a cold run uv works beside the emulated bootstrap, which the run waits for: uv is niced."""
    seen = []
    monkeypatch.setattr(crossinstall.subprocess, "run", lambda argv, **kw: seen.append(argv))
    crossinstall._uv("/bin/uv", ["pip", "install"], {}, tmp_path)
    nice = crossinstall.shutil.which("nice")
    assert seen == [[nice, "-n", "10", "/bin/uv", "pip", "install"]]
    monkeypatch.setattr(crossinstall.shutil, "which", lambda name: None)  # a host with no nice
    crossinstall._uv("/bin/uv", ["--version"], {}, tmp_path)
    assert seen[-1] == ["/bin/uv", "--version"]
