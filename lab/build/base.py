"""The base image stage: use the scenario's `base` if the engine has it or can pull it;
otherwise bootstrap an equivalent Debian base from Debian's archive with mmdebstrap.

Bootstrapped bases are tagged `torch-repro-lab/debian:<suite>-<arch>` and reused.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from lab.core.cache import cache_dir
from lab.core.config import current as current_settings
from lab.core.errors import BaseImageError
from lab.core.records import BaseImage, Events
from lab.scenario.schema import Arch

BOOTSTRAP_REPO = "torch-repro-lab/debian"
_DEBIAN = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+|\d+)(?P<slim>-slim)?$")
_SUITES = {"11": "bullseye", "12": "bookworm", "13": "trixie"}


def debian_suite(base: str) -> str | None:
    """`debian:bookworm`, `debian:12-slim` ... -> the suite mmdebstrap can bootstrap; else None."""
    m = _DEBIAN.match(base)
    if not m:
        return None
    suite = m.group("suite")
    return _SUITES.get(suite, suite)


def bootstrap_tag(suite: str, arch: Arch) -> str:
    return f"{BOOTSTRAP_REPO}:{suite}-{arch.value}"


def bootstrap_command(suite: str, arch: Arch, target: Path) -> list[str]:
    """minbase is what the official debian images are made of."""
    return ["mmdebstrap", "--variant=minbase", f"--architectures={arch.value}", "--mode=root",
            "--aptopt=Acquire::Retries=3", suite, str(target), current_settings().debian_mirror]


def ensure_base(engine, base: str, arch: Arch, events: Events) -> BaseImage:
    """Return a base image for `arch` that the engine holds, pulling or bootstrapping it if needed."""
    image_id = engine.image_id(base, arch)
    if image_id:
        return BaseImage(base, base, image_id, "local")
    suite = debian_suite(base)
    if suite:
        tag = bootstrap_tag(suite, arch)
        image_id = engine.image_id(tag, arch)
        if image_id:
            return BaseImage(base, tag, image_id, "bootstrapped", _recipe(suite, arch))
    events("base", f"pulling {base} for {arch.platform}")
    image_id = engine.pull(base, arch)
    if image_id:
        return BaseImage(base, base, image_id, "pulled")
    if not suite:
        raise BaseImageError(
            f"the base image {base} for {arch.platform} is not on the engine and cannot be pulled.",
            hint=f"Load it with `docker load -i FILE` (saved elsewhere with `docker save {base}`), "
                 "or give the scenario a Debian base (e.g. debian:bookworm) that the lab can bootstrap.")
    return _bootstrap(engine, base, suite, arch, events)


def _recipe(suite: str, arch: Arch) -> str:
    return shlex.join(bootstrap_command(suite, arch, Path("rootfs.tar"))) + \
        f" && docker build --platform {arch.platform} (FROM scratch; ADD rootfs.tar /)"


def _bootstrap(engine, base: str, suite: str, arch: Arch, events: Events) -> BaseImage:
    if shutil.which("mmdebstrap") is None:
        raise BaseImageError(
            f"no registry answered for {base}, and mmdebstrap is not installed to bootstrap it.",
            hint="Run `bin/setup-host` (or `apt-get install mmdebstrap arch-test qemu-user-static`).")
    tag = bootstrap_tag(suite, arch)
    mirror = current_settings().debian_mirror
    events("base", f"no registry: bootstrapping Debian {suite} for {arch.value} from {mirror} "
                   "with mmdebstrap (1-5 minutes)")
    work = Path(tempfile.mkdtemp(prefix="bootstrap-", dir=cache_dir("bases")))
    try:
        rootfs = work / "rootfs.tar"
        _run_mmdebstrap(bootstrap_command(suite, arch, rootfs), events)
        events("base", f"importing the rootfs as {tag}")
        image_id = engine.build_rootfs(rootfs, tag, arch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseImage(base, tag, image_id, "bootstrapped", _recipe(suite, arch))


def _run_mmdebstrap(cmd: list[str], events: Events) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if line:
            events("base", line)
    if proc.wait() != 0:
        raise BaseImageError(
            f"mmdebstrap failed (exit {proc.returncode}): " + " | ".join(tail[-5:]),
            hint="Check that Debian's archive is reachable and that QEMU binfmt is enabled "
                 "for foreign arches (`lab doctor`).")
