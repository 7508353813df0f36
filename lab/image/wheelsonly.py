"""Wheels only, resolved on the host: what a replay of a stranger's bundle may install.

A bundle's scenario names packages (`pip:`), and pip installs whatever a requirement points at:
an sdist runs its build code (`setup.py`, a build backend) at build time, and a direct URL, a
VCS reference or a local path is fetched from wherever the bundle's author chose. A replay
(lab.bundle.replay) therefore installs only wheels that uv resolves on this host, from the
indexes the user configured, with `--no-build` (lab.crossinstall), and its build runs with no
network and no credentials (lab.image.builder, `Sealed`). This module holds the checks:

- `direct_references`: the requirements that name a URL, a VCS repository or a path (refused
  before anything is resolved: uv would fetch them);
- `unresolved`: what the host's cross-install left to pip in the image (an sdist-only package, no
  wheel for the platform, an unknown Python), refused after resolving, before any build;
- `seeded_wheels`: the wheels of what the image's venv seeds itself (pip, setuptools) that a
  requirement needs newer (torch >= 2.10 wants setuptools>=77): taken from the host's local sources
  or downloaded as wheels on the host, so pip in the offline build installs them from /lab/wheels.

`--allow-source-builds` lifts the first two; `Sealed.source_builds` then gives pip in the image the
engine's default network (never the host's), still without credentials.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from lab.core.cache import cache_dir
from lab.core.errors import ScenarioError
from lab.image.crossinstall import SEEDED_BY_VENV, Site, Target, seeded_requirements
from lab.image.hostpip import HostPip, local_wheels

VCS_SCHEMES = ("git", "hg", "svn", "bzr")
PIP_TIMEOUT_S = 600


class SourceBuildError(ScenarioError):
    """A replayed bundle names a requirement that is not a wheel resolved from the user's indexes
    (a direct URL, a VCS reference, a local path, an sdist-only package), and --allow-source-builds
    was not given."""


@dataclass(frozen=True, slots=True)
class DirectReference:
    index: int           # its place in the scenario's `pip` list
    requirement: str
    kind: str            # "a direct URL" | "a VCS reference" | "a local path"


def reference_kind(requirement: str) -> str | None:
    """What a requirement points at besides an index: None for `name[extras] specifier; marker`."""
    try:
        url = Requirement(requirement).url
    except InvalidRequirement:
        return "an unreadable requirement"
    if not url:
        return None
    scheme = urlparse(url).scheme.lower()
    if scheme.split("+", 1)[0] in VCS_SCHEMES and ("+" in scheme or scheme in VCS_SCHEMES):
        return "a VCS reference"
    if scheme in ("", "file"):
        return "a local path"
    return "a direct URL"


def direct_references(requirements: tuple[str, ...]) -> tuple[DirectReference, ...]:
    return tuple(DirectReference(i, r, kind) for i, r in enumerate(requirements)
                 if (kind := reference_kind(r)) is not None)


def refuse_references(refs: tuple[DirectReference, ...], *, file: str | None, line: int | None) -> None:
    """One paragraph naming every such requirement, what it would do, and the flag."""
    if not refs:
        return
    named = "; ".join(f"{r.requirement!r} is {r.kind}" for r in refs[:5]) + \
        (f"; and {len(refs) - 5} more" if len(refs) > 5 else "")
    raise SourceBuildError(
        f"{named}. A replay installs only wheels that this lab resolves on this host from the indexes you "
        "configured: pip would fetch this from wherever the bundle's author pointed it and, for an sdist or a "
        "repository, run its build code at build time.", file=file, line=line,
        field=f"pip[{refs[0].index}]" if len(refs) == 1 else "pip",
        hint="Read the scenario and the package, then replay with --allow-source-builds to let pip inside the "
             "build install it (that step gets the engine's default network, never this host's credentials).")


def unresolved(site: Site, requirements: tuple[str, ...]) -> tuple[str, ...]:
    """What pip inside the image would have to find on an index, fetch or build, with why: every
    requirement when nothing was cross-installed, else those uv left pending (but the venv's own
    pip/setuptools, which `seeded_wheels` provides as wheels)."""
    if site.root is None:
        why = "; ".join(site.notes) or "nothing was installed on the host"
        return tuple(f"{r} ({why})" for r in requirements)
    return tuple(f"{p.requirement} ({p.reason})" for p in site.pending if p.kind != "venv")


def refuse_unresolved(found: tuple[str, ...], *, file: str | None) -> None:
    if not found:
        return
    raise SourceBuildError(
        "these requirements did not resolve to wheels on this host, so pip inside the build would have to "
        "fetch or build them: " + "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        + ". A replay installs only wheels resolved on this host from the indexes you configured.",
        file=file, field="pip",
        hint="Add a wheel for them to your index or find-links folder, or read the packages and replay with "
             "--allow-source-builds (pip inside the build then installs them with the engine's default network, "
             "never this host's credentials). Nothing was built.")


def seeded_wheels(site: Site, requirements: tuple[str, ...], host: HostPip, target: Target,
                  tags) -> tuple[Path, ...]:
    """Wheels for what the image's venv seeds (pip, setuptools) that the case needs: asked for in
    `requirements`, or required by an installed distribution. From the host's local sources when
    they have one, else downloaded on the host (`pip download --only-binary=:all: --no-deps`, which
    runs nothing of the package)."""
    wanted = [r for r in requirements if _seeded(r)]
    if site.root is not None:
        wanted += [r for r in seeded_requirements(site.root, target) if r not in wanted]
    found: list[Path] = []
    for req in wanted:
        local = local_wheels(host, (req,), tags)
        found += local or [_download(req, target)]
    return tuple(found)


def _seeded(requirement: str) -> bool:
    try:
        return canonicalize_name(Requirement(requirement).name) in SEEDED_BY_VENV
    except InvalidRequirement:
        return False


def _download(requirement: str, target: Target) -> Path:
    """The newest wheel matching `requirement` for the target, downloaded once into the lab's cache."""
    key = hashlib.sha256(json.dumps([requirement, target.uv_platform, target.python]).encode()).hexdigest()[:24]
    folder = cache_dir("seeded-wheels") / key
    have = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if have:
        return have[0]
    tmp = folder.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    machine = target.uv_platform.split("-", 1)[0]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--platform", f"manylinux2014_{machine}", "--python-version", target.python,
         "--implementation", "cp", "-d", str(tmp), requirement],
        capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=os.environ.copy())
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SourceBuildError(f"no wheel of {requirement}, which the image's venv needs newer than its own, "
                               f"could be downloaded on this host: {(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                               field="pip", hint="Add one to your index or find-links folder, then replay again.")
    os.replace(tmp, folder)
    return folder / wheels[0].name


def sealed_pip_conf(ca_path: str | None, wheel_dir: str) -> str:
    """The image's pip.conf for a replay's offline build: no index at all, the context's wheels only."""
    lines = ["[global]", *([f"cert = {ca_path}"] if ca_path else []), "no-index = true",
             f"find-links = {wheel_dir}"]
    return "\n".join(lines) + "\n"
