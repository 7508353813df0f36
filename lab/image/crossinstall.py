"""Case requirements -> a venv tree installed on the host for the image's platform and Python.

pip under QEMU is the slow part of an emulated build: `pip install torch==2.5.1` took 160 s
inside an arm64 build, against about 3 s for uv on the host. So the lab resolves and installs
the case's requirements natively with `uv pip install --python-platform ... --python-version ...`
(uv evaluates tags and markers for the target, not the host) into a folder laid out like the
image's venv (`bin/`, `lib/pythonX.Y/site-packages/`). The Dockerfile copies it into /opt/venv
before its own `pip install`, which then finds every requirement satisfied. A requirement with no
wheel for the target is left to that pip step, and the lab says so.

The host cache (under `lab.cache.cache_dir()`):

    uv/               UV_CACHE_DIR: every wheel is downloaded once, for every build and bisect step
    site/<key>/       one finished venv tree per requirements, platform, Python, indexes and version
                      of this module; `.lab-lock.txt` inside lists what it holds (and the image gets it)
    site/<key>.json   the tree's digest, size, the SHA-256 and size of its layer tar under the venv,
                      and what was left to pip: computed once, when made
    site/<key>.lock   held while the entry is made; a second process waits, then finds it ready
    site/<key>.tmp/   the entry being made (same filesystem), renamed into place when finished

A warm run does no uv work and hashes nothing: the digest in `<key>.json` goes into the plan's.
"""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from lab.core.cache import cache_dir, entry_lock, in_use_by_a_run
from lab.core.config import current as current_settings
from lab.core.errors import LabError
from lab.core.hashing import CountingWriter, HashingWriter
from lab.core.records import Events, no_events
from lab.core.scrub import redact_secrets
from lab.core.tarwrite import TreeEntry, tar_info, write_tree  # noqa: F401 - (tar_info: re-exported)
from lab.image import layout
from lab.image.hostpip import HostPip
from lab.image.resolve import Case, base_glibc

CROSS_INSTALL_VERSION = 3       # part of every cache key: bump it when the tree's layout changes
VENV_IN_IMAGE = layout.VENV
PYTHON_IN_IMAGE = layout.VENV_PYTHON
LOCK_FILE = layout.LOCK_FILE     # inside the tree: it goes into the image as /opt/venv/.lab-lock.txt
# Inside the tree only when it holds everything the case needs: pip freeze, written on the host.
# The Dockerfile then runs no pip at all (under QEMU even "already satisfied" takes seconds).
FREEZE_FILE = layout.FREEZE_IN_TREE
FREEZE_SKIPS = frozenset({"pip", "setuptools", "wheel", "distribute"})  # what pip freeze leaves out
UV_TIMEOUT_S = 3 * 3600
SOURCE_DATE_EPOCH = "315532800"  # set => py_compile writes checked-hash .pyc (valid whatever the mtime)

_UV_GLIBC = ((2, 17), (2, 40))  # the manylinux range `uv --python-platform` knows
_NO_WHEEL = ("no usable wheels", "no wheels with a matching", "building from source is disabled")
# `python3 -m venv` seeds these (setuptools up to Python 3.11). Copying a second version over
# them would leave two .dist-info folders, so uv leaves them out and pip in the image upgrades
# the venv's own copy where a requirement needs a newer one (torch >= 2.10 wants setuptools>=77).
SEEDED_BY_VENV = ("pip", "setuptools")


class CrossInstallError(LabError):
    """uv could not install the requirements on the host; pip installs them inside the image instead."""


@dataclass(frozen=True, slots=True)
class Target:
    """The platform and Python an image's venv is for."""

    arch: str               # amd64 | arm64
    machine: str            # x86_64 | aarch64
    python: str             # "3.11"
    glibc: tuple[int, int]

    @property
    def uv_platform(self) -> str:
        major, minor = min(max(self.glibc, _UV_GLIBC[0]), _UV_GLIBC[1])
        return f"{self.machine}-manylinux_{major}_{minor}"

    @property
    def label(self) -> str:
        return f"linux/{self.arch} cp{self.python.replace('.', '')}"


def target_for(case: Case) -> Target | None:
    """None when the base image's Python version is unknown (CUDA images, other distributions)."""
    if case.python is None:
        return None
    return Target(case.arch.value, case.arch.uname, case.python, base_glibc(case.scenario.base))


