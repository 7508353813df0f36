"""Case -> BuildPlan: the Dockerfile rendered from dockerfiles/ and a byte-stable build context.

The Dockerfile depends only on the case, never on the host, so `lab render` prints
the same bytes everywhere. Host specifics (CA bundle, pip settings, local wheels)
travel as context files; the content hash covers them, so a change rebuilds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import jinja2

from . import __version__
from .hostpip import HostPip, local_wheels
from .resolve import Case

TEMPLATES_DIR = Path(os.environ.get("LAB_TEMPLATES_DIR") or Path(__file__).resolve().parent.parent / "dockerfiles")
BASE_PACKAGES = ("ca-certificates", "python3", "python3-venv")
CA_IN_IMAGE = "/etc/lab/ca.crt"
WHEELS_IN_IMAGE = "/lab/wheels"
IMAGE_REPO = "torch-repro-lab/case"
RUNNER = Path(__file__).resolve().parent / "probe" / "lab_run.py"  # runs inside the image
RUNNER_IN_IMAGE = "/lab/tools/lab_run.py"
WHEELS_README = b"Wheels from the host's local pip sources (find-links, file:// indexes).\n"


@dataclass(frozen=True, slots=True)
class ContextFile:
    """One file of the build context: its path inside the context and its bytes or host source."""

    arcname: str
    data: bytes | None = None
    source: Path | None = None

    def size(self) -> int:
        return len(self.data) if self.data is not None else self.source.stat().st_size  # type: ignore[union-attr]


@dataclass(frozen=True)
class BuildPlan:
    case: Case
    dockerfile: str
    files: tuple[ContextFile, ...]
    digest: str  # sha256 of the context tar (the Dockerfile included)

    @property
    def platform(self) -> str:
        return self.case.arch.platform

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPO}:{self.case.scenario.name}-{self.digest[:16]}"

    def context_size(self) -> int:
        return sum(f.size() for f in self.files)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    env.filters["json"] = json.dumps
    return env


def template_for(case: Case) -> str:
    return "cuda.Dockerfile.j2" if case.scenario.gpu else "debian.Dockerfile.j2"


def render_dockerfile(case: Case) -> str:
    """The Dockerfile for `case`: deterministic, the same bytes for the same case."""
    scenario = case.scenario
    packages = sorted(set(BASE_PACKAGES) | set(scenario.system_packages))
    return _environment().get_template(template_for(case)).render(
        case_name=case.name,
        lab_version=__version__,
        scenario_file=scenario.source.name,
        scenario_name=scenario.name,
        platform=case.arch.platform,
        base=scenario.base,
        torch=case.torch,
        arch=case.arch.value,
        system_packages=packages,
        requirements=case.requirements,
        script=scenario.script.name,
    )


def context_files(case: Case, dockerfile: str, host: HostPip) -> tuple[ContextFile, ...]:
    ca = host.ca_bundle.read_bytes() if host.ca_bundle else b""
    pip_conf = host.pip_conf(CA_IN_IMAGE if ca else None, WHEELS_IN_IMAGE)
    files = [
        ContextFile("Dockerfile", dockerfile.encode()),
        ContextFile("lab/ca.crt", ca),
        ContextFile("lab/pip.conf", pip_conf.encode()),
        ContextFile("repro/" + case.scenario.script.name, source=case.scenario.script),
        ContextFile("tools/" + RUNNER.name, source=RUNNER),
        ContextFile("wheels/README", WHEELS_README),
    ]
    files += [ContextFile("wheels/" + w.name, source=w)
              for w in local_wheels(host, case.requirements, case.wheel_tags)]
    return tuple(sorted(files, key=lambda f: f.arcname))


def write_context(files: tuple[ContextFile, ...], out: BinaryIO) -> str:
    """Write the context as a tar with sorted entries and normalised metadata; return its sha256."""
    hasher = _HashingWriter(out)
    with tarfile.open(fileobj=hasher, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            info = tarfile.TarInfo(f.arcname)
            info.size, info.mtime, info.mode = f.size(), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if f.data is not None:
                tar.addfile(info, io.BytesIO(f.data))
            else:
                with f.source.open("rb") as fh:  # type: ignore[union-attr]
                    tar.addfile(info, fh)
    return hasher.hexdigest()


class _HashingWriter(io.RawIOBase):
    def __init__(self, out: BinaryIO) -> None:
        self._out, self._sha = out, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self._sha.update(b)
        return self._out.write(b)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        return len(b)


def plan_build(case: Case, host: HostPip) -> BuildPlan:
    dockerfile = render_dockerfile(case)
    files = context_files(case, dockerfile, host)
    digest = write_context(files, _Discard())
    return BuildPlan(case=case, dockerfile=dockerfile, files=files, digest=digest)
