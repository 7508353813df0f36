"""A file of a bootstrapped base replaced for the length of the bootstrap, as a dpkg diversion.

`add` does what `dpkg-divert --local --rename --divert DIVERTED --add PATH` does: an entry in
dpkg's diversions file, so that dpkg unpacks the package's own file to DIVERTED, and the file
moved there; then the stand-in takes PATH. `remove` undoes it. Both edit the file on the host,
not through dpkg-divert in the tree (emulated for a foreign arch), and so leave dpkg-divert's
backup (`diversions-old`) alone; the lab's entries, which a package's own dpkg-divert may have
copied into that backup meanwhile (dash's preinst diverts /bin/sh), are taken out of it again. The
base ends as if the lab had never diverted anything. The lab's entries are local (package `:`)
and divert to a name ending in SUFFIX. Used by mmdebstrap's hooks (lab.image.cacerts,
lab.image.nativeunpack, lab.image.nativepython, lab.image.nativeperl): the standard library only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

DIVERSIONS = "/var/lib/dpkg/diversions"
BACKUP = DIVERSIONS + "-old"
SUFFIX = ".lab-native"
# there was no diversions file before the lab's first entry: a mark outside dpkg's folder, whose
# unknown files dpkg's own config script warns about
_NEW = "/var/lib/torch-repro-lab-diversions.new"

Entry = tuple[str, str, str]  # path, diverted to, package (":" for a local diversion)


def hook_command(script: str, python: str) -> str:
    """The start of a hook's shell command for mmdebstrap: `python` runs the module file `script`
    (a hook module of the standard library only, as this one) with the arguments that follow."""
    return f"{shlex.quote(python)} {shlex.quote(str(Path(script).resolve()))}"


def native_libraries(files: list[Path]) -> tuple[Path, set[Path]]:
    """The dynamic loader and the libraries that `files` (a host program, the modules it loads)
    need, as ldd names them: what goes into the tree with a host program that runs there natively
    through its own loader (lab.image.nativepython, lab.image.nativeperl)."""
    loader, libs = None, set()
    for file in files:
        for line in subprocess.run(["ldd", str(file)], capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                libs.add(Path(parts[2]))
            elif parts and parts[0].startswith("/"):
                loader = Path(parts[0])
    if loader is None:
        raise RuntimeError(f"{files[0]}: ldd names no dynamic loader")
    return loader, libs


def add(root: Path, path: str, stand_in: str) -> str:
    """The package's `path` goes to `path + SUFFIX` when dpkg unpacks it; `stand_in` is there
    meanwhile. Returns the diverted name."""
    diverted = path + SUFFIX
    table = root / DIVERSIONS.lstrip("/")
    if not table.exists():
        table.parent.mkdir(parents=True, exist_ok=True)
        (root / _NEW.lstrip("/")).touch()
    _write(table, [*_read(table), (path, diverted, ":")])
    tool, aside = root / path.lstrip("/"), root / diverted.lstrip("/")
    if tool.exists() or tool.is_symlink():
        os.replace(tool, aside)
    tool.write_text(stand_in)
    tool.chmod(0o755)
    return diverted


def remove(root: Path, path: str) -> None:
    """The stand-in goes, the package's own file is back at `path`, and neither dpkg's diversions
    nor dpkg-divert's backup keeps the lab's entry."""
    tool, aside = root / path.lstrip("/"), root / (path + SUFFIX).lstrip("/")
    tool.unlink(missing_ok=True)
    if aside.exists() or aside.is_symlink():
        os.replace(aside, tool)
    table, backup, new = (root / p.lstrip("/") for p in (DIVERSIONS, BACKUP, _NEW))
    for f in (table, backup):
        if f.is_file():
            entries = _read(f)
            kept = [e for e in entries if e != (path, path + SUFFIX, ":")]
            if kept != entries:
                _write(f, kept)
    left = _read(table) if table.is_file() else []
    if new.exists() and not any(_ours(e) for e in left):
        new.unlink()
        if not left:
            table.unlink()


def _ours(entry: Entry) -> bool:
    return entry[2] == ":" and entry[1] == entry[0] + SUFFIX


def _read(table: Path) -> list[Entry]:
    """dpkg's format: three lines per diversion."""
    if not table.is_file():
        return []
    lines = table.read_text().splitlines()
    return [(lines[i], lines[i + 1], lines[i + 2]) for i in range(0, len(lines) - 2, 3)]


def _write(table: Path, entries: list[Entry]) -> None:
    tmp = table.with_name(table.name + ".lab-tmp")
    tmp.write_text("".join(f"{p}\n{d}\n{pkg}\n" for p, d, pkg in entries))
    tmp.chmod(0o644)
    os.replace(tmp, table)
