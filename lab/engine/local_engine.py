"""The local engine: a case runs on this host, without containers (`--engine local`).

GPU servers where users are not in the `docker` group, HPC nodes and laptops have no Docker engine
the lab may use. There the lab does what people do by hand (a venv with the pinned torch, run the
script, read the log), with the same runner, LD_DEBUG, timeout, outputs and verdicts as in a
container. The venv is made by the build stage (`lab.image.localenv`); this module runs in it.

Where bubblewrap (`bwrap`) works, the script runs confined, laid out as in the lab's images:

- a read-only view of the system (/usr, the merged-/usr links, /sys), a fresh /proc and /dev, a
  private /tmp (a tmpfs), and nothing else of the host: no /home, no /root, no /var, no /run, no
  Docker socket; the Python and its venv are bound read-only at their own paths;
- a minimal /etc, not the host's (whose pip.conf may hold an index token): passwd, group, hosts
  and nsswitch.conf made by the lab for the run user (`ETC_MADE`), and of the host's only what a
  Python process, torch's import and Inductor's compiler read (`ETC_FROM_HOST`: the loader cache
  and its configuration, so CUDA's libraries load on a GPU host; the alternatives links that
  cc/c++ go through; the CA certificates and the lab's CA bundle; time zone, OS release, Python's
  own configuration), plus resolv.conf and the host's hosts where the run has network;
- the script at /lab/repro and the runner at /lab/tools (read-only, from the run folder), and
  /out, the only folder it may write to: a fresh folder that belongs to the run user, copied into
  the run folder after the run through the same safe extractor as a container's /out (no link,
  fifo or device is ever made; caps on bytes and files);
- no network (`--unshare-net`) unless the scenario asks for it and the user allowed it;
- its own pid, IPC and UTS namespaces; every process dies with the run;
- the NVIDIA device nodes (/dev/nvidia*) only for GPU scenarios;
- as root, the script runs as uid 10001 (setpriv, inside the sandbox), with no capabilities and
  no-new-privileges, so a root-owned host is not writable even where it is visible; otherwise
  it runs as the user, in a user namespace.

Limits without cgroups: the address space (RLIMIT_AS, CPU cases only: CUDA reserves far more
address space than it uses), the number of processes (RLIMIT_NPROC), no core dumps; /out is
measured while the script runs and the run is stopped past its cap.

Without a working bwrap, the local engine runs a script only when the user confirmed that it is
trusted (`--trust-script`): then it runs as the user, with the host's files and network, and the
report says "not confined".

Only one architecture: the host's. A case of another arch goes to a Docker engine (with QEMU, or
a native one); see `lab engines`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lab.core import cancel
from lab.core.arch import Arch
from lab.core.errors import EngineError, LabError, NoGpuRuntimeError
from lab.core.records import (
    STOPPED_OUT_FULL,
    BuiltImage,
    Events,
    ImageUsage,
    LocalImage,
    RawRun,
    RunLimits,
    format_bytes,
    no_events,
)
from lab.core.results import LocalRef
from lab.core.safetar import extract_outputs
from lab.core.tarwrite import folder_chunks
from lab.engine.protocol import Pending, nothing_pending
from lab.engine.streams import StreamFile
from lab.image.hostpip import HostPip
from lab.image.layout import (
    FREEZE_FILE,
    LAB_DIR,
    OUT,
    OUT_FOLDERS,
    REPRO_DIR,
    RUN_HOME,
    RUN_UID,
    RUN_USER_NAME,
    TOOLS_DIR,
    VENV,
)
from lab.image.localenv import check_system_packages, default_python, prepare_local, probe_python
from lab.image.render import BuildPlan
from lab.image.resolve import Case

LOCAL = "local"
# The host's system, seen read-only by the script. The merged-/usr links stay links.
SYSTEM_DIRS = ("/usr", "/opt/nvidia")
# Of the host's /etc, only these (where they exist), read-only: the dynamic loader's cache and
# configuration (libcuda and CUDA's libraries are found through them on a GPU host), the
# alternatives links (Debian's /usr/bin/cc and c++ point there), CA certificates (Debian's
# ssl/certs, RHEL's pki), time zone, OS release (collect_env reads it), service and protocol
# names, and the system Python's configuration (Debian's sitecustomize.py lives in
# /etc/python3.X). Never ssl/private, pip.conf, passwd/shadow, ssh or anything else.
ETC_FROM_HOST = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf",
                 "pki/tls/certs", "pki/tls/openssl.cnf", "pki/ca-trust/extracted", "localtime", "timezone",
                 "os-release", "debian_version", "lsb-release", "redhat-release", "system-release", "protocols",
                 "services", "python3", *(f"python3.{n}" for n in range(6, 20)))
ETC_WITH_NETWORK = ("resolv.conf", "hosts", "gai.conf", "host.conf")  # names resolve as on the host
ETC_MADE = ("passwd", "group", "hosts", "nsswitch.conf")                # written by the lab (etc_files)
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")
SHM_BYTES = 64 * 1024**2  # /dev/shm in the sandbox, as Docker gives a container
_OUT_CHECK_S = 5.0
_POLL_S = 0.5
_KILL_GRACE_S = 5.0
OUTPUT_OF_BYTES = 16 * 1024**2


class NotConfinedError(LabError):
    """bwrap is missing or does not work here, and the user did not say that the script is trusted."""


class ForeignArchError(LabError):
    """The local engine runs only the host's architecture."""


