"""The cheap torch the end-to-end tests run: an amd64 CPU build, from wherever this machine offers one.

PyPI's x86-64 `torch` is the CUDA build (4-5 GB with its nvidia-* wheels), so the cheap amd64 case
needs a `torch-X+cpu` wheel from somewhere else. Looked for, in order:

1. a `torch-X+cpu-cp311-cp311-*x86_64.whl` in a find-links folder (or `file://` simple index) that the
   host's pip settings name (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, pip.conf: what the lab itself carries
   into builds), or that uv's UV_FIND_LINKS names (then passed on to the lab as PIP_FIND_LINKS);
2. PyTorch's CPU index (https://download.pytorch.org/whl/cpu), only if it answers within a few
   seconds; the lab is then given it as an extra index (PIP_EXTRA_INDEX_URL);
3. a case PyPI serves, as a last resort: PyPI's CUDA build of amd64 torch (4-5 GB), which the
   `cpu_torch` fixture then pairs with `frees_its_cuda_build` (what the test made goes afterwards);
   `pick(..., arm64_ok=True)` offers arm64 CPU torch (<= 2.10, under QEMU) instead, for a test that
   does not need amd64.

The newest version found in the first source that has one wins (cp311: the Debian bookworm base's
Python). A test that needs one uses the `cpu_torch` fixture (`pytest.mark.usefixtures("cpu_torch")`):
where nothing fits, it is skipped with what was looked for, except in CI (CI set), where it fails.
"""

from __future__ import annotations

import functools
import html.parser
import os
import re
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON_TAG = "cp311"             # the Python of the lab's Debian bookworm base
PYPI_CUDA_AMD64 = "2.13.0"       # last resort, with frees_its_cuda_build: PyPI's amd64 torch is a CUDA build
PYPI_CPU_ARM64 = "2.10.0"        # aarch64 torch on PyPI is a CPU build up to 2.10.0
INDEX_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CpuTorch:
    """The torch a test pins: its version and arch, where it comes from, and what the lab's
    environment needs to find it."""

    version: str
    arch: str = "amd64"
    source: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    cuda_build: bool = False
    missing: str | None = None   # set when nothing was found: what was looked for

    @property
    def header(self) -> str:
        """The `torch:` and `arch:` lines of a test's scenario."""
        return f"torch: '{self.version}'\narch: {self.arch}\n"

    @property
    def args(self) -> tuple[str, ...]:
        """`--torch VERSION` (and `--arch`), for a scenario file that pins another torch."""
        return ("--torch", self.version, "--arch", self.arch)


def _split(value: str | None) -> list[str]:
    return value.split() if value else []


def local_sources(env: Mapping[str, str]) -> list[tuple[str, bool]]:
    """(find-links folder or file:// index, whether the lab already sees it) from the host's pip
    settings (as the lab reads them) and uv's UV_FIND_LINKS."""
    from lab.image.hostpip import discover
    seen = list(discover(env).local_sources)
    extra = [s for s in _split(env.get("UV_FIND_LINKS")) if s not in seen and "://" not in s.replace("file://", "")]
    return [(s, True) for s in seen] + [(s, False) for s in extra]


def cpu_wheel_versions(names: Iterable[str], platform: str = "x86_64") -> list[Version]:
    """The versions of `torch-X+cpu` wheels for cp311 on `platform` among file names, newest first."""
    found = set()
    for name in names:
        try:
            project, version, _, tags = parse_wheel_filename(os.path.basename(name.split("#", 1)[0]))
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if project != "torch" or version.local != "cpu":
            continue
        if any(t.interpreter == PYTHON_TAG and t.platform.endswith(platform) for t in tags):
            found.add(version)
    return sorted(found, reverse=True)


def folder_wheels(source: str) -> list[str]:
    """The wheel file names a local source offers for torch (a folder, or a file:// simple index)."""
    from lab.image.hostpip import _candidates
    return [p.name for p in _candidates(source, "torch")]


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def index_wheels(page: str) -> list[str]:
    """Wheel file names on a PEP 503 project page."""
    parser = _Links()
    parser.feed(page)
    return [h.split("#", 1)[0].rsplit("/", 1)[-1] for h in parser.hrefs]


def fetch_cpu_index(timeout: float = INDEX_TIMEOUT_S) -> str | None:
    """PyTorch's CPU index page for torch, or None when it does not answer in time."""
    try:
        with urllib.request.urlopen(f"{PYTORCH_CPU_INDEX}/torch/", timeout=timeout) as answer:  # noqa: S310
            return answer.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def pick(env: Mapping[str, str], *, fetch_index: Callable[[], str | None] = fetch_cpu_index,
         cuda_ok: bool = False, arm64_ok: bool = False) -> CpuTorch:
    """The torch a cheap test runs, from the first source that has one (see the module's doc)."""
    looked: list[str] = []
    for source, seen in local_sources(env):
        versions = cpu_wheel_versions(folder_wheels(source))
        looked.append(f"a torch-X+cpu {PYTHON_TAG} x86_64 wheel in {source}")
        if versions:
            extra = {} if seen else {"PIP_FIND_LINKS": " ".join([*_split(env.get("PIP_FIND_LINKS")), source])}
            return CpuTorch(str(versions[0]), source=f"find-links {source}", env=extra)
    if not looked:
        looked.append("a find-links folder in the host's pip or uv settings (none is named)")
    page = fetch_index()
    looked.append(f"PyTorch's CPU index {PYTORCH_CPU_INDEX}"
                  + (" (it answered without such a wheel)" if page is not None else " (it did not answer)"))
    if page is not None:
        versions = cpu_wheel_versions(index_wheels(page))
        if versions:
            extras = _split(env.get("PIP_EXTRA_INDEX_URL"))
            return CpuTorch(str(versions[0]), source=PYTORCH_CPU_INDEX,
                            env={"PIP_EXTRA_INDEX_URL": " ".join([*extras, PYTORCH_CPU_INDEX])})
    if cuda_ok:
        return CpuTorch(PYPI_CUDA_AMD64, source="PyPI (the CUDA build, freed after the test)", cuda_build=True)
    if arm64_ok:
        return CpuTorch(PYPI_CPU_ARM64, arch="arm64", source="PyPI (aarch64 CPU build, under QEMU)")
    return CpuTorch("2.13.0+cpu", missing="no amd64 CPU torch found: looked for " + "; ".join(looked))


@functools.cache
def found(cuda_ok: bool = False, arm64_ok: bool = False) -> CpuTorch:
    return pick(os.environ, cuda_ok=cuda_ok, arm64_ok=arm64_ok)


def version_at_least(torch: CpuTorch, minimum: str) -> bool:
    try:
        return Version(re.sub(r"\+.*", "", torch.version)) >= Version(minimum)
    except InvalidVersion:
        return False


# What the test modules pin: the amd64 CPU torch of this machine, else PyPI's CUDA build.
TORCH = found(cuda_ok=True)
