"""lab.image.nativepython: during an emulated bootstrap, the python3.X packages' byte-compilation
is done by the host's Python of the same version, and writes the same .pyc files.

The stand-in is run here on the host by the host's own Python, playing the tree's, with its paths
pointed at copies in tmp_path; the "native" side goes through a loader that says it was called.
The bootstrap that uses it, and the base it leaves, are in tests/test_e2e.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lab.image import diversion, nativepython

PYTHONS = nativepython.host_pythons()
pytestmark = pytest.mark.skipif(not PYTHONS, reason="needs the host's Debian /usr/bin/python3.X")
HOST = PYTHONS[-1] if PYTHONS else Path("/usr/bin/python3")
MINOR = HOST.name.removeprefix("python")
SOURCES = {"plain.py": "x = 1\n", "pkg/mod.py": "def f(a, *, b=2):\n    return [i * b for i in range(a)]\n",
           "utf8.py": "s = 'ça va'\nclass C:\n    '''doc'''\n"}


@pytest.fixture
def setup(tmp_path: Path) -> dict:
    """The package's py_compile.py, the stand-in in its place, the "host's Python" and its loader,
    a loader that logs each call before it runs the real one, and sources to compile."""
    real_py_compile = Path(f"/usr/lib/python{MINOR}/py_compile.py")
    loader, _ = diversion.native_libraries([HOST])
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "loader.log"
    logging_loader = tmp_path / "ld.so"
    logging_loader.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\nexec {loader} "$@"\n')
    logging_loader.chmod(0o755)
    (home / f"python{MINOR}").symlink_to(HOST)
    aside = tmp_path / "lib" / ("py_compile.py" + diversion.SUFFIX)
    aside.parent.mkdir()
    aside.write_bytes(real_py_compile.read_bytes())
    version = nativepython._version(HOST)

    def write(version: tuple[int, int, int]) -> Path:
        text = (nativepython.stand_in(MINOR, version, str(logging_loader))
                .replace(repr(nativepython.py_compile(MINOR) + diversion.SUFFIX), repr(str(aside)))
                .replace(repr(nativepython.HOME + f"/python{MINOR}"), repr(str(home / f"python{MINOR}"))))
        (tmp_path / "lib" / "py_compile.py").write_text(text)
        return tmp_path / "lib" / "py_compile.py"

    src = tmp_path / "src"
    for name, text in SOURCES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return {"write": write, "version": version, "log": log, "aside": aside, "src": src, "tmp": tmp_path}


def compiled(src: Path) -> dict[str, bytes]:
    return {str(p.relative_to(src)): p.read_bytes() for p in sorted(src.rglob("*.pyc"))}


def by_the_package(setup: dict, *args: str, stdin: str | None = None) -> dict[str, bytes]:
    """What the package's own py_compile writes for this command line; then the .pyc are removed."""
    subprocess.run([str(HOST), "-E", "-S", str(setup["aside"]), *args], input=stdin, text=True, check=True)
    made = compiled(setup["src"])
    for p in setup["src"].rglob("*.pyc"):
        p.unlink()
    return made


def files(setup: dict) -> list[str]:
    return [str(setup["src"] / name) for name in SOURCES]


def test_run_as_the_postinst_runs_it_the_host_python_writes_the_same_pyc(setup):
    """`python3.X -E -S /usr/lib/python3.X/py_compile.py FILE...` (python3.11-minimal's postinst)."""
    expected = by_the_package(setup, *files(setup))
    stand_in = setup["write"](setup["version"])
    subprocess.run([str(HOST), "-E", "-S", str(stand_in), *files(setup)], check=True)
    assert compiled(setup["src"]) == expected and len(expected) == 3
    called = setup["log"].read_text().splitlines()
    assert called == ["--library-path", nativepython._LIB, str(setup["tmp"] / "home" / f"python{MINOR}"),
                      "-E", "-S", str(setup["aside"]), *files(setup)]


def test_run_as_py3compile_runs_it_the_options_and_stdin_go_along(setup):
    """py3compile: `python3.X -O -m py_compile -`, the file names on stdin."""
    names = "\n".join(files(setup)) + "\n"
    subprocess.run([str(HOST), "-E", "-S", "-O", str(setup["aside"]), "-"], input=names, text=True, check=True)
    expected = compiled(setup["src"])
    for p in setup["src"].rglob("*.pyc"):
        p.unlink()
    setup["write"](setup["version"])
    env = {**os.environ, "PYTHONPATH": str(setup["tmp"] / "lib")}
    subprocess.run([str(HOST), "-S", "-O", "-m", "py_compile", "-"], input=names, text=True, env=env, check=True)
    assert compiled(setup["src"]) == expected and all(".opt-1." in name for name in expected)
    called = setup["log"].read_text().splitlines()
    assert called[3:] == ["-S", "-O", str(setup["aside"]), "-"]


def test_another_version_is_the_package_s_own_py_compile_in_place(setup):
    expected = by_the_package(setup, *files(setup))
    major, minor, micro = setup["version"]
    stand_in = setup["write"]((major, minor, micro + 1))
    subprocess.run([str(HOST), "-E", "-S", str(stand_in), *files(setup)], check=True)
    assert compiled(setup["src"]) == expected
    assert not setup["log"].exists()


def test_imported_it_is_the_package_s_own_module(setup):
    setup["write"](setup["version"])
    env = {**os.environ, "PYTHONPATH": str(setup["tmp"] / "lib")}
    code = ("import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True); "
            "print(py_compile.PycInvalidationMode.TIMESTAMP.name, py_compile.__file__)")
    out = subprocess.run([str(HOST), "-S", "-c", code, files(setup)[0]], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["TIMESTAMP", str(setup["tmp"] / "lib" / "py_compile.py")]
    assert not setup["log"].exists() and len(compiled(setup["src"])) == 1


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, os.readlink(p) if p.is_symlink() else
                                       p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_divert_and_restore_leave_the_tree_as_it_was(tmp_path):
    """A tree whose suite has no python3.X of the host's version: the stand-in and the folders made
    for it go again, and so do the host's Python and its libraries."""
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    before = snapshot(root)
    said = nativepython.divert(root, [HOST])
    assert "byte-compiles natively" in said
    stand_in = root / nativepython.py_compile(MINOR).lstrip("/")
    assert "torch-repro-lab" in stand_in.read_text()
    assert (root / nativepython.HOME.lstrip("/") / HOST.name).is_file()
    assert any((root / nativepython._LIB.lstrip("/")).glob("libc.so*"))
    assert (nativepython.py_compile(MINOR), nativepython.py_compile(MINOR) + diversion.SUFFIX, ":") in \
        diversion._read(root / diversion.DIVERSIONS.lstrip("/"))
    assert "byte-compiles with the image's own Python" in nativepython.restore(root)
    assert snapshot(root) == before


def test_the_package_s_file_comes_back_in_its_place(tmp_path):
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    nativepython.divert(root, [HOST])
    path = nativepython.py_compile(MINOR)
    (root / (path + diversion.SUFFIX).lstrip("/")).write_text("# the package's own\n")  # as dpkg unpacks it
    nativepython.restore(root)
    assert (root / path.lstrip("/")).read_text() == "# the package's own\n"
    assert not (root / nativepython.HOME.lstrip("/")).exists()
    assert not (root / diversion.DIVERSIONS.lstrip("/")).exists()


def test_only_debian_s_interpreters_serve():
    assert all(p.parent == Path("/usr/bin") and p.name.count(".") == 1 for p in PYTHONS)
