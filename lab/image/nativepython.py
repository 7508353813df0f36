"""Python's byte-compilation in a base bootstrapped under QEMU, run by the host's own Python.

    python3 nativepython.py divert ROOT PYTHON...   (mmdebstrap's --extract-hook)
    python3 nativepython.py restore ROOT            (mmdebstrap's --customize-hook)

The python3.X packages' scripts byte-compile the standard library when they are configured:
`/usr/bin/python3.X -E -S /usr/lib/python3.X/py_compile.py FILE...`, and py3compile's
`python3.X -m py_compile -` (file names on stdin). Under QEMU that is about 10 s of an arm64
bootstrap for libpython3.11-minimal and libpython3.11-stdlib; the host's python3.11 does the same
in 1 s. A .pyc depends on the interpreter's version and on the source only, not on the CPU: the
host's Debian python3.11 (3.11.2) and the arm64 image's write the same bytes for all 543 files.

`divert` copies the host's `/usr/bin/python3.X` (each PYTHON given) and the libraries it loads
into the tree, and puts a stand-in in place of the image's `/usr/lib/python3.X/py_compile.py`
(dpkg-divert's way: the package's own file is kept aside, lab.image.diversion). Run as a program
by a target Python of the same version (X.Y.Z), the stand-in hands the same command line, with
the package's own py_compile.py, to the host's Python through its own dynamic loader: the kernel
runs it natively inside the chroot, and it reads and writes the tree's files at their own paths.
Anything else (imported as a module, another version) is the package's own py_compile, run in
place. `restore` puts py_compile.py back, writes its own .pyc again from it (its package's script
compiled the stand-in at that path), and removes the host's Python: nothing of it is left in the base.
The standard library only: mmdebstrap runs this file with the lab's Python.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

if __package__:
    from lab.image import diversion
else:  # run as a file by mmdebstrap's hook: its folder is on sys.path
    import diversion  # type: ignore[no-redef]

HOME = "/var/lib/torch-repro-lab-python"
_LIB = HOME + "/lib"
_MADE = HOME + "/made-dirs"  # folders the stand-ins needed that the tree did not have: gone after
_HOST_PYTHON = re.compile(r"python3\.\d+")


def py_compile(minor: str) -> str:
    """The package's own path of py_compile.py for python `minor` ("3.11")."""
    return f"/usr/lib/python{minor}/py_compile.py"


def stand_in(minor: str, version: tuple[int, int, int], loader: str) -> str:
    """py_compile.py's stand-in: the host's python `minor` (whose version is `version`) when it runs
    as a program of the same version, the package's own py_compile in place otherwise."""
    real = py_compile(minor) + diversion.SUFFIX
    return f'''\
# torch-repro-lab: in place of py_compile.py while the base is bootstrapped, removed after it
# (lab/image/nativepython.py). Run as a program by Python {".".join(map(str, version))}, the same command
# line goes to the host's Python {minor} (same version, same .pyc), run natively by its own loader.
import os as _lab_os
import sys as _lab_sys

if __name__ == "__main__" and _lab_sys.version_info[:3] == {version!r} \\
        and _lab_os.access({HOME + "/python" + minor!r}, _lab_os.X_OK):
    _lab_head = _lab_sys.orig_argv[1:len(_lab_sys.orig_argv) - len(_lab_sys.argv) + 1]
    _lab_head = _lab_head[:-2] if len(_lab_head) >= 2 and _lab_head[-2] == "-m" else _lab_head[:-1]
    _lab_os.execv({loader!r}, [{loader!r}, "--library-path", {_LIB!r}, {HOME + "/python" + minor!r},
                               *_lab_head, {real!r}, *_lab_sys.argv[1:]])
with open({real!r}, "rb") as _lab_f:
    exec(compile(_lab_f.read(), __file__, "exec"))
'''


def host_pythons() -> list[Path]:
    """The host's Debian interpreters, /usr/bin/python3.X (what a Debian tree's scripts call), when
    ldd can name the libraries that go into the tree with them."""
    if shutil.which("ldd") is None:
        return []
    return sorted(p for p in Path("/usr/bin").glob("python3.*") if _HOST_PYTHON.fullmatch(p.name)
                  and p.is_file() and not p.is_symlink())