@dataclass(frozen=True)
class LocalOptions:
    """How the local engine runs: `python_env` "venv" (a uv venv per case) or "current" (the
    interpreter already there); `python` the interpreter (None: the one running the lab);
    `bwrap` the bubblewrap command ("off": none); `trust_script` the user's word that the script
    may run unconfined where bwrap cannot confine it."""

    python_env: str = "venv"
    python: str | None = None
    bwrap: str = "bwrap"
    trust_script: bool = False


@dataclass(frozen=True)
class Confinement:
    """How the local engine confines a script on this host: bwrap's version, or why not."""

    tool: str | None                    # the bwrap command that works, or None
    version: str | None = None
    problem: str | None = None          # why bwrap cannot be used
    as_root: bool = False

    @property
    def confined(self) -> bool:
        return self.tool is not None

    def words(self, network: bool) -> str:
        if not self.confined:
            return ("not confined (--trust-script): the script ran as " + _user_name() +
                    " with the host's files" + (" and network" if network else "") +
                    (f"; bubblewrap: {self.problem}" if self.problem else ""))
        who = (f"uid {RUN_UID} (setpriv, from root)" if self.as_root else
               f"the user ({_user_name()}) in a user namespace")
        return (f"bubblewrap {self.version or ''}".rstrip() + f": {who}, no capabilities, no-new-privileges, "
                "a read-only view of the host's system, a private /tmp, only the run's /out writable, "
                + ("the host's network" if network else "no network") + ", its own pid namespace")


def host_os() -> str:
    """PRETTY_NAME of /etc/os-release ('Debian GNU/Linux 12 (bookworm)'), or the kernel's name."""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def host_libc() -> str:
    name, version = platform.libc_ver()
    return f"{name} {version}".strip() or "unknown"


def _user_name() -> str:
    try:
        import pwd  # optional: POSIX only
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return f"uid {os.getuid()}"


def gpu_nodes() -> list[str]:
    found: list[str] = []
    for pattern in GPU_DEVICES:
        found += sorted(str(p) for p in Path("/").glob(pattern.lstrip("/")))
    return found


