"""Dependencies of a release's own era: how everything but torch resolves.

A scenario's `deps` (and `--deps` on run, bisect, matrix and triage) is one of:

- `latest`: whatever the index serves today (the default, the lab's behaviour before eras);
- `era`: as of the torch release's upload date plus GRACE (a week), so that a 2024 torch meets
  the NumPy, sympy and typing_extensions it shipped with;
- a date (`2024-04-01`, or an RFC 3339 time): as of that day's end (UTC).

An era or a date is resolved on the host, once, with `uv pip compile --exclude-newer <cut>` for
the image's platform and Python; torch itself is pinned exactly and exempt from the cut
(`--exclude-newer-package torch=...`), as is every package the lab pins itself (a bisection's
blame step pins the other side's versions). The answer (`name==version` of every package but
torch) becomes part of the case's requirements, so every installer (uv on the host, pip in the
image, the local engine's venv) installs exactly that, and the site cache keys on it.

The release's upload time comes from the index's JSON simple API (PEP 700 `upload-time`), which
lab.image.releases already reads. A find-links wheel has no upload time: its public version's on
the index is used; when no index has one, `era` is refused with a clear error (give a date).
uv keeps find-links files, which have no upload time, whatever the cut: a local torch wheel still
resolves.

Resolutions are cached under `<cache>/era/` (a cut in the past never changes its answer).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from lab.core.cache import cache_dir
from lab.core.errors import LabError
from lab.image import releases
from lab.image.crossinstall import Target, target_for, uv_binary
from lab.image.hostpip import HostPip
from lab.scenario.bases import base_glibc
from lab.scenario.model import _DATE_RE, DEPS_HELP, ERA, LATEST, parse_deps, rfc3339  # noqa: F401 (re-exported)

GRACE = timedelta(days=7)
FAR_FUTURE = "2999-01-01T00:00:00Z"   # exempts a pinned package from the cut
_FORMAT = 1
SKIPPED = frozenset({"torch", "pip", "setuptools", "wheel", "distribute"})  # never part of a dependency set


class DepsError(LabError):
    """A `deps` setting is malformed, or an era cannot be resolved (no upload time, uv found no solution)."""


def parse_time(text: str) -> datetime:
    when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def cut_of(setting: str, released: str | None = None) -> str | None:
    """The `--exclude-newer` time of a setting: None for `latest`; the end of a date's day; the
    release's upload time plus GRACE for `era` (`released` is that upload time)."""
    if setting == LATEST:
        return None
    if setting == ERA:
        if released is None:
            raise DepsError("the torch release has no upload time on the index, so its era is unknown.",
                            hint='Give the date instead: `deps: "2024-04-01"` (or --deps 2024-04-01).')
        return rfc3339(parse_time(released) + GRACE)
    if _DATE_RE.fullmatch(setting):
        return rfc3339(datetime.strptime(setting, "%Y-%m-%d").replace(tzinfo=timezone.utc) + timedelta(days=1))
    return rfc3339(parse_time(setting))


@dataclass(frozen=True)
class DepSet:
    """The resolved dependency set of one case: the setting, its cut, and `name==version` pins of
    every package but torch (sorted by name)."""

    setting: str
    cut: str | None
    released: str | None
    pins: tuple[str, ...]

    def versions(self) -> dict[str, str]:
        return pins_to_versions(self.pins)

    def lock_text(self, torch: str) -> str:
        head = [f"# dependencies: {self.setting}" + (f" (uv --exclude-newer {self.cut})" if self.cut else ""),
                *([f"# torch {torch} uploaded {self.released}"] if self.released else []),
                f"torch=={torch}"]
        return "\n".join([*head, *self.pins]) + "\n"


def pins_to_versions(pins: tuple[str, ...] | list[str]) -> dict[str, str]:
    out = {}
    for line in pins:
        name, _, version = line.partition("==")
        if version:
            out[canonicalize_name(name.strip())] = version.strip()
    return out