@dataclass(frozen=True, slots=True)
class Locked:
    """One installed distribution: `name==version`, and the wheel it came from when uv says."""

    name: str
    version: str
    wheel: str | None = None
    sha256: str | None = None

    def line(self) -> str:
        extra = "  ".join(x for x in (self.wheel, self.sha256 and f"sha256:{self.sha256}") if x)
        return f"{self.name}=={self.version}" + (f"  {extra}" if extra else "")


@dataclass(frozen=True, slots=True)
class Pending:
    """A requirement left to pip inside the image, and why: `kind` is "no_wheel" (only an sdist,
    or no wheel for this platform), "venv" (the image's venv brings its own copy) or "uv"
    (uv found no solution for another reason, given in `reason`)."""

    requirement: str
    reason: str
    kind: str = "uv"

    @property
    def no_wheel(self) -> bool:
        return self.kind == "no_wheel"

    def note(self, target: Target) -> str:
        if self.kind == "no_wheel":
            return f"no wheel for {self.requirement} on {target.label}: installing it with pip inside the image"
        if self.kind == "venv":
            return f"{self.requirement}: {self.reason}"
        return (f"uv could not install {self.requirement} for {target.label} ({self.reason}): "
                "installing it with pip inside the image")


@dataclass(frozen=True, slots=True)
class InstallJob:
    requirements: tuple[str, ...]
    target: Target
    host: HostPip
    compile_bytecode: bool
    uv_cache: Path
    constraints: tuple[str, ...] = ()   # `uv --constraint` (a replay's recorded versions)


@dataclass(frozen=True, slots=True)
class Installed:
    """What an installer put under the prefix."""

    packages: tuple[Locked, ...]
    pending: tuple[Pending, ...] = ()
    tool: str = "uv"


# An installer fills `prefix` (bin/, lib/pythonX.Y/site-packages/) or raises CrossInstallError.
Installer = Callable[[InstallJob, Path], Installed]


@dataclass(frozen=True)
class Site:
    """The cross-installed tree for one case, ready to go into the build context as `site/`."""

    target: Target | None
    root: Path | None               # the cache entry; None: nothing was cross-installed
    digest: str = hashlib.sha256(b"").hexdigest()
    size: int = 0
    files: int = 0
    layer: LayerDigest | None = None  # the tree's tar under the image's venv: stacked without a count
    packages: tuple[Locked, ...] = ()
    pending: tuple[Pending, ...] = ()
    notes: tuple[str, ...] = ()     # what the user is told (pending requirements, or why nothing)
    cached: bool = False            # found ready: no uv work this time
    lock_text: str = ""

    def in_image(self, requirements: tuple[str, ...]) -> tuple[str, ...]:
        """The requirements that pip inside the image really has to install."""
        if self.root is None:
            return requirements
        return tuple(p.requirement for p in self.pending)


def no_site(case: Case, why: str) -> Site:
    return Site(target=target_for(case), root=None,
                notes=(f"no cross-install ({why}): pip installs the requirements inside the image",))


# --- the cache -----------------------------------------------------------------------
def site_key(job: InstallJob) -> str:
    """sha256 of everything that decides the tree's content."""
    data = {"version": CROSS_INSTALL_VERSION, "requirements": list(job.requirements),
            "platform": job.target.uv_platform, "python": job.target.python,
            "index": job.host.index_settings(), "bytecode": job.compile_bytecode,
            **({"constraints": sorted(job.constraints)} if job.constraints else {})}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def prepare_site(case: Case, host: HostPip, events: Events = no_events,
                 installer: Installer | None = None) -> Site:
    """The case's requirements cross-installed for its image (from the cache when there).

    Never fails the build: when uv cannot do it, the site is empty and pip in the image does it.
    """
    target = target_for(case)
    if target is None:
        site = no_site(case, f"the Python version of {case.scenario.base} is unknown")
    elif not (settings := current_settings()).cross_install:
        site = no_site(case, f"cross_install is off ({settings.origins['cross_install']}, e.g. LAB_CROSS_INSTALL=0)")
    else:
        job = InstallJob(case.requirements, target, host,
                         compile_bytecode=f"{sys.version_info[0]}.{sys.version_info[1]}" == target.python,
                         uv_cache=cache_dir("uv"), constraints=case.constraints)
        try:
            site = _unconstrained_if_same(job) or ensure_site(job, installer or install_with_uv, events)
        except (CrossInstallError, OSError) as exc:
            site = Site(target=target, root=None,
                        notes=(f"cross-install with uv failed for {target.label} ({exc}): "
                               "pip installs the requirements inside the image",))
    for note in site.notes:
        events("site", note)
    return site