def probe_bwrap(command: str, as_root: bool | None = None) -> Confinement:
    """Whether `command` (bwrap) can confine a script here: it must run a real sandbox, not only
    print its version (user namespaces may be off, or AppArmor may refuse them)."""
    as_root = os.geteuid() == 0 if as_root is None else as_root
    if command.strip().lower() in ("", "off", "0", "no", "false", "none"):
        return Confinement(None, problem="turned off (LAB_BWRAP=off)", as_root=as_root)
    tool = shutil.which(command)
    if tool is None:
        return Confinement(None, problem=f"{command} is not installed (Debian/Ubuntu: apt-get install bubblewrap)",
                           as_root=as_root)
    if as_root and shutil.which("setpriv") is None:
        return Confinement(None, problem="setpriv (util-linux) is missing: as root the lab needs it to drop to an "
                                         "unprivileged user inside the sandbox", as_root=as_root)
    try:
        version = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
        trial = subprocess.run([tool, *_system_args(), "--unshare-all", "--die-with-parent", "true"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Confinement(None, problem=f"{tool} does not run: {exc}", as_root=as_root)
    if trial.returncode != 0:
        why = (trial.stderr.strip().splitlines() or [f"exit {trial.returncode}"])[-1]
        return Confinement(None, problem=f"{tool} cannot make a sandbox here ({why}); user namespaces may be "
                                         "disabled", as_root=as_root)
    return Confinement(tool, version=version.removeprefix("bubblewrap ").strip() or None, as_root=as_root)


def _folders_above(path: str, made: set[str]) -> list[str]:
    """`--dir` for each folder above `path` that the sandbox does not have yet, made 0755 so the run
    user can search it: bwrap makes a bind's missing parents 0700 itself, and then an unprivileged
    script cannot reach what is bound below them (seen on a GPU host, where /opt/nvidia exists:
    /opt became 0700 and the venv in /opt/torch/.venv gave 'Permission denied')."""
    args: list[str] = []
    for parent in reversed(Path(path).parents):
        p = str(parent)
        if p not in made and not any(p == s or p.startswith(s + "/") for s in SYSTEM_DIRS):
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
    return args


def etc_files() -> dict[str, str]:
    """The files of the sandbox's /etc that the lab writes: the run user (as in the images:
    lab, 10001, home /tmp), root and nobody (whom host files may belong to), localhost, and name
    lookups from those files (and DNS, where there is network) only."""
    return {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                  f"{RUN_USER_NAME}:x:{RUN_UID}:{RUN_UID}:lab:{RUN_HOME}:/usr/sbin/nologin\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\n{RUN_USER_NAME}:x:{RUN_UID}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
                         "protocols: files\nservices: files\nethers: files\nrpc: files\n",
    }


def write_etc(folder: Path) -> Path:
    """Write `etc_files()` into `folder` (made), readable by the run user."""
    folder.mkdir(mode=0o755)
    for name, text in etc_files().items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    return folder


# Where the lab's CA bundle is named (as lab.image.hostpip reads them, first set wins).
CA_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def lab_ca_bundle(env: dict[str, str] | None = None) -> str | None:
    """The CA bundle the lab uses, from its environment (a file's path), or None."""
    env = dict(os.environ) if env is None else env
    path = next((env[v] for v in CA_VARIABLES if env.get(v)), None)
    return path if path and os.path.isfile(path) else None


def _etc_args(made: set[str], made_etc: Path | None = None, *, network: bool = False,
              ca_bundle: str | None = None) -> list[str]:
    """The sandbox's /etc (see the module docstring): a fresh folder, the lab's own files from
    `made_etc`, and read-only binds of the host's entries that a run needs, and nothing else."""
    args = ["--perms", "0755", "--dir", "/etc"]
    made.add("/etc")
    wanted: dict[str, str] = {}
    for name in ETC_FROM_HOST + (ETC_WITH_NETWORK if network else ()):
        wanted["/etc/" + name] = "/etc/" + name
    if made_etc is not None:
        for name in ETC_MADE:
            if not (network and name in ETC_WITH_NETWORK and os.path.exists("/etc/" + name)):
                wanted["/etc/" + name] = str(made_etc / name)
    if ca_bundle and ca_bundle.startswith("/etc/") and ".." not in ca_bundle.split("/"):
        wanted.setdefault(os.path.normpath(ca_bundle), os.path.normpath(ca_bundle))
    folders: list[str] = []  # host folders bound whole
    for dest, src in sorted(wanted.items()):
        if not os.path.exists(src) or any(dest.startswith(f + "/") for f in folders):
            continue  # absent (or a dangling link), or inside a folder already shown (the CA bundle)
        for parent in reversed(Path(dest).parents):
            if str(parent).startswith("/etc/") and str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", src, dest]  # a link is bound as what it points to
        made.add(dest)
        if os.path.isdir(src):
            folders.append(dest)
    return args


def _system_args(made: set[str] | None = None, made_etc: Path | None = None, *, network: bool = False,
                 ca_bundle: str | None = None) -> list[str]:
    made = {"/"} if made is None else made
    args: list[str] = []
    for top in SYSTEM_DIRS:
        if os.path.isdir(top):
            args += [*_folders_above(top, made), "--ro-bind", top, top]
            made.add(top)
    args += _etc_args(made, made_etc, network=network, ca_bundle=ca_bundle)
    for top in TOP_LINKS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def sandbox_args(*, tool: str, image: LocalImage, out: Path, limits: RunLimits, as_root: bool,
                 cwd: str = REPRO_DIR, made_etc: Path | None = None,
                 ca_bundle: str | None = None) -> list[str]:
    """The bwrap command line (up to the command itself) for one run. Pure: tests read it.
    `made_etc` holds the lab's /etc files (write_etc); `ca_bundle` is shown when under /etc."""
    made: set[str] = {"/", "/tmp", "/usr", "/sys", "/proc", "/dev"}
    args = [tool, *_system_args(made, made_etc, network=limits.network, ca_bundle=ca_bundle)]
    if os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]
    args += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
             # a private /dev/shm as in a container (Docker's default size): multiprocessing's
             # semaphores live there, and Inductor's compile workers use them
             "--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]
    for bind in image.binds:  # the folders above a bind: searchable, not the host's own
        args += [*_folders_above(bind, made), "--ro-bind", bind, bind]
        made.add(bind)
    if "/lab" not in made:
        args += ["--perms", "0755", "--dir", LAB_DIR]
    args += ["--ro-bind", str(image.lab_dir / "repro"), REPRO_DIR,
             "--ro-bind", str(image.lab_dir / "tools"), TOOLS_DIR,
             "--bind", str(out), OUT]
    if limits.network:
        for resolv in ("/run/systemd/resolve", "/run/resolvconf"):
            args += ["--ro-bind-try", resolv, resolv]
    if image.gpu:
        for node in gpu_nodes():
            args += ["--dev-bind", node, node]
    args += ["--remount-ro", "/", "--chdir", cwd,
             # the script is pid 1 of its pid namespace, as in a container: when it ends, every
             # process it started ends too
             "--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session"]
    if not limits.network:
        args.append("--unshare-net")
    if as_root:  # keep only what setpriv needs to become the run user; it drops those too
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_SETPCAP", "--", "setpriv", "--reuid", str(RUN_UID), "--regid", str(RUN_UID),
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    else:
        args += ["--unshare-user", "--uid", str(RUN_UID), "--gid", str(RUN_UID), "--"]
    return args


def script_env(image: LocalImage, env: dict[str, str], home: str = "/tmp") -> dict[str, str]:
    """The script's whole environment, as an image's: nothing of the lab's own environment."""
    path = ":".join([*image.path, "/usr/local/bin", "/usr/bin", "/bin"])
    base = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "USER": "lab",
            "LOGNAME": "lab", **dict(image.env)}
    return {**base, **env}