def freeze_versions(text: str) -> dict[str, str]:
    """`pip freeze` text as {name: version} without torch and the venv's own tools."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "==" not in line:
            continue
        name, _, version = line.partition("==")
        key = canonicalize_name(name.split("[")[0].strip())
        if key not in SKIPPED:
            out[key] = version.split(";")[0].strip()
    return dict(sorted(out.items()))


def versions_to_pins(versions: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{name}=={version}" for name, version in sorted(versions.items()))


def release_time(torch: str, host: HostPip, python: str, arch: str) -> str | None:
    try:
        return releases.upload_time("torch", torch, host=host, python=python, arch=arch)
    except releases.IndexUnreachableError as exc:
        raise DepsError(f"the upload time of torch {torch} could not be read: {exc.message}") from None


def resolve_set(requirements: tuple[str, ...], *, setting: str, torch: str, host: HostPip, python: str,
                arch: str, platform: str, exempt: tuple[str, ...] = (), released: str | None = None,
                cache: Path | None = None) -> DepSet:
    """Resolve `requirements` (torch pinned first) as of the setting's cut, on the host with uv.
    `exempt` names packages the lab pins itself (no cut applies to them)."""
    if setting == ERA and released is None:
        released = release_time(torch, host, python, arch)
    cut = cut_of(setting, released)
    if cut is None:
        return DepSet(setting, None, released, ())
    key = hashlib.sha256(json.dumps({"format": _FORMAT, "requirements": list(requirements), "cut": cut,
                                     "platform": platform, "python": python, "exempt": sorted(exempt),
                                     "index": host.index_settings()}, sort_keys=True).encode()).hexdigest()[:32]
    folder = cache if cache is not None else cache_dir("era")
    entry = folder / f"{key}.json"
    try:
        data = json.loads(entry.read_text())
        return DepSet(setting, cut, released, tuple(data["pins"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    pins = _compile(requirements, cut=cut, host=host, python=python, platform=platform,
                    exempt=("torch", *exempt))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": _FORMAT, "cut": cut, "requirements": list(requirements),
                               "pins": list(pins)}, indent=1))
    os.replace(tmp, entry)
    return DepSet(setting, cut, released, pins)


def _compile(requirements: tuple[str, ...], *, cut: str, host: HostPip, python: str, platform: str,
             exempt: tuple[str, ...]) -> tuple[str, ...]:
    uv = uv_binary()
    env = host.uv_env(os.environ)
    env.update({"UV_CACHE_DIR": str(cache_dir("uv")), "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"})
    args = [uv, "pip", "compile", "--no-config", "--python", sys.executable, "--python-platform", platform,
            "--python-version", python, "--no-build", "--no-header", "--no-annotate", "--exclude-newer", cut,
            *host.uv_args()]
    for name in dict.fromkeys(canonicalize_name(n) for n in exempt):
        args += ["--exclude-newer-package", f"{name}={FAR_FUTURE}"]
    with tempfile.TemporaryDirectory(prefix="lab-era-") as work:
        out = Path(work) / "requirements.txt"
        proc = subprocess.run([*args, "-o", str(out), "-"], input="\n".join(requirements) + "\n",
                              capture_output=True, text=True, env=env, cwd=work, timeout=1800)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            why = "; ".join(ln for ln in lines if not ln.startswith(("Resolved", "warning:")))
            why = why if len(why) <= 600 else why[:600].rstrip() + "..."
            raise DepsError(f"uv could not resolve {' '.join(requirements)} as of {cut}: {why.rstrip('.')}.",
                            hint="Try another date with --deps, or `--deps latest`.")
        text = out.read_text()
    found = []
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in SKIPPED:
            continue
        spec = str(req.specifier)
        if spec.startswith("=="):
            found.append(f"{canonicalize_name(req.name)}{spec}")
    return tuple(sorted(found))


def apply(case, host: HostPip, events=None, python: str | None = None):
    """(the case with its era's pins in `resolved`, its DepSet), or (case, None) for `latest`.

    Pins the lab chose itself (`case.pins`) are kept as they are and exempt from the cut. `python`
    (X.Y): the Python the environment is made with where the engine decides it, whatever the base
    has (Engine.environment_python: the local engine's venvs, from the host's Python); the pins
    are resolved for it, since they are installed there."""

    if case.deps == LATEST:
        return case, None
    target = target_for(case)
    if python:
        target = replace(target, python=python) if target is not None else \
            Target(case.arch.value, case.arch.uname, python, base_glibc(case.scenario.base))
    if target is None:
        raise DepsError(f"deps: {case.deps} needs the Python version of the base image, and the lab does not "
                        f"know the one of {case.scenario.base}.", hint="Use `deps: latest` with this base.")
    pinned = tuple(pins_to_versions(case.pins))
    asked = (f"torch=={case.torch}", *case.scenario.pip, *case.pins)
    found = resolve_set(asked, setting=case.deps, torch=case.torch, host=host, python=target.python,
                        arch=target.arch, platform=target.uv_platform, exempt=pinned)
    extra = tuple(p for p in found.pins if canonicalize_name(p.split("==")[0]) not in pinned)
    if events is not None:
        events("deps", f"dependencies as of {found.cut} ({case.deps}"
                       + (f": torch {case.torch} was uploaded {found.released}" if found.released else "")
                       + f"): {' '.join(extra) or 'nothing besides torch'}")
    return replace(case, resolved=extra, deps_cut=found.cut), found