def _unconstrained_if_same(job: InstallJob) -> Site | None:
    """A replay's constraints (its original run's versions) change the site key; where this host
    already has the tree of the same requirements without them, and it holds exactly the constrained
    versions, that tree is the one (the same bytes, so a replay here rebuilds the very same image)."""
    if not job.constraints:
        return None
    plain = load_site(cache_dir("site") / site_key(replace(job, constraints=())), job.target)
    if plain is None or plain.pending:
        return None
    have = {canonicalize_name(p.name): p.version for p in plain.packages}
    wanted = {canonicalize_name(c.split("==")[0]): c.split("==", 1)[1] for c in job.constraints}
    return plain if all(have.get(name, version) == version for name, version in wanted.items()) else None


def ensure_site(job: InstallJob, installer: Installer, events: Events = no_events) -> Site:
    """The cache entry for `job`, made under a file lock if it is missing."""
    root = cache_dir("site")
    key = site_key(job)
    entry = root / key
    site = load_site(entry, job.target)
    if site is not None:
        return site
    with entry_lock(root / f"{key}.lock", lambda: events(
            "site", "waiting for another lab process that is installing the same packages"), CrossInstallError):
        site = load_site(entry, job.target)
        if site is not None:
            return site
        return _make_entry(job, installer, entry, events)


