"""`lab doctor`: is this host ready? Each check says what it found and, when it fails, the fix."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.cache_policy.inventory import last_count
from lab.cache_policy.policy import default_cap
from lab.core.arch import Arch
from lab.core.config import current
from lab.core.errors import EngineError
from lab.engine import gpu
from lab.engine.docker_engine import Engine
from lab.engine.local_engine import probe_bwrap
from lab.image import nativeperl, nativepython, nativeunpack
from lab.image.base import bootstrap_tag, debian_suite
from lab.image.hostpip import discover
from lab.image.resolve import host_arch
from lab.scenario.bases import DEFAULT_BASE

MIN_FREE_GIB = 20
BINFMT = Path("/proc/sys/fs/binfmt_misc")

# aarch64 torch >= 2.13 segfaults at `import torch` under QEMU 7.2 (Debian bookworm's) and then
# hangs; QEMU 10 imports it (see docs/how-it-works.md, "QEMU 10 for arm64"). bookworm's QEMU 10 is in
# bookworm-backports.
QEMU_MIN = 10
REREGISTER = "update-binfmts --disable qemu-aarch64 && update-binfmts --enable qemu-aarch64"
QEMU_FIX = ("aarch64 torch >= 2.13 segfaults at import under QEMU < 10: run bin/setup-host, or "
            "apt-get install -t bookworm-backports qemu-user-static, then register it again: " + REREGISTER)
_QEMU_VERSION = re.compile(r"^qemu-\S+ version (\d+)\.(\d+)(?:\.(\d+))?", re.M)
# A 160-byte static aarch64 ELF that writes "aarch64\n" and exits 0 (bin/setup-host has the same):
# mov x0,#1; adr x1,msg; mov x2,#8; mov x8,#64 (write); svc #0; mov x0,#0; mov x8,#93 (exit); svc #0.
# Run with QEMU_VERSION=1, the QEMU the kernel starts for it prints its version instead.
AARCH64_PROBE = base64.b64decode(
    "f0VMRgIBAQAAAAAAAAAAAAIAtwABAAAAeABAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAEAAOAABAAAAAAAAAAEAAAAFAAAA"
    "AAAAAAAAAAAAAEAAAAAAAAAAQAAAAAAAoAAAAAAAAACgAAAAAAAAAAAQAAAAAAAAIACA0uEAABACAYDSCAiA0gEAANQAAIDS"
    "qAuA0gEAANRhYXJjaDY0Cg==")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str        # "ok" | "warn" | "fail"
    detail: str
    fix: str | None = None
    version: str | None = None  # of what was checked, where it has one (the engine, QEMU)


def run_checks(runs_root: Path) -> list[Check]:
    engine_check, engine = _engine()
    return [engine_check, _binfmt(engine), _gpu(engine), _disk(runs_root, engine), _ca_bundle(), _bootstrap(),
            _local()]


def _engine():
    try:
        engine = Engine.connect()
    except EngineError as err:
        return Check("Docker engine", "fail", err.message,
                     "as root on Debian/Ubuntu: `bin/setup-host`; elsewhere install Docker Engine, "
                     "start it, and check DOCKER_HOST."), None
    info = engine.info()
    return Check("Docker engine", "ok",
                 f"{engine.version} ({info.get('OperatingSystem', '?')}, {info.get('Architecture', '?')})",
                 version=engine.version), engine


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
        return qemu_check(interp, flags, _interpreter_version(interp), _running_version())
    if not (BINFMT / "status").exists() and Path("/.dockerenv").exists():
        return _binfmt_through_engine(engine)
    if not (BINFMT / "status").exists():
        return Check("arm64 emulation", "fail", f"{BINFMT} is not mounted",
                     f"mount -t binfmt_misc binfmt_misc {BINFMT} && update-binfmts --enable qemu-aarch64 "
                     "(or run `bin/setup-host`)")
    return Check("arm64 emulation", "fail", "no qemu-aarch64 binfmt handler: arm64 cases cannot run",
                 "run `bin/setup-host` (on Debian bookworm it installs QEMU 10 from bookworm-backports and "
                 "registers it with update-binfmts, with the F flag)")


def _binfmt_through_engine(engine) -> Check:
    """Inside a container binfmt_misc is not visible: ask the engine to run an arm64 image."""
    tag = bootstrap_tag(str(debian_suite(DEFAULT_BASE)), Arch.ARM64)
    if engine is not None and not engine.image_id(tag, Arch.ARM64):
        # a base bootstrapped with some case's packages runs aarch64 programs just as well
        tag = next(iter(engine.image_tags(tag + "-*")), tag)
    if engine is None or not engine.image_id(tag, Arch.ARM64):
        return Check("arm64 emulation", "warn",
                     "cannot see binfmt_misc from inside this container, and no arm64 image to probe with",
                     f"run `lab doctor` on the host, or `lab build-base {DEFAULT_BASE} --arch arm64` first")
    code, output = engine.output_of(tag, ["uname", "-m"], Arch.ARM64, 120, {})
    if code != 0 or output.strip() != "aarch64":
        return Check("arm64 emulation", "fail",
                     f"the engine cannot run arm64 containers: {output.strip()[:200]}",
                     "on the host: `bin/setup-host` (QEMU >= 10 registered through binfmt_misc)")
    # `env` execs `true` through the kernel again, now with QEMU_VERSION=1 set for the new QEMU.
    _, said = engine.output_of(tag, ["env", "QEMU_VERSION=1", "true"], Arch.ARM64, 120, {})
    return qemu_verdict(parse_qemu_version(said), None,
                        f"runs the engine's arm64 containers ({tag}: uname -m = aarch64)", None, first_line(said))


def parse_qemu_version(text: str) -> tuple[int, ...] | None:
    """The version in QEMU's `--version` output, `qemu-aarch64 version 10.0.2 (Debian ...)`."""
    match = _QEMU_VERSION.search(text or "")
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def qemu_check(interp: str, flags: str, installed_text: str, running_text: str) -> Check:
    """The arm64 emulation check of a registered handler, from the interpreter's `--version`
    (`installed_text`) and from the QEMU the kernel really starts (`running_text`). With the F flag
    the kernel keeps the binary it opened at registration, so after an upgrade the two differ."""
    return qemu_verdict(parse_qemu_version(running_text), parse_qemu_version(installed_text),
                        f"at {interp} (flags {flags})", flags, first_line(installed_text))


