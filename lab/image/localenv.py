"""Case -> the local engine's Python environment (`--engine local`): what an image is elsewhere.

- `--python-env venv` (the default): a venv per case made with uv from the host's Python (the
  `local.python` setting, else the Python that runs the lab), holding torch at the pinned version
  and the scenario's pip requirements, from the host's package sources (the same index, extra
  indexes, find-links and CA bundle as the images' cross-installs, `HostPip`). Only wheels
  (`--no-build`: nothing from an sdist's build script runs on the host). Cached like the site/
  trees, under the lab's cache folder:

      venv/<key>/       one finished venv (relocatable); `.lab-freeze.txt` inside says what it holds
      venv/<key>.json   how it was made: requirements, Python, seconds, size
      venv/<key>.lock   held while it is made; venv/<key>.tmp/ the venv being made

  The key covers the requirements, the interpreter (path and version), the host's index settings
  and this module's version. uv keeps every wheel in its cache (`uv/`, shared with the
  cross-installs) and links them into each venv, so a new torch version of a bisection costs
  seconds once its wheels were downloaded.
- `--python-env current`: the interpreter already there (`local.python`, else the Python that runs
  the lab), when its torch is the case's and it has the scenario's pip requirements; otherwise an
  error says what differs.

System packages come from the host: the scenario's `system_packages` must be installed (checked
with dpkg-query), and the lab never installs any.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from lab.core.cache import cache_dir, entry_lock
from lab.core.config import current as current_settings
from lab.core.errors import BuildError, LabError
from lab.core.records import BaseImage, BuiltImage, Events, LocalImage, no_events
from lab.core.scrub import redact_secrets
from lab.image.crossinstall import SOURCE_DATE_EPOCH, uv_binary
from lab.image.hostpip import HostPip
from lab.image.resolve import Case

LOCAL_ENV_VERSION = 2
FREEZE_FILE = ".lab-freeze.txt"
UV_TIMEOUT_S = 3 * 3600
PROBE_TIMEOUT_S = 120

# Run by the interpreter to describe itself: no import of torch (slow, and it may fail to load).
_PROBE = r"""
import json, re, sys, sysconfig
from importlib import metadata, util
dists = {}
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        dists.setdefault(name.lower().replace("_", "-").replace(".", "-"), d.version)
# torch's own __version__ carries the build (2.11.0+cu130) where its metadata may not (2.11.0):
# read torch/version.py as text, without importing torch
try:
    spec = util.find_spec("torch")
    text = open(spec.origin.rsplit("/", 1)[0] + "/version.py").read()
    found = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", text, re.M)
    if found and "torch" in dists:
        dists["torch"] = found.group(1)
except Exception:
    pass
print(json.dumps({"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
                  "prefix": sys.prefix, "base_prefix": sys.base_prefix,
                  "path": [p for p in sys.path if p], "stdlib": sysconfig.get_paths()["stdlib"],
                  "dists": dists}))
"""


class PythonEnvError(LabError):
    """The interpreter for `--python-env current` does not have the case's torch or requirements."""


class MissingSystemPackagesError(LabError):
    """System packages the scenario needs are not installed on the host; the lab never installs them."""


@dataclass(frozen=True)
class Interpreter:
    """A Python on this host, as it describes itself."""

    path: str
    executable: str
    version: str
    prefix: str
    base_prefix: str
    sys_path: tuple[str, ...]
    stdlib: str
    dists: tuple[tuple[str, str], ...]

    def dist(self, name: str) -> str | None:
        return dict(self.dists).get(canonicalize_name(name))


def default_python() -> str:
    """The `local.python` setting, else the Python running the lab."""
    configured = current_settings()["local.python"]
    return str(configured) if configured else sys.executable


