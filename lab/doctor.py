"""`lab doctor`: is this host ready? Each check says what it found and, when it fails, the fix."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from lab.build.hostpip import discover
from lab.build.resolve import host_arch
from lab.core.errors import EngineError

MIN_FREE_GIB = 20
BINFMT = Path("/proc/sys/fs/binfmt_misc")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str        # "ok" | "warn" | "fail"
    detail: str
    fix: str | None = None


def run_checks(runs_root: Path) -> list[Check]:
    engine_check, engine = _engine()
    return [engine_check, _binfmt(engine), _gpu(engine), _disk(runs_root), _ca_bundle(), _bootstrap()]


def _engine():
    from lab.engine.docker_engine import Engine
    try:
        engine = Engine.connect()
    except EngineError as err:
        return Check("Docker engine", "fail", err.message,
                     "as root on Debian/Ubuntu: `bin/setup-host`; elsewhere install Docker Engine, "
                     "start it, and check DOCKER_HOST."), None
    info = engine.info()
    return Check("Docker engine", "ok",
                 f"{engine.version} ({info.get('OperatingSystem', '?')}, {info.get('Architecture', '?')})"), engine


def _binfmt(engine) -> Check:
    native = engine.arch.value if engine else host_arch().value
    if native == "arm64":
        return Check("arm64 emulation", "ok", "the engine is arm64: arm64 cases run natively")
    handler = BINFMT / "qemu-aarch64"
    if handler.exists():
        text = handler.read_text(errors="replace")
        flags = next((ln.split()[1] for ln in text.splitlines() if ln.startswith("flags:")), "")
        interp = next((ln.split()[1] for ln in text.splitlines() if ln.startswith("interpreter")), "?")
        if not text.startswith("enabled"):
            return Check("arm64 emulation", "fail", f"the qemu-aarch64 binfmt handler is disabled ({interp})",
                         "update-binfmts --enable qemu-aarch64")
        if "F" not in flags:
            return Check("arm64 emulation", "warn",
                         f"qemu-aarch64 is registered without the F flag ({interp}): containers may not "
                         "find the interpreter", "apt-get install qemu-user-static (registers it with F)")
        return Check("arm64 emulation", "ok", f"QEMU binfmt handler {interp} (flags {flags})")
    if not (BINFMT / "status").exists() and Path("/.dockerenv").exists():
        return _binfmt_through_engine(engine)
    if not (BINFMT / "status").exists():
        return Check("arm64 emulation", "fail", f"{BINFMT} is not mounted",
                     f"mount -t binfmt_misc binfmt_misc {BINFMT} && update-binfmts --enable qemu-aarch64 "
                     "(or run `bin/setup-host`)")
    return Check("arm64 emulation", "fail", "no qemu-aarch64 binfmt handler: arm64 cases cannot run",
                 "apt-get install qemu-user-static binfmt-support (or run `bin/setup-host`)")


def _binfmt_through_engine(engine) -> Check:
    """Inside a container binfmt_misc is not visible: ask the engine to run an arm64 image."""
    from lab.build.base import bootstrap_tag
    from lab.scenario.schema import Arch
    tag = bootstrap_tag("bookworm", Arch.ARM64)
    if engine is None or not engine.image_id(tag, Arch.ARM64):
        return Check("arm64 emulation", "warn",
                     "cannot see binfmt_misc from inside this container, and no arm64 image to probe with",
                     "run `lab doctor` on the host, or `lab build-base debian:bookworm --arch arm64` first")
    code, output = engine.output_of(tag, ["uname", "-m"], Arch.ARM64, 120, {})
    if code == 0 and output.strip() == "aarch64":
        return Check("arm64 emulation", "ok", f"the engine runs arm64 containers ({tag}: uname -m = aarch64)")
    return Check("arm64 emulation", "fail", f"the engine cannot run arm64 containers: {output.strip()[:200]}",
                 "on the host: apt-get install qemu-user-static binfmt-support (or `bin/setup-host`)")


def _gpu(engine) -> Check:
    if engine is None:
        return Check("GPU runtime", "warn", "unknown: no engine")
    if engine.has_gpu_runtime():
        return Check("GPU runtime", "ok", "the engine has the NVIDIA runtime: gpu scenarios can run")
    return Check("GPU runtime", "warn",
                 "no NVIDIA runtime on this engine: gpu scenarios render and validate, but do not run "
                 "(their CPU variants do)",
                 "on a GPU host install nvidia-container-toolkit and run `nvidia-ctk runtime configure "
                 "--runtime=docker`, then restart dockerd")


def _disk(runs_root: Path) -> Check:
    where = runs_root if runs_root.exists() else Path.cwd()
    docker_root = Path("/var/lib/docker")
    probes = [where] + ([docker_root] if docker_root.exists() else [])
    worst = min((shutil.disk_usage(p).free, p) for p in probes)
    free_gib = worst[0] / 2**30
    if free_gib < MIN_FREE_GIB:
        return Check("disk space", "fail" if free_gib < 5 else "warn",
                     f"{free_gib:.1f} GiB free at {worst[1]} (a torch image takes 2-8 GiB)",
                     "free space, or remove the lab's images with `docker image prune` / "
                     "`docker rmi $(docker images -q torch-repro-lab/case)`")
    return Check("disk space", "ok", f"{free_gib:.0f} GiB free at {worst[1]}")


def _ca_bundle() -> Check:
    host = discover()
    named = next((f"{v}={os.environ[v]}" for v in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
                  if os.environ.get(v)), None)
    if host.ca_bundle:
        return Check("CA bundle", "ok", f"{host.ca_bundle} is carried into builds"
                     + (f" ({named})" if named else " (pip.conf `cert`)"))
    if named:
        return Check("CA bundle", "fail", f"{named} names a file that does not exist",
                     "point PIP_CERT / SSL_CERT_FILE at your proxy's CA bundle, or unset it")
    return Check("CA bundle", "ok", "none configured: builds use the image's own CA certificates "
                 "(behind a TLS-intercepting proxy, set PIP_CERT to its CA bundle)")


def _bootstrap() -> Check:
    if shutil.which("mmdebstrap") or shutil.which("debootstrap"):
        return Check("Debian bootstrap", "ok",
                     "mmdebstrap can build Debian bases when no registry answers")
    return Check("Debian bootstrap", "warn",
                 "mmdebstrap is missing: without a registry, Debian bases cannot be made",
                 "apt-get install mmdebstrap arch-test (or run `bin/setup-host`)")