class LocalEngine:
    """This host, as an engine: the same shape as lab.engine.docker_engine.Engine where the
    pipeline, the drivers and the cache policy use it."""

    kind = LOCAL
    url = "local://"

    def __init__(self, options: LocalOptions | None = None, confinement: Confinement | None = None) -> None:
        self.options = options or LocalOptions()
        self.name = LOCAL
        self._confinement = confinement
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    # --- facts ---------------------------------------------------------------
    @property
    def confinement(self) -> Confinement:
        if self._confinement is None:
            self._confinement = probe_bwrap(self.options.bwrap)
        return self._confinement

    @property
    def arch(self) -> Arch:
        try:
            return Arch.parse(platform.machine())
        except ValueError:
            raise EngineError(f"this host is {platform.machine()}, which the lab does not support "
                              "(amd64 and arm64 only).") from None

    @property
    def version(self) -> str:
        c = self.confinement
        return f"bubblewrap {c.version}" if c.confined else "unconfined"

    @property
    def engine_id(self) -> str:
        return "local-" + hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]

    def has_gpu_runtime(self) -> bool:
        return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")

    @property
    def gpu(self) -> bool:
        return self.has_gpu_runtime()

    @property
    def native_arches(self) -> frozenset[Arch]:
        return frozenset({self.arch})

    @property
    def emulates(self) -> bool:
        return False  # another arch is refused (check_native): a Docker engine emulates

    @property
    def confined(self) -> bool:
        return self.confinement.confined

    @property
    def unconfined_reason(self) -> str | None:
        c = self.confinement
        return None if c.confined else c.problem

    @property
    def keeps_images(self) -> bool:
        return False  # a venv or the current Python, not an image a later command starts in

    @property
    def cross_installs(self) -> bool:
        return False  # uv makes the venv itself (lab.image.localenv); the BuildPlan is only a record

    def alive(self) -> bool:
        return True

    def environment_python(self) -> str | None:
        """X.Y of the Python its venvs are made from (--python, the `local.python` setting, or the
        default): the host's, whatever the scenario's base image has."""
        python = self.options.python or default_python()
        return ".".join(probe_python(os.path.realpath(python)).version.split(".")[:2])

    def resume_args(self) -> tuple[str, ...]:
        return ("--engine", LOCAL) + (("--trust-script",) if self.options.trust_script else ())

    # --- before a run ----------------------------------------------------------
    def check_native(self, arch: Arch, what: str) -> None:
        if arch != self.arch:
            raise ForeignArchError(
                f"the local engine runs only this host's architecture ({self.arch.value}); {what} is {arch.value}.",
                hint="Run it on a Docker engine: one with QEMU for emulation (`bin/setup-host`), or a native "
                     f"{arch.value} engine (`--engine NAME`; see `lab engines`). Naming both (`--engine local "
                     "--engine default`) routes each case to an engine that fits.")

    def check_confinement(self) -> Confinement:
        c = self.confinement
        if not c.confined and not self.options.trust_script:
            raise NotConfinedError(
                f"the local engine cannot confine the script here: {c.problem}. The script comes from a bug "
                "report, so without a sandbox it runs only when you say that you trust it.",
                hint="Install bubblewrap (as root: `apt-get install bubblewrap`, or `bin/setup-host`), or read "
                     "the script and rerun with --trust-script (the report then says \"not confined\").")
        return c

    def run_elsewhere(self, case: Case, host: HostPip, runs_root: Path, events: Events = no_events,
                      **options: object) -> None:
        """None: this engine runs each step of the case here (see Engine.run_elsewhere)."""
        return None

    def check(self, case: Case, events: Events = no_events) -> str | None:
        """A GPU case needs the NVIDIA device nodes; then another arch, a script it cannot confine
        (without --trust-script) and system packages the host lacks are refused. Returns where the
        system packages came from, in words."""
        if case.scenario.gpu and not self.gpu:
            variant = case.scenario.cpu_variant
            hint = (f"Run its CPU variant instead: `lab run {variant}`." if variant else
                    "Run it on an engine with the NVIDIA container runtime (see `lab doctor`).")
            raise NoGpuRuntimeError(f"{case.scenario.name} needs a GPU, and this host has no NVIDIA device "
                                    "(/dev/nvidiactl, /dev/nvidia0).", hint=hint)
        self.check_native(case.arch, case.name)
        self.check_confinement()
        return check_system_packages(case, events)

    def begin(self, case: Case, events: Events = no_events) -> Pending:
        return nothing_pending  # no base image: the host is the base

    def prepare(self, case: Case, plan: BuildPlan, host: HostPip, run_dir: Path, events: Events = no_events,
                *, ready: Pending = nothing_pending) -> BuiltImage:
        """The case's venv (made by uv, cached by its requirements) or the current Python; `plan`
        is only the run folder's record."""
        return prepare_local(case, host, run_dir, python_env=self.options.python_env, python=self.options.python,
                             gpu=case.scenario.gpu, events=events, log=run_dir / "build.log")

    def describe(self, image: BuiltImage, limits: RunLimits, system: str | None) -> LocalRef | None:
        """This host (OS, libc), the environment's Python and kind, and the confinement in words."""
        env = image.local
        if env is None:
            return None
        confinement = self.confinement
        return LocalRef(os=host_os(), libc=host_libc(), python=env.python_version, python_env=env.kind,
                        environment=env.where, system_packages=system or "", confined=confinement.confined,
                        confinement=confinement.words(limits.network))

    # --- running -------------------------------------------------------------
    def run(self, image: LocalImage, command: list[str], env: dict[str, str], out_dir: Path, logs_dir: Path,
            arch: Arch, timeout: float, labels: dict[str, str], events: Events,
            limits: RunLimits | None = None, reserved: Collection[str] = ()) -> RawRun:
        """Run `command` (paths as in an image: /lab/tools, /out) confined as the module says;
        stdout and stderr go to files in `logs_dir`, and what the script left in /out is copied into
        `out_dir` once every process of the run has ended."""
        limits = limits or RunLimits()
        logs_dir.mkdir(parents=True, exist_ok=True)
        confinement = self.check_confinement()
        with _staging(confinement) as out:
            argv, full_env, cwd = self._argv(image, command, env, out, limits, confinement)
            stdout = StreamFile("stdout", logs_dir / "stdout.txt", limits.stream_bytes)
            stderr = StreamFile("stderr", logs_dir / "stderr.txt", limits.stream_bytes)
            started = time.monotonic()
            proc = self._start(argv, full_env, cwd, limits, gpu=image.gpu, confined=confinement.confined)
            readers = [_pump(proc.stdout, stdout), _pump(proc.stderr, stderr)]
            watch = _OutWatch(out, limits.output_bytes, lambda: _kill(proc))
            watch.start()
            try:
                exit_code, timed_out = self._wait(proc, timeout, started, events)
            finally:
                watch.stop()
                _kill(proc)
                self._forget(proc)
            duration = time.monotonic() - started
            for reader in readers:
                reader.join(10)
            streams = (stdout.finish(None), stderr.finish(None))
            _check_started(exit_code, logs_dir / "stderr.txt", confinement)
            stopped_for = None
            if watch.over is not None:
                stopped_for = STOPPED_OUT_FULL
                events("run", f"/out grew past its cap ({format_bytes(limits.output_bytes)}): the run was stopped")
            outputs = extract_outputs(folder_chunks(out), out_dir, max_total_bytes=limits.output_bytes,
                                      max_files=limits.output_files, reserved=reserved)
        return RawRun(exit_code=exit_code, timed_out=timed_out, oom_killed=False, duration_s=duration,
                      stdout_path=logs_dir / "stdout.txt", stderr_path=logs_dir / "stderr.txt",
                      loader_dir=out_dir / "ld", emulated=False, command=tuple(command),
                      env=tuple(sorted(env.items())), limits=limits, stopped_for=stopped_for,
                      streams=streams, outputs=outputs, unit="sandbox" if confinement.confined else "run")

    def output_of(self, image: LocalImage, command: list[str], arch: Arch, timeout: float,
                  labels: dict[str, str], background: bool = False,
                  env: dict[str, str] | None = None, gpus: bool = False) -> tuple[int | None, str]:
        """Run a short command confined like a run, with `env`; (exit code, stdout and stderr together).
        `background` changes nothing here: the local engine runs natively, never beside an emulated script.
        `gpus` neither: the environment's `gpu` decides whether the device nodes are passed through."""
        with tempfile.TemporaryDirectory(prefix="lab-local-") as tmp:
            raw = self.run(image, command, dict(env or {}), Path(tmp) / "out", Path(tmp), arch, timeout, labels,
                           lambda s, m: None, RunLimits(memory_bytes=None if image.gpu else 8 * 1024**3))
            text = (raw.stdout_path.read_bytes()[:OUTPUT_OF_BYTES].decode("utf-8", "replace")
                    + raw.stderr_path.read_bytes()[:OUTPUT_OF_BYTES].decode("utf-8", "replace"))
        return raw.exit_code, text

    def read_file(self, image: LocalImage, path: str) -> bytes | None:
        """What a container's file would hold: the freeze, or a file of the venv's site-packages
        (`torch/version.py`), found in the environment's own site-packages folders."""
        if path == FREEZE_FILE and image.freeze:
            return image.freeze.encode()
        wanted = _IMAGE_SITE_FILE.match(path)
        if wanted is None:
            return None
        for folder in _site_folders(image.python):
            candidate = Path(folder) / wanted.group(1)
            if candidate.is_file():
                with candidate.open("rb") as fh:
                    return fh.read(_READ_FILE_BYTES)
        return None

    def _argv(self, image: LocalImage, command: list[str], env: dict[str, str], out: Path, limits: RunLimits,
              confinement: Confinement) -> tuple[list[str], dict[str, str], str]:
        """(argv, the environment of the first process, its folder). The script's environment is
        given through `env -i` inside, so that neither bwrap nor setpriv runs with LD_DEBUG."""
        command = [image.python if word == "python" and i == 0 else word for i, word in enumerate(command)]
        if confinement.confined:
            inner = script_env(image, env)
            argv = sandbox_args(tool=confinement.tool, image=image, out=out, limits=limits,  # type: ignore[arg-type]
                                as_root=confinement.as_root, made_etc=write_etc(out.parent / "etc"),
                                ca_bundle=lab_ca_bundle())
            argv += ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in sorted(inner.items())), *command]
            return argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, "/"
        # Not confined: the image's paths become the run's own folders.
        home = out.parent / "home"
        home.mkdir(exist_ok=True)
        inner = {k: _translate(v, image, out) for k, v in script_env(image, env, str(home)).items()}
        return ([_translate(w, image, out) for w in command], inner, str(image.lab_dir / "repro"))

    def _start(self, argv: list[str], env: dict[str, str], cwd: str, limits: RunLimits, *, gpu: bool,
               confined: bool) -> subprocess.Popen:
        with self._lock:
            if self._stopping.is_set():
                raise EngineError("the lab is stopping (interrupted): no new run is started")
            info_r, info_w = os.pipe() if confined else (None, None)
            try:
                if info_w is not None:  # bwrap says there the pid of the sandbox's pid 1 (the script)
                    argv = [argv[0], "--info-fd", str(info_w), *argv[1:]]
                argv = _prlimit(rlimits(limits, gpu=gpu, confined=confined)) + argv
                proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True,
                                        pass_fds=(info_w,) if info_w is not None else ())
            except OSError as exc:
                if info_r is not None:
                    os.close(info_r)
                raise EngineError(f"the local engine could not start {argv[0]}: {exc}") from None
            finally:
                if info_w is not None:
                    os.close(info_w)
            if info_r is not None:
                _read_info(proc, info_r)
            self._running.add(proc)
        return proc

    def _forget(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(proc)

    def _wait(self, proc: subprocess.Popen, timeout: float, started: float, events: Events) -> tuple[int | None, bool]:
        last = started
        while True:
            if cancel.requested():  # an eager bisection no longer needs this probe's answer
                events("run", "no longer needed: stopping the run")
                _kill(proc)
                raise cancel.Cancelled()
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                events("run", f"timeout after {timeout:.0f} s: stopping the run")
                _kill(proc)
                return None, True
            try:
                code = proc.wait(timeout=min(_POLL_S, left))
                return (128 - code if code < 0 else code), False  # killed by a signal: as a shell says it
            except subprocess.TimeoutExpired:
                if time.monotonic() - last >= 2:
                    last = time.monotonic()
                    events("run", f"{last - started:.0f} s")

    # --- housekeeping ------------------------------------------------------------
    def discard(self, tag: str) -> None:
        """Nothing: a probe's venv is a cache entry, shared by probes of the same requirements; the
        cache cap evicts it."""

    def managed_images(self) -> list[ImageUsage]:
        """None: the local engine holds no images (its venvs are cache entries, in the inventory)."""
        return []

    def remove_unused_image(self, image: ImageUsage) -> bool:
        return False  # it holds no images (managed_images is empty)

    def remove_session_containers(self) -> int:
        """Ctrl-C: end every run this process started here; from then on none starts."""
        with self._lock:
            self._stopping.set()
            running = list(self._running)
        for proc in running:
            _kill(proc)
        return len(running)


def _translate(word: str, image: LocalImage, out: Path) -> str:
    for inside, outside in ((OUT, str(out)), (REPRO_DIR, str(image.lab_dir / "repro")),
                            (TOOLS_DIR, str(image.lab_dir / "tools"))):
        if word == inside or word.startswith(inside + "/"):
            return outside + word[len(inside):]
    return word


@contextlib.contextmanager
def _staging(confinement: Confinement) -> Iterator[Path]:
    """A fresh /out for one run, with its sub-folders, owned by the run user; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="lab-local-"))
    try:
        out = root / "out"
        out.mkdir()
        for sub in OUT_FOLDERS:
            (out / sub).mkdir()
        if confinement.confined and confinement.as_root:
            for path in (out, *(out / s for s in OUT_FOLDERS)):
                os.chown(path, RUN_UID, RUN_UID)
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rlimits(limits: RunLimits, *, gpu: bool, confined: bool) -> list[tuple[int, int]]:
    """What the run's first process sets (inherited by the script): no core dumps, the pids limit
    (counted per user: meaningful for the run user or a user namespace, so only when confined), and
    the address space for a CPU case."""
    found = [(resource.RLIMIT_CORE, 0)]
    if limits.pids and confined:
        found.append((resource.RLIMIT_NPROC, limits.pids))
    if limits.memory_bytes and not gpu:
        found.append((resource.RLIMIT_AS, limits.memory_bytes))
    return found


def _prlimit(limits: list[tuple[int, int]]) -> list[str]:
    """`prlimit --core=0 ... --`: set in the child by util-linux's prlimit (no Python runs between
    fork and exec, which is unsafe in a process with threads)."""
    names = {resource.RLIMIT_CORE: "core", resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_AS: "as"}
    tool = shutil.which("prlimit")
    if tool is None:
        raise EngineError("prlimit (util-linux) is missing: the local engine sets the run's limits with it.",
                          hint="Install util-linux (Debian/Ubuntu: apt-get install util-linux).")
    return [tool, *(f"--{names[r]}={v}" for r, v in limits), "--"]


def _pump(stream, capture: StreamFile) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := stream.read1(1 << 16):
                capture.feed(chunk)
    thread = threading.Thread(target=run, daemon=True, name=f"lab-local-{capture.name}")
    thread.start()
    return thread


_LAUNCHERS = ("bwrap:", "setpriv:", "/usr/bin/env:", "env:", "prlimit:")


def _check_started(exit_code: int | None, stderr: Path, confinement: Confinement) -> None:
    """A sandbox that could not be made, or a Python that could not be started, is the engine's
    failure, never the script's verdict: bwrap, setpriv, prlimit and env say so on stderr's first line
    and exit 1, 126 or 127."""
    if exit_code not in (1, 126, 127):
        return
    try:
        with stderr.open("rb") as fh:
            first = fh.readline(2000).decode("utf-8", "replace").strip()
    except OSError:
        return
    if first.startswith(_LAUNCHERS):
        how = "the sandbox could not be made or" if confinement.confined else "the run"
        raise EngineError(f"the local engine failed before the script ran ({how} its Python did not start): "
                          f"{first[:400]}",
                          hint="See `lab engines` (the local engine's confinement); LAB_BWRAP=off with "
                               "--trust-script runs without the sandbox.")


def _read_info(proc: subprocess.Popen, fd: int) -> None:
    """Read bwrap's --info-fd (`{"child-pid": N}`) in the background into `proc.lab_child`."""
    proc.lab_child = None  # type: ignore[attr-defined]
    proc.lab_info = threading.Event()  # type: ignore[attr-defined]

    def read() -> None:
        data = b""
        try:
            with os.fdopen(fd, "rb") as fh:
                while chunk := fh.read(4096):
                    data += chunk
                    with contextlib.suppress(ValueError):
                        proc.lab_child = int(json.loads(data.decode())["child-pid"])  # type: ignore[attr-defined]
                        break
        except (OSError, ValueError, KeyError, TypeError):
            pass
        finally:
            proc.lab_info.set()  # type: ignore[attr-defined]

    threading.Thread(target=read, daemon=True, name="lab-local-info").start()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the sandbox's pid 1 (the script: its pid namespace ends with it, every process of
    the run with it) while bwrap still holds it, then to the run's process group (bwrap; unconfined,
    what stayed in the group)."""
    child = getattr(proc, "lab_child", None)
    if child is not None and proc.poll() is None:  # bwrap has not reaped it: the pid is still the script's
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_GRACE_S)


class _OutWatch(threading.Thread):
    """Every few seconds, the bytes under /out (links not followed); past the cap, the run is killed."""

    def __init__(self, out: Path, cap: int, kill) -> None:
        super().__init__(daemon=True, name="lab-local-out-watch")
        self.out, self.cap, self.kill = out, cap, kill
        self.over: int | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(_OUT_CHECK_S):
            used = _tree_bytes(self.out)
            if used > self.cap:
                self.over = used
                self.kill()
                return

    def stop(self) -> None:
        self._stop.set()


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


@dataclass(frozen=True)
class LocalFacts:
    """What `lab engines` says of the local engine."""

    arch: str
    cpus: int
    memory: int | None
    gpu: bool
    confinement: Confinement
    os: str = field(default_factory=host_os)
    libc: str = field(default_factory=host_libc)


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


_IMAGE_SITE_FILE = re.compile("^" + re.escape(VENV) + r"/lib/python[0-9.]+/site-packages/([^\0]+)$")
_READ_FILE_BYTES = 64 * 1024**2


@functools.lru_cache(maxsize=32)
def _site_folders(python: str) -> tuple[str, ...]:
    """The site-packages folders of an interpreter (its venv's, or its own and the user's)."""
    code = ("import json, site, sysconfig; p = sysconfig.get_paths(); "
            "print(json.dumps([p['purelib'], p['platlib'], *site.getsitepackages()]))")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return tuple(dict.fromkeys(json.loads(proc.stdout.strip().splitlines()[-1])))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return ()
