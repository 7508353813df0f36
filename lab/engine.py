"""The only module that talks to Docker (through the docker SDK).

Every container and image the lab creates carries the label
`org.torch-repro-lab.managed=true`, and every container is removed when its
run ends: on success, on error, on timeout and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import docker
import docker.errors
import requests.exceptions
from docker.types import Ulimit

from .errors import BuildError, EngineError
from .records import EMULATOR_CRASH, Events, RawRun, RunLimits
from .render import BuildPlan, write_context
from .scenario import Arch

LABEL = "org.torch-repro-lab.managed"
LABELS = {LABEL: "true"}
LAYERS_REPO = "torch-repro-lab/layers"  # anchors for shared layers (see anchor_shared_layers)
OUT_IN_CONTAINER = "/out"
_POLL_S = 2.0
# After QEMU's crash line (seen with aarch64 torch 2.13.0 and 2.15.0 under qemu-user 7.2) the
# crashed process can run on for 20+ minutes, so the lab stops the container itself.
_CRASH_GRACE_S = 5.0


class Engine:
    """A connected Docker engine."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self._info: dict | None = None

    @classmethod
    def connect(cls) -> Engine:
        """Connect the way the docker CLI does (DOCKER_HOST, else the local socket)."""
        try:
            client = docker.from_env(version="auto", timeout=300)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EngineError(
                f"the Docker engine does not answer ({_short(exc)}).",
                hint="Start it (as root: `bin/setup-host`, or `systemctl start docker`), "
                     "check DOCKER_HOST, then see `lab doctor`.") from None
        return cls(client)

    # --- facts ---------------------------------------------------------------
    def info(self) -> dict:
        if self._info is None:
            self._info = self.client.info()
        return self._info

    @property
    def arch(self) -> Arch:
        machine = self.info().get("Architecture", "x86_64")
        try:
            return Arch.parse(machine)
        except ValueError:
            raise EngineError(f"the engine runs on {machine}, which the lab does not support "
                              "(amd64 and arm64 only).") from None

    @property
    def version(self) -> str:
        return str(self.info().get("ServerVersion", "unknown"))

    def has_gpu_runtime(self) -> bool:
        return "nvidia" in (self.info().get("Runtimes") or {})

    # --- images --------------------------------------------------------------
    def image_id(self, ref: str, arch: Arch | None = None) -> str | None:
        """The id of a local image, if present (and of the wanted arch)."""
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine failed to inspect {ref}: {_short(exc)}") from None
        if arch is not None and image.attrs.get("Architecture") != arch.value:
            return None
        return image.id

    def pull(self, ref: str, arch: Arch) -> str | None:
        """Pull `ref` for `arch`; None when no registry can provide it."""
        try:
            image = self.client.images.pull(ref, platform=arch.platform)
        except (docker.errors.APIError, docker.errors.DockerException,
                requests.exceptions.RequestException):
            return None
        return image.id

    def build_rootfs(self, rootfs: Path, tag: str, arch: Arch) -> str:
        """Turn a rootfs tarball into an image of `arch` (FROM scratch; ADD rootfs.tar /)."""
        dockerfile = b'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n'
        with tempfile.TemporaryFile() as ctx:
            with tarfile.open(fileobj=ctx, mode="w") as tar:
                info = tarfile.TarInfo("Dockerfile")
                info.size = len(dockerfile)
                tar.addfile(info, io.BytesIO(dockerfile))
                tar.add(rootfs, arcname="rootfs.tar")
            ctx.seek(0)
            return self._build(ctx, tag, arch, {}, lambda line: None)

    @property
    def is_local(self) -> bool:
        """Whether the engine runs on this machine (its socket, or TCP to this host's loopback), so
        that its builds with the host's network reach a server the lab listens with on 127.0.0.1."""
        url = urlparse(str(self.client.api.base_url))
        if url.scheme == "http+docker":
            return url.hostname in ("localhost", "localunixsocket")
        return url.hostname in ("127.0.0.1", "localhost", "::1")

    def build(self, plan: BuildPlan, base_ref: str, tag: str, buildargs: dict[str, str],
              on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        """Build the plan's context (streamed from a temp file) and tag it. `network_mode` is the
        build steps' network ("host" to reach a server on the host's loopback); None: the default."""
        with tempfile.TemporaryFile() as ctx:
            write_context(plan.files, ctx)
            ctx.seek(0)
            return self._build(ctx, tag, plan.case.arch, {"BASE": base_ref, **buildargs}, on_line, network_mode)

    def _build(self, ctx, tag: str, arch: Arch, buildargs: dict[str, str],
               on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        log: list[str] = []
        image_id = None
        try:
            stream = self.client.api.build(
                fileobj=ctx, custom_context=True, tag=tag, platform=arch.platform, network_mode=network_mode,
                buildargs=buildargs, labels=LABELS, rm=True, forcerm=True, pull=False, decode=True)
            for chunk in stream:
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        log.append(line)
                        on_line(line)
                if "error" in chunk:
                    log.append(chunk["error"])
                    raise BuildError(f"the image build failed: {chunk['error'].strip()}",
                                     log="\n".join(log))
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
        except docker.errors.APIError as exc:
            raise BuildError(f"the engine refused the build: {_short(exc)}", log="\n".join(log)) from None
        except requests.exceptions.RequestException as exc:
            raise BuildError(f"the build connection broke: {_short(exc)}", log="\n".join(log)) from None
        if image_id is None:
            image_id = self.image_id(tag)
        if image_id is None:
            raise BuildError("the build ended without an image.", log="\n".join(log))
        return image_id

    # --- containers ----------------------------------------------------------
    def run(self, image: str, command: list[str], env: dict[str, str], mount_dir: Path, logs_dir: Path,
            arch: Arch, timeout: float, labels: dict[str, str], events: Events,
            limits: RunLimits | None = None) -> RawRun:
        """Run `command` with `mount_dir` mounted at /out; stdout/stderr go to files in `logs_dir`.

        The script is untrusted: the container gets no network (unless `limits.network`), no
        capabilities, no-new-privileges, limits on memory, pids and CPUs, and no mount but /out.
        The timeout is enforced by killing the container through the engine, and so is an
        emulator crash; the container is removed whatever happens, Ctrl-C included.
        """
        limits = limits or RunLimits()
        mount_dir.mkdir(parents=True, exist_ok=True)
        container = self._create(image, command, env, arch, labels, limits=limits,
                                 volumes={str(mount_dir.resolve()): {"bind": OUT_IN_CONTAINER, "mode": "rw"}})
        timed_out = False
        started = time.monotonic()
        emulated = arch != self.arch
        try:
            container.start()
            exit_code, timed_out, stopped_for = self._wait(container, timeout, started, events,
                                                           watch_crash=emulated)
            duration = time.monotonic() - started
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            stdout_path, stderr_path = logs_dir / "stdout.txt", logs_dir / "stderr.txt"
            _save_logs(container, stdout_path, stdout=True)
            _save_logs(container, stderr_path, stdout=False)
        finally:
            _remove(container)
        return RawRun(exit_code=exit_code, timed_out=timed_out, oom_killed=oom, duration_s=duration,
                      stdout_path=stdout_path, stderr_path=stderr_path, loader_dir=mount_dir / "ld",
                      emulated=emulated, command=tuple(command), env=tuple(sorted(env.items())),
                      limits=limits, stopped_for=stopped_for)

    def output_of(self, image: str, command: list[str], arch: Arch, timeout: float,
                  labels: dict[str, str]) -> tuple[int | None, str]:
        """Run a short command in `image` and return (exit code, combined output)."""
        container = self._create(image, command, {}, arch, labels, limits=RunLimits())
        try:
            container.start()
            exit_code, _, _ = self._wait(container, timeout, time.monotonic(), lambda s, m: None,
                                         watch_crash=arch != self.arch)
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        finally:
            _remove(container)
        return exit_code, output

    def read_file(self, image: str, path: str) -> bytes | None:
        """Read one file out of an image without starting a container."""
        container = self.client.containers.create(image, command=["true"], labels=LABELS,
                                                  network_mode="none")
        try:
            stream, _ = container.get_archive(path)
            buf = io.BytesIO(b"".join(stream))
            with tarfile.open(fileobj=buf) as tar:
                member = tar.next()
                fh = tar.extractfile(member) if member else None
                return fh.read() if fh else None
        except docker.errors.NotFound:
            return None
        finally:
            _remove(container)

    def _create(self, image: str, command: list[str], env: dict[str, str], arch: Arch,
                labels: dict[str, str], limits: RunLimits, volumes: dict | None = None):
        try:
            return self.client.containers.create(image, command=command, environment=env,
                                                 **container_options(arch, {**LABELS, **labels}, limits, volumes))
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not create a container from {image}: {_short(exc)}") from None

    def _wait(self, container, timeout: float, started: float, events: Events,
              watch_crash: bool = False) -> tuple[int | None, bool, str | None]:
        """Wait for the container: (exit code, timed out, why the lab stopped it early)."""
        crashed_at: float | None = None
        while True:
            now = time.monotonic()
            left = timeout - (now - started)
            if left <= 0:
                events("run", f"timeout after {timeout:.0f} s: killing the container")
                _kill(container)
                return None, True, None
            if crashed_at is not None and now - crashed_at >= _CRASH_GRACE_S:
                events("run", "the emulator crashed (qemu: uncaught target signal): stopping the container")
                _kill(container)
                return _exit_code_after_kill(container), False, "emulator crash"
            try:
                result = container.wait(timeout=min(_POLL_S, left))
                return int(result.get("StatusCode", -1)), False, None
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                events("run", f"{time.monotonic() - started:.0f} s")
            if watch_crash and crashed_at is None and _emulator_crashed(container):
                crashed_at = time.monotonic()

    # --- housekeeping --------------------------------------------------------
    def remove_managed(self) -> tuple[int, int]:
        """Remove every container and image the lab labelled. Returns (containers, images)."""
        containers = self.client.containers.list(all=True, filters={"label": f"{LABEL}=true"})
        for c in containers:
            _remove(c)
        images = self.client.images.list(filters={"label": f"{LABEL}=true"})
        images += self.client.images.list(name=LAYERS_REPO)
        removed = 0
        for img in images:
            try:
                self.client.images.remove(img.id, force=True)
                removed += 1
            except docker.errors.APIError:
                pass
        return len(containers), removed

    def anchor_shared_layers(self, ref: str, marker: str = "python3 -m venv") -> str | None:
        """Tag the newest layer of `ref` built by a step containing `marker` (the system packages and
        the venv, shared by every torch version of a scenario), so that removing `ref` keeps it."""
        try:
            history = self.client.api.history(ref)
        except docker.errors.APIError:
            return None
        for entry in history:  # newest first
            layer = entry.get("Id") or ""
            if marker in (entry.get("CreatedBy") or "") and layer.startswith("sha256:"):
                tag = f"{LAYERS_REPO}:{layer.removeprefix('sha256:')[:16]}"
                with contextlib.suppress(docker.errors.APIError):
                    self.client.api.tag(layer, LAYERS_REPO, layer.removeprefix("sha256:")[:16])
                    return tag
        return None

    def remove_image(self, ref: str) -> bool:
        """Untag (and, when nothing else uses it, delete) one image; False when it was not there."""
        try:
            self.client.images.remove(ref, noprune=False)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not remove {ref}: {_short(exc)}") from None

    def managed_containers(self) -> list[str]:
        return [c.name for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}=true"})]


def container_options(arch: Arch, labels: dict[str, str], limits: RunLimits, volumes: dict | None) -> dict:
    """The confinement of every container the lab starts (see `Engine.run`)."""
    options: dict = dict(
        volumes=volumes or {}, labels=labels, platform=arch.platform, detach=True,
        network_mode="bridge" if limits.network else "none",
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
        ulimits=[Ulimit(name="core", soft=0, hard=0)])
    if limits.memory_bytes:
        options.update(mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes)
    if limits.pids:
        options["pids_limit"] = limits.pids
    if limits.cpus:
        options["nano_cpus"] = int(limits.cpus * 1e9)
    return options


def _emulator_crashed(container) -> bool:
    try:
        tail = container.logs(stdout=False, stderr=True, tail=50)
    except docker.errors.APIError:
        return False
    return EMULATOR_CRASH.encode() in tail


def _exit_code_after_kill(container) -> int | None:
    try:
        return int(container.wait(timeout=30).get("StatusCode", -1))
    except (docker.errors.APIError, requests.exceptions.RequestException):
        return None


def _save_logs(container, path: Path, stdout: bool) -> None:
    with path.open("wb") as fh:
        for chunk in container.logs(stdout=stdout, stderr=not stdout, stream=True):
            fh.write(chunk)


def _kill(container) -> None:
    with contextlib.suppress(docker.errors.APIError):
        container.kill()


def _remove(container) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError:
        time.sleep(1)
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