@lru_cache(maxsize=16)
def probe_python(path: str) -> Interpreter:
    """Run `path` to learn its version, prefixes, sys.path and installed distributions."""
    try:
        proc = subprocess.run([path, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PythonEnvError(f"the Python {path} does not run: {exc}.",
                             hint="Point LAB_LOCAL_PYTHON (or `local.python` in lab.toml) at a Python 3.") from None
    if proc.returncode != 0:
        raise PythonEnvError(f"the Python {path} failed to describe itself (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-300:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return Interpreter(path=path, executable=data["executable"], version=data["version"], prefix=data["prefix"],
                       base_prefix=data["base_prefix"], sys_path=tuple(data["path"]), stdlib=data["stdlib"],
                       dists=tuple(sorted(data["dists"].items())))


# --- system packages ---------------------------------------------------------------------------
def missing_system_packages(packages: tuple[str, ...] | list[str]) -> tuple[list[str], str | None]:
    """(the packages dpkg says are not installed, a note when it cannot be asked)."""
    if not packages:
        return [], None
    tool = shutil.which("dpkg-query")
    if tool is None:
        return [], "the host has no dpkg-query, so the lab could not check the scenario's system packages"
    missing = []
    for name in packages:
        proc = subprocess.run([tool, "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True)
        if proc.returncode != 0 or proc.stdout.strip() != "installed":
            missing.append(name)
    return missing, None


def check_system_packages(case: Case, events: Events = no_events) -> str:
    """Refuse a case whose system packages are not on the host; the words for the report."""
    packages = tuple(case.scenario.system_packages)
    missing, note = missing_system_packages(packages)
    if missing:
        raise MissingSystemPackagesError(
            f"{case.scenario.name} needs system packages that this host does not have: {', '.join(missing)}. "
            "The local engine uses the host's system packages and never installs any.",
            hint=f"Ask the host's administrator to install them (Debian/Ubuntu: apt-get install {' '.join(missing)}), "
                 "or run the scenario on a Docker engine, which installs them in the image.")
    if note:
        events("build", note)
        return f"from the host, not checked ({note})"
    listed = f" ({', '.join(packages)} installed)" if packages else ""
    return f"from the host, not the scenario's base image {case.scenario.base}{listed}"


# --- the environment ---------------------------------------------------------------------------
def prepare_local(case: Case, host: HostPip, run_dir: Path, *, python_env: str = "venv",
                  python: str | None = None, gpu: bool = False, events: Events = no_events,
                  log: Path | None = None) -> BuiltImage:
    """The environment the local engine runs `case` in, as a BuiltImage whose `local` says where."""
    started = time.monotonic()
    if python_env == "current":
        image, key, cached = _current(case, python or sys.executable, run_dir, gpu), None, True
    elif python_env == "venv":
        image, key, cached = _venv(case, host, python or default_python(), run_dir, gpu, events, log)
    else:
        raise PythonEnvError(f"--python-env {python_env!r}: choose venv or current.")
    ident = key or hashlib.sha256(f"{image.python}\n{image.freeze}".encode()).hexdigest()
    tag = f"{image.kind}:{image.where}"
    base = BaseImage(requested=case.scenario.base, ref="host", image_id="", origin="host")
    return BuiltImage(tag=tag, image_id=ident, base=base, cached=cached,
                      build_seconds=round(time.monotonic() - started, 2), local=image)


def torch_matches(installed: str, wanted: str) -> bool:
    """`2.13.0+cpu` is torch 2.13.0 (pip's `==` matches it); `2.13.0+cpu` wanted needs that very build."""
    try:
        have, want = Version(installed), Version(wanted)
    except InvalidVersion:
        return installed == wanted
    return have == want or (not want.local and have.public == want.public)


def _current(case: Case, path: str, run_dir: Path, gpu: bool) -> LocalImage:
    interp = probe_python(path)
    torch = interp.dist("torch")
    if torch is None:
        raise PythonEnvError(f"--python-env current: the Python {path} has no torch installed; {case.name} "
                             f"wants torch {case.torch}.",
                             hint="Point LAB_LOCAL_PYTHON at the Python that has torch, or leave out "
                                  "--python-env current: the lab then makes a venv with torch "
                                  f"{case.torch} (uv).")
    if not torch_matches(torch, case.torch):
        raise PythonEnvError(f"--python-env current: the Python {path} has torch {torch}, and {case.name} wants "
                             f"torch {case.torch}.",
                             hint=f"Run that torch with `--torch {torch}`, or leave out --python-env current: the "
                                  f"lab then makes a venv with torch {case.torch} (uv).")
    lacking = []
    for text in case.scenario.pip:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            lacking.append(text)
            continue
        have = interp.dist(req.name)
        if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
            lacking.append(f"{text} (has {have or 'none'})")
    if lacking:
        raise PythonEnvError(f"--python-env current: the Python {path} lacks the scenario's requirements: "
                             f"{', '.join(lacking)}.",
                             hint="Install them there, or leave out --python-env current for a venv made by the lab.")
    freeze = "".join(f"{name}=={version}\n" for name, version in interp.dists)
    in_venv = interp.prefix != interp.base_prefix
    return LocalImage(python=path, binds=_binds(interp, path), path=(str(Path(path).parent),), lab_dir=run_dir,
                      freeze=freeze, env=(("VIRTUAL_ENV", interp.prefix),) if in_venv else (), gpu=gpu,
                      kind="current", python_version=interp.version, where=path)


def _binds(interp: Interpreter, path: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The folders an interpreter needs to run (its prefixes, the real folder of its binary, the
    folders on its sys.path), outside /usr, each once, outermost first."""
    wanted = [interp.prefix, interp.base_prefix, str(Path(os.path.realpath(path)).parent.parent),
              str(Path(interp.executable).parent.parent), *extra]
    wanted += [p for p in interp.sys_path if os.path.isdir(p)]
    found: list[str] = []
    for p in sorted({os.path.normpath(p) for p in wanted}, key=lambda p: (p.count("/"), p)):
        if p in ("/", "/usr", "/tmp") or p.startswith(("/usr/", "/etc/", "/proc/", "/dev/", "/sys/")):
            continue
        if any(p == f or p.startswith(f + "/") for f in found) or not os.path.isdir(p):
            continue
        found.append(p)
    return tuple(found)


def venv_key(case: Case, host: HostPip, interp: Interpreter) -> str:
    data = {"version": LOCAL_ENV_VERSION, "requirements": list(case.requirements),
            "python": [interp.executable, interp.version], "index": host.index_settings(), "uv": "pip install"}
    if case.deps_cut:  # the seeded pip and setuptools are the era's (a key without it: as before)
        data["seed_cut"] = case.deps_cut
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def _venv(case: Case, host: HostPip, python: str, run_dir: Path, gpu: bool, events: Events,
          log: Path | None) -> tuple[LocalImage, str, bool]:
    base = probe_python(os.path.realpath(python))
    root = cache_dir("venv")
    key = venv_key(case, host, base)
    entry = root / key
    cached = _finished(entry)
    if not cached:
        with entry_lock(root / f"{key}.lock", lambda: events(
                "build", "waiting for another lab process that is making the same venv"), BuildError):
            if not _finished(entry):
                _make_venv(case, host, base, entry, events, log)
    else:
        events("build", f"venv for {' '.join(case.requirements)}: kept from an earlier run ({entry})")
    freeze = (entry / FREEZE_FILE).read_text()
    if log is not None and cached:
        log.write_text(f"venv {entry}: made earlier; it holds:\n{freeze}")
    image = LocalImage(python=str(entry / "bin" / "python"), binds=_binds(base, base.executable, (str(entry),)),
                       path=(str(entry / "bin"),), lab_dir=run_dir, freeze=freeze,
                       env=(("VIRTUAL_ENV", str(entry)),), gpu=gpu, kind="venv", python_version=base.version,
                       where=str(entry))
    return image, key, cached


def _finished(entry: Path) -> bool:
    return (entry.with_suffix(".json")).is_file() and (entry / FREEZE_FILE).is_file() and \
        (entry / "bin" / "python").exists()


def _make_venv(case: Case, host: HostPip, base: Interpreter, entry: Path, events: Events, log: Path | None) -> None:
    tmp = entry.with_suffix(".tmp")
    for stale in (tmp, entry):  # left by a process that died (we hold the lock)
        if stale.exists():
            shutil.rmtree(stale)
    entry.with_suffix(".json").unlink(missing_ok=True)
    uv = uv_binary()
    env = host.uv_env(os.environ)
    env.update({"UV_CACHE_DIR": str(cache_dir("uv")), "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never",
                "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})
    events("build", f"making a venv with {' '.join(case.requirements)} for Python {base.version} (uv)")
    started = time.monotonic()
    lines: list[str] = []
    try:
        # --seed: pip and, up to Python 3.11, setuptools and wheel, as the images' `python3 -m venv` has
        # them (Inductor imports setuptools there; torch itself does not require it before 2.10)
        # them (Inductor imports setuptools there; torch itself does not require it before 2.10); with an
        # era or a date (deps), as of its cut: torch 2.0's Inductor imports pkg_resources, gone in setuptools 81
        cut = ["--exclude-newer", case.deps_cut] if case.deps_cut else []
        _uv(uv, ["venv", "--no-config", "--relocatable", "--seed", *cut, *host.uv_args(), "--python", base.executable,
                 str(tmp)], env, lines)
        _uv(uv, ["pip", "install", "--no-config", "--python", str(tmp / "bin" / "python"), "--no-build",
                 "--compile-bytecode", *host.uv_args(), *case.requirements], env, lines)
        freeze = _uv(uv, ["pip", "freeze", "--python", str(tmp / "bin" / "python")], env, lines, keep=False)
        (tmp / FREEZE_FILE).write_text(freeze)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if log is not None:
            log.write_text(redact_secrets("\n".join(lines)) + "\n")
    seconds = round(time.monotonic() - started, 1)
    meta = {"version": LOCAL_ENV_VERSION, "requirements": list(case.requirements), "python": base.executable,
            "python_version": base.version, "seconds": seconds,
            "made": f"{datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}", "freeze": freeze.splitlines()}
    new = entry.with_suffix(".json-new")
    new.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(new, entry.with_suffix(".json"))
    events("build", f"venv made in {seconds} s: {entry}")


def _uv(uv: str, args: list[str], env: dict[str, str], lines: list[str], keep: bool = True) -> str:
    lines.append("$ uv " + " ".join(args))
    try:
        proc = subprocess.run([uv, *args], capture_output=True, text=True, env=env, timeout=UV_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"uv ran past {UV_TIMEOUT_S} s", log="\n".join(lines)) from None
    if keep:
        lines += [proc.stdout.rstrip(), proc.stderr.rstrip()]
    if proc.returncode != 0:
        cause = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()][-6:]
        raise BuildError("uv could not make the local venv: " + " ".join(cause)[:800], log="\n".join(lines))
    return proc.stdout