def load_site(entry: Path, target: Target) -> Site | None:
    """A finished entry, or None (missing, half-written or damaged: it is then made again)."""
    try:
        meta = json.loads(entry.with_suffix(".json").read_text())
        if meta.get("version") != CROSS_INSTALL_VERSION or not entry.is_dir():
            return None
        size, files = _quick_stat(entry)
        if (size, files) != (meta["size"], meta["files"]):
            return None
        pending = tuple(Pending(**p) for p in meta["pending"])
        return Site(target=target, root=entry, digest=meta["digest"], size=size, files=files,
                    layer=LayerDigest(**meta["layer"]) if "layer" in meta else None,
                    packages=tuple(Locked(**p) for p in meta["packages"]), pending=pending,
                    notes=tuple(p.note(target) for p in pending), cached=True,
                    lock_text=(entry / LOCK_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _make_entry(job: InstallJob, installer: Installer, entry: Path, events: Events) -> Site:
    tmp = entry.with_suffix(".tmp")
    if entry.exists() and in_use_by_a_run(entry):  # damaged, yet a container sees it: not replaced now
        raise CrossInstallError(f"{entry} is mounted into a running container and cannot be made again now")
    for stale in (tmp, entry):  # left by a process that died (we hold the lock)
        if stale.exists():
            shutil.rmtree(stale)
    entry.with_suffix(".json").unlink(missing_ok=True)
    tmp.mkdir()
    try:
        events("site", f"installing {' '.join(job.requirements)} for {job.target.label} on the host (uv)")
        started = time.monotonic()
        installed = installer(job, tmp)
        text = finish_tree(tmp, job, installed)
        digest, size, files, layer = tree_digest(tmp)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    meta = {"version": CROSS_INSTALL_VERSION, "digest": digest, "size": size, "files": files,
            "layer": _asdict(layer),
            "requirements": list(job.requirements), "target": job.target.label, "tool": installed.tool,
            "seconds": round(time.monotonic() - started, 1),
            "made": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}",
            "packages": [_asdict(p) for p in installed.packages],
            "pending": [_asdict(p) for p in installed.pending]}
    meta_tmp = entry.with_suffix(".json-new")
    meta_tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(meta_tmp, entry.with_suffix(".json"))
    events("site", f"installed {len(installed.packages)} packages ({size / 1e6:.0f} MB) in {meta['seconds']} s")
    return Site(target=job.target, root=entry, digest=digest, size=size, files=files, layer=layer,
                packages=installed.packages, pending=installed.pending,
                notes=tuple(p.note(job.target) for p in installed.pending), lock_text=text)


def unfinished(site_root: Path) -> list[Path]:
    """What a process that died while making entries left under `<cache>/site`: a `.tmp` folder,
    a `.json-new` file, or a folder without its `.json` (the next maker removes each of them)."""
    if not site_root.is_dir():
        return []
    return sorted(p for p in site_root.iterdir()
                  if p.suffix in (".tmp", ".json-new") or (p.is_dir() and not p.with_suffix(".json").is_file()))


def _asdict(obj) -> dict:
    return {name: getattr(obj, name) for name in obj.__slots__}


# --- finishing a tree: the image's paths, the lock file -------------------------------
def finish_tree(prefix: Path, job: InstallJob, installed: Installed) -> str:
    """Make the installed prefix look like /opt/venv in the image; write `.lab-lock.txt`."""
    (prefix / ".lock").unlink(missing_ok=True)  # uv's own lock file for the prefix
    _rename_python_dir(prefix, job.target.python)
    fix_scripts(prefix, PYTHON_IN_IMAGE)
    text = lock_text(job, installed)
    (prefix / LOCK_FILE).write_text(text)
    if not installed.pending and not seeded_needs(prefix, job.target):
        (prefix / FREEZE_FILE).write_text(freeze_text(prefix))
    return text


def _dists(prefix: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(name, version, Requires-Dist lines) of every distribution installed in the tree."""
    for meta in sorted(prefix.glob("lib/python*/site-packages/*.dist-info/METADATA")):
        headers = email.parser.BytesHeaderParser().parsebytes(meta.read_bytes())
        if headers.get("Name") and headers.get("Version"):
            yield headers["Name"], headers["Version"], headers.get_all("Requires-Dist") or []


def seeded_needs(prefix: Path, target: Target) -> list[str]:
    """The requirements on pip or setuptools (which the image's venv seeds itself, see
    SEEDED_BY_VENV) that some installed distribution has on the target: then pip in the image
    must check or upgrade the venv's copy, so the tree cannot be called complete."""
    return [f"{name}: {line}" for name, line, _ in _seeded_lines(prefix, target)]


def seeded_requirements(prefix: Path, target: Target) -> list[str]:
    """The readable ones of `seeded_needs` as requirements (`setuptools>=77.0.3`), markers dropped
    (they hold on the target), each once."""
    found: list[str] = []
    for _, _, req in _seeded_lines(prefix, target):
        text = f"{req.name}{req.specifier}" if req is not None else None
        if text and text not in found:
            found.append(text)
    return found


def _seeded_lines(prefix: Path, target: Target) -> Iterator[tuple[str, str, Requirement | None]]:
    env = {"python_version": target.python, "python_full_version": f"{target.python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": target.machine, "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    for name, _, requires in _dists(prefix):
        for line in requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                yield name, line, None  # unreadable: let pip judge it
                continue
            if canonicalize_name(req.name) in SEEDED_BY_VENV and (req.marker is None or req.marker.evaluate(env)):
                yield name, line, req


def freeze_text(prefix: Path) -> str:
    """What `pip freeze` prints for the tree: `Name==Version`, sorted by name as pip sorts."""
    lines = sorted((f"{name}=={version}" for name, version, _ in _dists(prefix)
                    if canonicalize_name(name) not in FREEZE_SKIPS), key=str.lower)
    return "".join(f"{line}\n" for line in lines)


def lock_text(job: InstallJob, installed: Installed) -> str:
    lines = [f"# torch-repro-lab cross-install v{CROSS_INSTALL_VERSION}: {' '.join(job.requirements)}",
             f"# for {job.target.label} (--python-platform {job.target.uv_platform} "
             f"--python-version {job.target.python}), installed on the host with {installed.tool}",
             "# bytecode: " + ("compiled on the host (checked-hash .pyc)" if job.compile_bytecode else
                               "not compiled (the host's Python is another version)")]
    lines += [p.line() for p in sorted(installed.packages, key=lambda p: p.name)]
    lines += [f"# {p.note(job.target)}" for p in installed.pending]
    lines += [f"# {', '.join(SEEDED_BY_VENV)}: the image's venv has its own; pip there upgrades them "
              "if a requirement needs it"]
    return "\n".join(lines) + "\n"


def _rename_python_dir(prefix: Path, python: str) -> None:
    """uv names lib/pythonX.Y after the interpreter that ran it; the image's may be another."""
    lib = prefix / "lib"
    found = sorted(lib.glob("python*")) if lib.is_dir() else []
    wanted = lib / f"python{python}"
    if len(found) == 1 and found[0] != wanted:
        found[0].rename(wanted)


def fix_scripts(prefix: Path, python: str) -> list[Path]:
    """Point bin/ scripts at the image's Python instead of the host's; keep RECORD true.

    Files are replaced, never rewritten in place: they may be hard links into uv's cache.
    """
    bin_dir = prefix / "bin"
    changed: dict[Path, bytes] = {}
    for script in sorted(bin_dir.iterdir()) if bin_dir.is_dir() else []:
        if not script.is_file() or script.is_symlink():
            continue
        data = script.read_bytes()
        new = reshebang(data, python)
        if new != data:
            _replace_file(script, new)
            changed[script.resolve()] = new
    if changed:
        for record in prefix.glob("lib/python*/site-packages/*.dist-info/RECORD"):
            _fix_record(record, changed)
    return sorted(changed)


def reshebang(data: bytes, python: str) -> bytes:
    """The script with `#!<python>` when it starts with a Python shebang (plain or uv's /bin/sh
    trampoline for long paths); other files unchanged."""
    if not data.startswith(b"#!"):
        return data
    lines = data.split(b"\n")
    if lines[0].strip() == b"#!/bin/sh" and len(lines) > 2 and lines[1].startswith(b"'''exec'"):
        rest = lines[3:] if lines[2].strip() == b"' '''" else lines[2:]
    elif b"python" in lines[0]:
        rest = lines[1:]
    else:
        return data
    return b"\n".join([b"#!" + python.encode(), *rest])


def _replace_file(path: Path, data: bytes) -> None:
    mode = path.stat().st_mode & 0o7777
    tmp = path.with_name(path.name + ".lab-new")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _fix_record(record: Path, changed: Mapping[Path, bytes]) -> None:
    site_packages = record.parent.parent
    rows = list(csv.reader(io.StringIO(record.read_text())))
    touched = False
    for row in rows:
        if not row:
            continue
        data = changed.get((site_packages / row[0]).resolve())
        if data is not None and len(row) >= 3:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            row[1:3] = [f"sha256={digest}", str(len(data))]
            touched = True
    if touched:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        _replace_file(record, out.getvalue().encode())


# --- the tree: entries, digest --------------------------------------------------------
def walk_tree(root: Path) -> Iterator[TreeEntry]:
    """Every entry under `root`, sorted by path. Symlinks stay symlinks when they point inside
    the tree; one that points outside is refused (the image would not have its target)."""
    entries: list[TreeEntry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if path.is_symlink():
                link = os.readlink(path)
                inside = (path.parent / link).resolve()
                if os.path.isabs(link) or not inside.is_relative_to(root.resolve()):
                    raise CrossInstallError(f"{path} is a symlink to {link}, outside the installed tree")
                entries.append(TreeEntry(rel, "symlink", 0o777, link=link, source=path))
            elif path.is_dir():
                entries.append(TreeEntry(rel, "dir", 0o755, source=path))
            elif path.is_file():
                mode = 0o755 if st.st_mode & 0o100 else 0o644
                entries.append(TreeEntry(rel, "file", mode, st.st_size, source=path))
            else:
                raise CrossInstallError(f"{path} is neither a file, a folder nor a symlink")
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    return iter(sorted(entries, key=lambda e: e.path))


@dataclass(frozen=True, slots=True)
class LayerDigest:
    """The SHA-256 and size of the tree's tar `under` a folder (`write_tree_tar`), as the engine's
    image load must be told them before it reads the layer."""

    under: str
    sha256: str
    size: int


def tree_digest(root: Path, under: str = VENV_IN_IMAGE) -> tuple[str, int, int, LayerDigest]:
    """(sha256 over every entry's path, kind, mode and content; total size; file count; the tar of
    the tree `under` a folder), in one read of the tree: the tar is written to nowhere, hashed."""
    sha = hashlib.sha256(b"torch-repro-lab tree v1\n")
    counts = [0, 0]

    def seen(e: TreeEntry, content: str) -> None:
        if e.kind == "file":
            counts[0] += e.size
            counts[1] += 1
        sha.update(f"{e.kind}\0{e.path}\0{e.mode:o}\0{e.size}\0{content}\n".encode())

    layer = HashingWriter(CountingWriter())
    write_tree_tar(root, layer, under, seen)
    return sha.hexdigest(), counts[0], counts[1], LayerDigest(under.strip("/"), layer.hexdigest(), layer.size)


def write_tree_tar(root: Path | None, out: BinaryIO, under: str = "",
                   seen: Callable[[TreeEntry, str], None] | None = None) -> None:
    """The tree as a tar, streamed file by file, sorted, with normalised metadata: at the root, or
    `under` a folder (with the folders above it, as an image has them). `seen` gets each entry and
    its content's SHA-256 (a symlink: its target), hashed while the tar reads it (lab.core.tarwrite)."""
    write_tree(walk_tree(root) if root is not None else (), out, under, seen)


def _quick_stat(root: Path) -> tuple[int, int]:
    """Total size and file count, from stat alone: a cheap check that an entry is whole."""
    size = files = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if not os.path.islink(os.path.join(dirpath, name)):
                size += st.st_size
                files += 1
    return size, files


# --- uv -------------------------------------------------------------------------------
def install_with_uv(job: InstallJob, prefix: Path) -> Installed:
    """Resolve with `uv pip compile` (a pylock.toml: each wheel with its sha256), then install
    exactly that. Requirements that uv cannot resolve for the target are left to pip in the image."""
    uv = uv_binary()
    env = job.host.uv_env(os.environ)
    env.update({"UV_CACHE_DIR": str(job.uv_cache), "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"})
    if job.compile_bytecode:
        env.setdefault("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
    common = ["--no-config", "--python", sys.executable, "--python-platform", job.target.uv_platform,
              "--python-version", job.target.python, "--no-build", *job.host.uv_args()]
    with tempfile.TemporaryDirectory(prefix="lab-uv-") as work:
        lock = Path(work) / "pylock.toml"
        excludes = Path(work) / "excludes.txt"
        excludes.write_text("\n".join(SEEDED_BY_VENV) + "\n")
        resolving = [*common, "--excludes", str(excludes)]
        if job.constraints:  # resolving only: the lock then names exactly those versions
            constraints = Path(work) / "constraints.txt"
            constraints.write_text("".join(f"{c}\n" for c in job.constraints))
            resolving += ["--constraint", str(constraints)]
        seeded, asked = _split_seeded(job.requirements)
        wanted, pending = (_resolvable(uv, resolving, asked, lock, env, Path(work))
                           if asked else ((), ()))
        pending = seeded + pending
        if not wanted:
            return Installed((), pending, _uv_version(uv))
        args = ["pip", "install", "--prefix", str(prefix), *common, "-r", str(lock)]
        if job.compile_bytecode:
            args.append("--compile-bytecode")
        _run_uv(uv, args, env, Path(work))
        return Installed(_read_pylock(lock, prefix), pending, _uv_version(uv))


def _split_seeded(requirements: tuple[str, ...]) -> tuple[tuple[Pending, ...], tuple[str, ...]]:
    """Requirements on what the venv seeds go to pip in the image; the rest to uv."""
    seeded, rest = [], []
    for req in requirements:
        try:
            name = canonicalize_name(Requirement(req).name)
        except InvalidRequirement:
            rest.append(req)  # uv says what is wrong with it
            continue
        if name in SEEDED_BY_VENV:
            seeded.append(Pending(req, f"the image's venv has its own {name}; pip inside the image installs "
                                       "the version asked for", "venv"))
        else:
            rest.append(req)
    return tuple(seeded), tuple(rest)


def _resolvable(uv: str, common: list[str], requirements: tuple[str, ...], lock: Path,
                env: dict[str, str], cwd: Path) -> tuple[tuple[str, ...], tuple[Pending, ...]]:
    """Resolve all together; if that fails, find the requirements that fail on their own and
    resolve the rest. Only a resolver's "no solution" counts: other errors (network) raise."""
    together = _compile(uv, common, requirements, lock, env, cwd)
    if together is None:
        return requirements, ()
    pending = []
    for req in requirements:
        err = _compile(uv, common, (req,), lock, env, cwd)
        if err is not None:
            pending.append(Pending(req, _cause(err), "no_wheel" if any(s in err for s in _NO_WHEEL) else "uv"))
    rest = tuple(r for r in requirements if r not in {p.requirement for p in pending})
    if not pending:
        raise CrossInstallError("uv resolves each requirement alone, but not all together: " + _cause(together))
    if rest:
        err = _compile(uv, common, rest, lock, env, cwd)
        if err is not None:
            raise CrossInstallError(_cause(err))
    return rest, tuple(pending)


def _compile(uv: str, common: list[str], requirements: tuple[str, ...], lock: Path,
             env: dict[str, str], cwd: Path) -> str | None:
    """None when the requirements resolve (the lock is written); uv's error when there is no
    solution. Anything else (network, a broken index) raises."""
    args = ["pip", "compile", *common, "--format", "pylock.toml", "--no-header", "-o", str(lock), "-"]
    proc = _uv(uv, args, env, cwd, stdin="\n".join(requirements) + "\n")
    if proc.returncode == 0:
        return None
    if "No solution found" in proc.stderr:
        return proc.stderr
    raise CrossInstallError(_cause(proc.stderr) or f"uv exited with {proc.returncode}")


def _run_uv(uv: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
    proc = _uv(uv, args, env, cwd)
    if proc.returncode != 0:
        raise CrossInstallError(_cause(proc.stderr) or f"uv exited with {proc.returncode}")


# uv runs beside the base's bootstrap on a cold run (lab.pipeline): the bootstrap, emulated and
# four to six times longer, is what the run waits for, so uv (downloads, bytecode on every core)
# yields the CPU to it; alone, the niceness changes nothing
UV_NICENESS = 10


def _uv(uv: str, args: list[str], env: dict[str, str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    nice = shutil.which("nice")
    try:
        return subprocess.run([*([nice, "-n", str(UV_NICENESS)] if nice else []), uv, *args], input=stdin,
                              capture_output=True, text=True, env=env, cwd=cwd, timeout=UV_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CrossInstallError(f"uv ran past {UV_TIMEOUT_S} s") from None


def _cause(stderr: str) -> str:
    """uv's explanation, on one line: its `error:` and `cause:` lines."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    picked = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("error:", "cause:"))]
    text = "; ".join(p for p in picked if p) or " ".join(ln for ln in lines if ln)[-300:]
    return redact_secrets(text)[:500]  # uv names the index it read, whose URL is a secret


def uv_binary() -> str:
    try:
        import uv  # optional: the uv package (pip install uv); else the uv on PATH
        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise CrossInstallError("uv is not installed (pip install uv)")


def _uv_version(uv: str) -> str:
    proc = subprocess.run([uv, "--version"], capture_output=True, text=True)
    return proc.stdout.strip() or "uv"


def _read_pylock(lock: Path, prefix: Path) -> tuple[Locked, ...]:
    """name==version with the wheel's file name and sha256 from the pylock.toml; from the
    installed .dist-info folders when this Python cannot read TOML."""
    try:
        import tomllib  # optional: Python 3.11's standard library
    except ModuleNotFoundError:  # Python 3.10
        return installed_packages(prefix)
    data = tomllib.loads(lock.read_text())
    out = []
    for pkg in data.get("packages", []):
        wheels = pkg.get("wheels") or [{}]
        url = wheels[0].get("url") or wheels[0].get("path") or ""
        out.append(Locked(pkg["name"], pkg["version"], url.rsplit("/", 1)[-1] or None,
                          (wheels[0].get("hashes") or {}).get("sha256")))
    return tuple(out)


def installed_packages(prefix: Path) -> tuple[Locked, ...]:
    """name==version of every distribution under the prefix's site-packages."""
    out = []
    for meta in sorted(prefix.glob("lib/python*/site-packages/*.dist-info/METADATA")):
        fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").splitlines()[:20]
                      if ": " in line)
        if "Name" in fields and "Version" in fields:
            out.append(Locked(fields["Name"], fields["Version"]))
    return tuple(out)
