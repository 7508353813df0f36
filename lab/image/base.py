"""The base image stage: use the scenario's `base` if the engine has it or can pull it;
otherwise bootstrap an equivalent Debian base from Debian's archive with mmdebstrap.

Bootstrapped bases are tagged `torch-repro-lab/debian:<suite>-<arch>` and reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from lab.core.arch import Arch
from lab.core.cache import cache_dir
from lab.core.config import current as current_settings
from lab.core.errors import BaseImageError, BuildError
from lab.core.records import BaseImage, Events
from lab.core.scrub import is_secret_url, redact_url, redact_urls
from lab.image import cacerts, nativeperl, nativepython, nativeunpack
from lab.image.resolve import host_arch

BOOTSTRAP_REPO = "torch-repro-lab/debian"
PUBLIC_DEBIAN_MIRROR = "http://deb.debian.org/debian"  # what a base's sources.list names when the mirror is a secret
_DEBIAN = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+|\d+)(?P<slim>-slim)?$")
_SUITES = {"11": "bullseye", "12": "bookworm", "13": "trixie"}
# apt's words (through mmdebstrap) for a package name the suite does not have
_UNKNOWN = re.compile(r"^E: (?:Unable to locate package (?P<a>\S+)|Package '(?P<b>[^']+)' has no installation "
                      r"candidate|Couldn't find any package by (?:glob|regex) '(?P<c>[^']+)')")


class UnknownPackageError(BaseImageError):
    """mmdebstrap stopped because the suite has no package of a name the case asked for: no other
    base and no apt step can install it either. `log` is what mmdebstrap printed."""

    def __init__(self, message: str, packages: tuple[str, ...], log: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.packages, self.log = packages, log


def debian_suite(base: str) -> str | None:
    """`debian:bookworm`, `debian:12-slim` ... -> the suite mmdebstrap can bootstrap; else None."""
    m = _DEBIAN.match(base)
    if not m:
        return None
    suite = m.group("suite")
    return _SUITES.get(suite, suite)


def bootstrap_tag(suite: str, arch: Arch, packages: tuple[str, ...] = ()) -> str:
    """`torch-repro-lab/debian:bookworm-arm64`, or with packages `...-arm64-<12 hex of the set>`."""
    tag = f"{BOOTSTRAP_REPO}:{suite}-{arch.value}"
    if packages:
        tag += "-" + hashlib.sha256(",".join(sorted(set(packages))).encode()).hexdigest()[:12]
    return tag


def bootstrap_command(suite: str, arch: Arch, target: Path, packages: tuple[str, ...] = ()) -> list[str]:
    """minbase is what the official debian images are made of; `packages` are added to it.
    dpkg does not fsync each file it unpacks (force-unsafe-io, as the official images' own
    `docker-apt-speedup` has it): the tree is a temporary folder that becomes a tar, and under QEMU
    the fsyncs cost about a tenth of the bootstrap."""
    include = [f"--include={','.join(sorted(set(packages)))}"] if packages else []
    mirror = current_settings().debian_mirror
    return ["mmdebstrap", "--variant=minbase", f"--architectures={arch.value}", "--mode=root",
            "--aptopt=Acquire::Retries=3", "--dpkgopt=force-unsafe-io", *_merged_usr(suite), *include,
            *_public_sources(suite, mirror), *_native_steps(arch, packages), suite, str(target), mirror]


def _public_sources(suite: str, mirror: str) -> list[str]:
    """A mirror URL is a secret unless it is a bare one on Debian's own host (lab.core.scrub): the
    bootstrap uses it, but the rootfs's /etc/apt/sources.list names Debian's public archive instead,
    as the official images do, so no layer of a base keeps the mirror."""
    if not is_secret_url(mirror):
        return []
    line = f"deb {PUBLIC_DEBIAN_MIRROR} {suite} main"
    return [f'--customize-hook=printf "%s\\n" {shlex.quote(line)} > "$1/etc/apt/sources.list"']


MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
_UNMERGED = ("buster", "bullseye")  # the official images of these suites keep /bin, /lib apart


def _merged_usr(suite: str) -> list[str]:
    """From bookworm on, the official images have a merged /usr with the empty usr-is-merged package
    (debuerreotype). mmdebstrap alone gets there through the usrmerge package, which converts the
    tree with perl: perl, libperl and usrmerge end up in the base, and the conversion runs emulated
    for a foreign arch. mmdebstrap's merged-usr hook makes the links natively and installs
    usr-is-merged, as the official images have it."""
    if suite in _UNMERGED or not MERGED_USR_HOOKS.is_dir():
        return []
    return [f"--hook-dir={MERGED_USR_HOOKS}"]


def _native_steps(arch: Arch, packages: tuple[str, ...]) -> list[str]:
    """Hooks that do on the host what the same packages would do slowly under QEMU, with the same
    result: for a foreign arch, dpkg's per-package helpers (lab.image.nativeunpack), when the host
    has a static busybox, Python's byte-compilation (lab.image.nativepython), by the host's
    Python of the same version, and the maintainer scripts' Perl (lab.image.nativeperl), by the
    host's perl of the same version; ca-certificates' update (lab.image.cacerts), when the host has openssl to
    hash with. The diversions are made in that order and undone in the reverse one."""
    steps: list[tuple[list[str], list[str]]] = []
    foreign = arch != host_arch()
    busybox = nativeunpack.static_busybox() if foreign else None
    if busybox is not None:
        steps.append(nativeunpack.hooks(busybox))
    pythons = nativepython.host_pythons() if foreign else []
    if pythons:
        steps.append(nativepython.hooks(pythons))
    perl = nativeperl.host_perl() if foreign else None
    if perl is not None:
        steps.append(nativeperl.hooks(perl))
    if "ca-certificates" in packages and shutil.which("openssl"):
        steps.append(cacerts.hooks())
    return [hook for divert, _ in steps for hook in divert] + [hook for _, undo in reversed(steps) for hook in undo]


def ensure_base(engine, base: str, arch: Arch, events: Events, packages: tuple[str, ...] = ()) -> BaseImage:
    """Return a base image for `arch` that the engine holds, pulling or bootstrapping it if needed.
    A bootstrapped base includes `packages` (the case's system packages) when it can."""
    packages = tuple(sorted(set(packages)))
    image_id = engine.image_id(base, arch)
    if image_id:
        return BaseImage(base, base, image_id, "local")
    suite = debian_suite(base)
    if suite:
        for pkgs in ((packages, ()) if packages else ((),)):
            tag = bootstrap_tag(suite, arch, pkgs)
            image_id = engine.image_id(tag, arch)
            if image_id and (pkgs == packages or _failed_before(bootstrap_tag(suite, arch, packages))):
                return BaseImage(base, tag, image_id, "bootstrapped", _recipe(suite, arch, pkgs))
    events("base", f"pulling {base} for {arch.platform}")
    image_id = engine.pull(base, arch)
    if image_id:
        return BaseImage(base, base, image_id, "pulled")
    if not suite:
        raise BaseImageError(
            f"the base image {base} for {arch.platform} is not on the engine and cannot be pulled.",
            hint=f"Load it with `docker load -i FILE` (saved elsewhere with `docker save {base}`), "
                 "or give the scenario a Debian base (e.g. debian:bookworm) that the lab can bootstrap.")
    if packages:
        try:
            return _bootstrap(engine, base, suite, arch, events, packages)
        except UnknownPackageError as exc:  # the plain base's apt step would fail the same way, minutes later
            raise BuildError(f"Debian {suite} has no package named {', '.join(exc.packages)} (asked for as a "
                             "system package); mmdebstrap said so while bootstrapping the base, and no image "
                             "was made.", log=exc.log,
                             hint="Check the name on https://packages.debian.org/" + suite + ".") from None
        except BaseImageError as exc:
            _remember_failure(bootstrap_tag(suite, arch, packages), exc.message)
            events("base", f"the base with {', '.join(packages)} included could not be made ({exc.message}); "
                           "using the plain base: the Dockerfile's apt step installs them and says what fails")
        plain = bootstrap_tag(suite, arch)
        image_id = engine.image_id(plain, arch)
        if image_id:
            return BaseImage(base, plain, image_id, "bootstrapped", _recipe(suite, arch))
    return _bootstrap(engine, base, suite, arch, events)


def _failure_marker(tag: str) -> Path:
    return cache_dir("bases") / (tag.rpartition(":")[2] + ".failed")


def _remember_failure(tag: str, why: str) -> None:
    """A package set that mmdebstrap could not include is not tried again on every run."""
    with contextlib.suppress(OSError):
        _failure_marker(tag).write_text(why + "\n")


def _failed_before(tag: str) -> bool:
    return _failure_marker(tag).exists()


def _recipe(suite: str, arch: Arch, packages: tuple[str, ...] = ()) -> str:
    # the mirror is a secret (lab.core.scrub): the recipe, written into scenario.yaml, names it redacted
    return redact_urls(shlex.join(bootstrap_command(suite, arch, Path("rootfs.tar"), packages))) + \
        f" && docker build --platform {arch.platform} (FROM scratch; ADD rootfs.tar /)"


def _bootstrap_time(engine, arch: Arch) -> str:
    """What a bootstrap takes, as measured on two cores: every package's scripts run emulated
    when the arch is not the engine's (bench/README.md, cold_run)."""
    return "about 60 s, emulated" if engine.arch != arch else "about a minute"


def _bootstrap(engine, base: str, suite: str, arch: Arch, events: Events,
               packages: tuple[str, ...] = ()) -> BaseImage:
    if shutil.which("mmdebstrap") is None:
        raise BaseImageError(
            f"no registry answered for {base}, and mmdebstrap is not installed to bootstrap it.",
            hint="Run `bin/setup-host` (or `apt-get install mmdebstrap arch-test qemu-user-static`).")
    tag = bootstrap_tag(suite, arch, packages)
    mirror = current_settings().debian_mirror
    bases = cache_dir("bases")
    kept = bases / (tag.rpartition(":")[2] + ".rootfs.tar")
    # one bootstrap of a base at a time (parallel probes, two lab processes), across engines: the
    # rootfs is kept, so another engine (a second local one, a remote one) gets it through the
    # build context in seconds, with no registry and no second mmdebstrap
    with FileLock(str(bases / (tag.rpartition(":")[2] + ".lock"))):
        image_id = engine.image_id(tag, arch)
        if image_id:  # made meanwhile by another probe
            return BaseImage(base, tag, image_id, "bootstrapped", _recipe(suite, arch, packages))
        if not kept.is_file():
            with_packages = f" with {', '.join(packages)}" if packages else ""
            events("base", f"no registry: bootstrapping Debian {suite} for {arch.value}{with_packages} from "
                           f"{redact_url(mirror)} with mmdebstrap ({_bootstrap_time(engine, arch)})")
            work = Path(tempfile.mkdtemp(prefix="bootstrap-", dir=bases))
            try:
                rootfs = work / "rootfs.tar"
                _run_mmdebstrap(bootstrap_command(suite, arch, rootfs, packages), events)
                rootfs.replace(kept)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        events("base", f"importing the rootfs as {tag} on engine {getattr(engine, 'name', 'default')}")
        with contextlib.suppress(OSError):
            os.utime(kept)  # least recently used: the cache cap removes it like any other base
        image_id = engine.build_rootfs(kept, tag, arch)
    return BaseImage(base, tag, image_id, "bootstrapped", _recipe(suite, arch, packages))


# mmdebstrap's own messages (I:, W:, E:) and the lab's hooks' one-line reports are progress; what
# apt and dpkg print inside a hook (the merged-usr hook's "Reading database ... 5%"), and mmdebstrap's
# "I: running --extract-hook in shell: sh -c '...'" before each hook says its own line, is detail,
# shown with -v as stage "bootstrap"
_SAID = re.compile(r"^(?:[WE]: |I: (?!running --[a-z]+-hook )|ca-certificates: |dpkg helpers: |python: |perl: )")


def _run_mmdebstrap(cmd: list[str], events: Events) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    tail: list[str] = []
    unknown: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-40:]
        if (m := _UNKNOWN.match(line)) is not None:
            unknown.append(m.group("a") or m.group("b") or m.group("c"))
        if line:
            events("base" if _SAID.match(line) else "bootstrap", line)
    if proc.wait() != 0 and unknown:
        raise UnknownPackageError(f"mmdebstrap failed (exit {proc.returncode}): no package {', '.join(unknown)}",
                                  tuple(dict.fromkeys(unknown)), redact_urls("\n".join(tail) + "\n"))
    if proc.returncode != 0:
        raise BaseImageError(
            f"mmdebstrap failed (exit {proc.returncode}): " + redact_urls(" | ".join(tail[-5:])),
            hint="Check that Debian's archive is reachable and that QEMU binfmt is enabled "
                 "for foreign arches (`lab doctor`).")