def hooks(pythons: list[Path], python: str = sys.executable) -> tuple[list[str], list[str]]:
    """mmdebstrap's options: (the extract hook that diverts, the customize hook that restores)."""
    run = diversion.hook_command(__file__, python)
    return ([f'--extract-hook={run} divert "$1" ' + " ".join(str(p) for p in pythons)],
            [f'--customize-hook={run} restore "$1"'])


def _version(python: Path) -> tuple[int, int, int]:
    out = subprocess.run([str(python), "-S", "-c", "import sys; print(*sys.version_info[:3])"],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def divert(root: Path, pythons: list[Path]) -> str:
    """Before the essential packages are installed: each host Python and its libraries into the
    tree, and a stand-in in place of the same version's py_compile.py."""
    home = root / HOME.lstrip("/")
    (root / _LIB.lstrip("/")).mkdir(parents=True, exist_ok=True)
    made: list[str] = []
    said = []
    for python in pythons:
        minor, version = python.name.removeprefix("python"), _version(python)
        loader, libs = diversion.native_libraries([python])
        for lib in (loader, *libs):
            shutil.copy2(lib, root / _LIB.lstrip("/") / lib.name)
        shutil.copy2(python, home / python.name)
        for folder in reversed(Path(py_compile(minor).lstrip("/")).parents[:-1]):
            if not (root / folder).exists() and not (root / folder).is_symlink():
                (root / folder).mkdir()
                made.append(f"/{folder}")
        diversion.add(root, py_compile(minor), stand_in(minor, version, f"{_LIB}/{loader.name}"))
        said.append(".".join(map(str, version)))
    (root / _MADE.lstrip("/")).write_text("".join(f"{m}\n" for m in made))
    return f"python: byte-compiles natively (the host's Python {', '.join(said)}) until every package is installed"


def restore(root: Path) -> str:
    """py_compile.py is the package's own again, with its own .pyc, and the host's Python is gone."""
    home = root / HOME.lstrip("/")
    for python in sorted(home.glob("python3.*")):
        minor = python.name.removeprefix("python")
        path = py_compile(minor)
        diversion.remove(root, path)
        _recompile(root, path)
    made = (root / _MADE.lstrip("/")).read_text().split() if (root / _MADE.lstrip("/")).is_file() else []
    shutil.rmtree(home)
    for folder in reversed(made):  # the deepest first; a folder a package has filled since stays
        with contextlib.suppress(OSError):
            (root / folder.lstrip("/")).rmdir()
    return "python: byte-compiles with the image's own Python again"


def _recompile(root: Path, path: str) -> None:
    """The package's script compiled the stand-in at `path`: each .pyc of it there is written
    again from the package's own file, by the tree's own Python, as that script writes it (the
    same optimization level, the same invalidation mode, read from the .pyc's header)."""
    source = root / path.lstrip("/")
    cached = sorted((source.parent / "__pycache__").glob(source.stem + ".*.pyc"))
    if not source.is_file() or not cached:
        return
    python = "/usr/bin/python" + source.parent.name.removeprefix("python")
    code = ("import py_compile as p, sys\n"
            "src, pyc, opt, mode = sys.argv[1:]\n"
            "p.compile(src, pyc, doraise=True, optimize=int(opt), invalidation_mode=p.PycInvalidationMode[mode])\n")
    for pyc in cached:
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")  # PEP 552
        mode = "CHECKED_HASH" if flags == 3 else "UNCHECKED_HASH" if flags == 1 else "TIMESTAMP"
        opt = pyc.name.rsplit(".", 2)[-2].partition("opt-")[2] or "0"
        # -B: importing py_compile (the stale .pyc is the stand-in's) writes nothing itself
        subprocess.run(["chroot", str(root), python, "-B", "-E", "-S", "-c", code, path,
                        "/" + str(pyc.relative_to(root)), opt, mode], check=True)


if __name__ == "__main__":
    if sys.argv[1] == "divert":
        print(divert(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]), flush=True)
    else:
        print(restore(Path(sys.argv[2])), flush=True)