def qemu_verdict(running: tuple[int, ...] | None, installed: tuple[int, ...] | None, where: str,
                 flags: str | None, said: str = "") -> Check:
    """`running`: the version the kernel starts; `installed`: the registered path's (None: unknown);
    `flags`: the handler's binfmt flags (None where they cannot be seen, inside a container)."""
    def dotted(v: tuple[int, ...]) -> str:
        return ".".join(map(str, v))
    version = running or installed
    if version is None:
        return Check("arm64 emulation", "warn",
                     f"QEMU of unknown version {where} ({said or 'it printed no version'})", QEMU_FIX)
    if running and installed and running[0] < QEMU_MIN <= installed[0]:
        return Check("arm64 emulation", "warn",
                     f"the kernel still runs QEMU {dotted(running)} for aarch64 binaries, though the handler "
                     f"{where} is now QEMU {dotted(installed)}: it was registered before the upgrade, and with "
                     "the F flag the kernel keeps the old binary. aarch64 torch >= 2.13 segfaults at import "
                     "under QEMU < 10", f"register it again: {REREGISTER} (or run bin/setup-host)",
                     dotted(running))
    if version[0] < QEMU_MIN:
        return Check("arm64 emulation", "warn", f"QEMU {dotted(version)} {where}", QEMU_FIX, dotted(version))
    if flags is not None and "F" not in flags:
        return Check("arm64 emulation", "warn",
                     f"QEMU {dotted(version)} {where} is registered without the F flag: containers may not "
                     "find the interpreter", f"bin/setup-host (registers it with F), or {REREGISTER}",
                     dotted(version))
    return Check("arm64 emulation", "ok", f"QEMU {dotted(version)} {where}", version=dotted(version))


def first_line(text: str) -> str:
    return next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")[:200]


def _interpreter_version(interp: str) -> str:
    """`--version` of the registered interpreter. Debian's `aarch64-binfmt-P` refuses it
    ("has to be run using kernel binfmt-misc subsystem"), the binary it links to does not."""
    try:
        proc = subprocess.run([os.path.realpath(interp), "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return str(err)
    return proc.stdout + proc.stderr


def _running_version() -> str:
    """What the QEMU the kernel starts for an aarch64 program says with QEMU_VERSION=1."""
    with tempfile.TemporaryDirectory(prefix="lab-aarch64-probe-") as folder:
        probe = Path(folder) / "aarch64-probe"
        probe.write_bytes(AARCH64_PROBE)
        probe.chmod(0o755)
        try:
            proc = subprocess.run([str(probe)], env={**os.environ, "QEMU_VERSION": "1"},
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
    return proc.stdout + proc.stderr


def _gpu(engine) -> Check:
    """Ask the engine as a GPU run will: a tiny container with a device request for all GPUs (as
    `--gpus all`), from an image already on the engine; none there: say what was not checked."""
    if engine is None:
        return Check("GPU runtime", "warn", "unknown: no engine")
    answer = gpu.check(engine)
    if answer.ok:
        return Check("GPU runtime", "ok", f"{answer.answer}, with {gpu.REQUEST_WORDS}: gpu scenarios can run")
    runtimes = ", ".join(sorted(engine.info().get("Runtimes") or {})) or "none"
    if answer.ok is None:
        return Check("GPU runtime", "warn",
                     f"whether containers get the GPUs was {answer.answer}; the engine lists the runtimes "
                     f"{runtimes}. `lab run` of a gpu scenario asks the engine itself before it builds",
                     f"make an image and ask again: `lab build-base {DEFAULT_BASE} --arch {engine.arch.value}`, "
                     "then `lab doctor`")
    return Check("GPU runtime", "warn",
                 f"the engine refused a test container with {gpu.REQUEST_WORDS}: {answer.answer} (runtimes: "
                 f"{runtimes}). gpu scenarios render and validate, but do not run here (their CPU variants do)",
                 gpu.FIX)


def _disk(runs_root: Path, engine=None) -> Check:
    """Free space where runs, the cache and (on a local engine) Docker's images live; the cache's
    size at its last count against its cap (`lab cache info` counts it now)."""
    where = runs_root if runs_root.exists() else Path.cwd()
    cache = current().cache_dir
    try:
        docker_root = Path((engine.info().get("DockerRootDir") if engine is not None else None) or "/var/lib/docker")
    except Exception:  # noqa: BLE001 - the engine check above reports an engine that stopped answering
        docker_root = Path("/var/lib/docker")
    probes = [where] + [p for p in (cache, docker_root) if p.exists()]
    worst = min((shutil.disk_usage(p).free, p) for p in probes)
    free_gib = worst[0] / 2**30
    count = last_count()
    held = ""
    if count:  # the size at the last count, against the cap in effect now: the last count's may have been
        # set for that one process (the test suite sets its own)
        cap = current()["cache_cap"]
        if cap is None:
            cap = default_cap(shutil.disk_usage(cache).free if cache.exists() else worst[0], count[0])
        held = (f"; the lab's cache held {count[0] / 2**30:.1f} GiB at its last count, and its cap is "
                f"{cap / 2**30:.1f} GiB")
    if free_gib < MIN_FREE_GIB:
        return Check("disk space", "fail" if free_gib < 5 else "warn",
                     f"low: {free_gib:.1f} GiB free at {worst[1]} (a torch image takes 2-8 GiB){held}",
                     "run `lab cache prune` (or `lab cache prune --older-than 7d`, `--all`), or set a smaller "
                     "`cache_cap` (see `lab cache info`); the lab removes only what it made")
    return Check("disk space", "ok", f"{free_gib:.0f} GiB free at {worst[1]}{held}")


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
        helpers = "dpkg's unpacking helpers and the scripts' grep -F"
        busybox = nativeunpack.static_busybox()
        native = (f"; an emulated bootstrap runs {helpers} natively (static busybox)" if busybox else
                  f"; install busybox-static and an emulated bootstrap runs {helpers} natively")
        pythons = ", ".join(p.name for p in nativepython.host_pythons())
        if pythons:
            native += f"; its byte-compilation runs on the host's {pythons} (for an image's Python of the same version)"
        if nativeperl.host_perl() is not None:
            native += "; its maintainer scripts' Perl on the host's perl (for an image's perl-base of the same version)"
        return Check("Debian bootstrap", "ok", "mmdebstrap can build Debian bases when no registry answers" + native)
    return Check("Debian bootstrap", "warn",
                 "mmdebstrap is missing: without a registry, Debian bases cannot be made",
                 "apt-get install mmdebstrap arch-test (or run `bin/setup-host`)")


def _local() -> Check:
    """The local engine (`--engine local`): whether bubblewrap can confine scripts on this host."""
    c = probe_bwrap(current()["local.bwrap"])
    if c.confined:
        return Check("local engine", "ok", f"bubblewrap {c.version} confines scripts run with `--engine local`",
                     version=c.version)
    return Check("local engine", "warn", f"`--engine local` cannot confine scripts: {c.problem}; it runs them "
                 "only with --trust-script", "apt-get install bubblewrap (or run `bin/setup-host`)")
