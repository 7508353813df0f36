"""The only module that talks to Docker (through the docker SDK).

Every container and image the lab creates carries the label
`org.torch-repro-lab.managed=true`, and every container is removed when its
run ends (with its anonymous /out volume): on success, on error, on timeout and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from functools import partial
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

import docker
import docker.errors
import requests.exceptions
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from lab.core.arch import Arch
from lab.core.errors import BuildError, EngineError
from lab.core.hashing import CountingWriter, HashingWriter
from lab.core.records import (
    EMULATOR_CRASH,
    STOPPED_EMULATOR,
    STOPPED_OUT_FULL,
    Events,
    ImageUsage,
    OutputCopy,
    RawRun,
    RunLimits,
    StreamCapture,
    format_bytes,
)
from lab.core.safetar import extract_outputs
from lab.engine.streams import StreamFile as _Capture

LABEL = "org.torch-repro-lab.managed"
LABELS = {LABEL: "true"}
# Every container this process starts also carries its session, so that Ctrl-C during parallel
# runs can remove them on every engine (worker threads are blocked in the engine's API).
SESSION_LABEL = "org.torch-repro-lab.session"
SESSION = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
# Ctrl-C closes the gate: a worker thread that goes on (to collect_env, say) after its run's
# container was removed gets no new container. Creating holds the gate, so none is half made
# when the session's containers are listed for removal.
_CREATE_GATE = threading.Lock()
_STOPPING = threading.Event()
LAYERS_REPO = "torch-repro-lab/layers"  # anchors for shared layers (see anchor_shared_layers)
OUT_IN_CONTAINER = "/out"
# The PATH a build FROM scratch gives an image (the base the lab loads from a rootfs gets it too)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The user the script runs as: the image's `lab` user, made by dockerfiles/debian.Dockerfile.j2
# (which also makes /out and its sub-folders, owned by it: Docker copies them into the new
# volume). Numeric, so that an image without that user (a bare base in `lab doctor`) runs too.
RUN_UID = 10001
RUN_USER = f"{RUN_UID}:{RUN_UID}"
RUN_HOME = "/tmp"  # the root filesystem is read-only: HOME (and caches under it) live on the tmpfs
# The engine's own copy of the streams (json-file), bounded: the lab reads the streams live from
# an attach; this log serves the emulator-crash watcher, which reads its last lines.
ENGINE_LOG = {"max-size": "16m", "max-file": "2"}
READ_FILE_BYTES = 64 * 1024**2  # Engine.read_file reads at most this much of one file
OUTPUT_OF_BYTES = 16 * 1024**2  # Engine.output_of keeps at most this much output
_POLL_S = 2.0
_OUT_CHECK_S = 10.0  # how often the size of /out is checked while the script runs
_JOIN_S = 60.0       # how long the stream reader may take to drain after the container ends
# After QEMU's crash line (seen with aarch64 torch 2.13.0 and 2.15.0 under qemu-user 7.2) the
# crashed process can run on for 20+ minutes, so the lab stops the container itself.
_CRASH_GRACE_S = 5.0


class Engine:
    """A connected Docker engine."""

    def __init__(self, client: docker.DockerClient, stream_client: docker.DockerClient | None = None,
                 name: str = "default", url: str | None = None) -> None:
        self.client = client
        # Attached streams may stay quiet for longer than any request timeout: a second client,
        # configured the same way but without one, reads them.
        self.stream_client = stream_client or client
        self.name = name  # the Docker context's name, or the address given
        self.url = url
        self._info: dict | None = None

    @classmethod
    def connect(cls) -> Engine:
        """Connect the way the docker CLI does: DOCKER_HOST, else DOCKER_CONTEXT, else the current
        Docker context (the local socket by default)."""
        from lab.engine.engines import connect, current_spec
        return connect(current_spec())

    @classmethod
    def connect_url(cls, url: str, *, name: str, tls=None, timeout: float = 300,
                    answer_within: float = 20) -> Engine:
        """Connect to one engine address (unix://, tcp:// with `tls`, ssh:// through paramiko). An
        engine that does not answer within `answer_within` seconds is unreachable; requests of a
        connected engine may take `timeout`."""
        try:
            first = docker.DockerClient(base_url=url, version="auto", timeout=answer_within, tls=tls or False)
            first.ping()
            version = first.api.api_version
            first.close()
            client = docker.DockerClient(base_url=url, version=version, timeout=timeout, tls=tls or False)
            stream_client = docker.DockerClient(base_url=url, version=client.api.api_version, timeout=None,
                                                tls=tls or False)
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            where = url if name == url else f"{name}, {url}"
            raise EngineError(
                f"the Docker engine does not answer ({where}: {_short(exc)}).",
                hint="Start it (as root: `bin/setup-host`, or `systemctl start docker`), "
                     "check DOCKER_HOST or the Docker context, then see `lab doctor` and `lab engines`.") from None
        except Exception as exc:  # noqa: BLE001 - ssh:// raises paramiko's own errors (auth, host key)
            raise EngineError(f"the Docker engine {name} ({url}) cannot be reached: "
                              f"{type(exc).__name__}: {_short(exc)}.",
                              hint="Check that `ssh` to that host works without a password prompt "
                                   "and that its host key is known.") from None
        return cls(client, stream_client, name=name, url=url)

    def alive(self) -> bool:
        """Whether the engine still answers (after a failure: was it the engine, or the case?)."""
        try:
            return bool(self.client.ping())
        except Exception:  # noqa: BLE001 - any failure to answer means it is gone
            return False

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

    @property
    def engine_id(self) -> str:
        """The engine's own ID (stable across restarts): keys what the lab caches per engine."""
        return str(self.info().get("ID") or self.info().get("Name") or "unknown")

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
        """Turn a rootfs tarball into an image of `arch` (as `FROM scratch`, `ADD rootfs.tar /` and
        `CMD ["bash"]` would), through the engine's image load: a one-layer image whose config the
        lab writes, so the engine unpacks the tar once (a build would send it as a context, unpack
        it with ADD, then diff and commit it again)."""
        digest = hashlib.sha256()
        with rootfs.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        config = json.dumps({
            "architecture": arch.value, "os": "linux", **({"variant": "v8"} if arch is Arch.ARM64 else {}),
            "created": "1970-01-01T00:00:00Z",
            "config": {"Env": [f"PATH={DEFAULT_PATH}"], "Cmd": ["bash"], "Labels": dict(LABELS)},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest.hexdigest()}"]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"torch-repro-lab: {rootfs.name}"}],
        }, sort_keys=True).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["rootfs/layer.tar"]}]).encode()

        def write_tar(out: BinaryIO) -> None:
            with tarfile.open(fileobj=out, mode="w|") as tar:
                for name, data in (("manifest.json", manifest), (config_name, config)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                tar.add(rootfs, arcname="rootfs/layer.tar")

        self._load(write_tar, tag)
        image_id = self.image_id(tag, arch)
        if image_id is None:
            raise BuildError(f"the load of {tag} ended without an image of {arch.value}.")
        return image_id

    def stack_layer(self, parent: str, write_layer: Callable[[BinaryIO], object], tag: str, arch: Arch,
                    created_by: str, known: tuple[str, int] | None = None) -> str:
        """An image that is `parent` plus one layer, made through the engine's image load: the
        parent's layers are named by their digests and not sent again (the engine finds each by its
        chain and does not read the placeholder that stands for it), and the new layer crosses into
        the engine once, with no build context, no `COPY` and no commit. The load must name the
        layer's SHA-256 and size before it sends it: `known` gives them (counted when the tree was
        made), and the layer is streamed while it is written; without them, or when the engine
        finds that the layer no longer has that digest, it is written to a temporary file first."""
        try:
            attrs = self.client.api.inspect_image(parent)
        except docker.errors.DockerException as exc:
            raise BuildError(f"the engine could not inspect {parent}: {_short(exc)}") from None
        if known is not None:
            with contextlib.suppress(BuildError):  # the tree changed since it was counted
                self._load(partial(_stacked_tar, attrs, arch, tag, created_by, known, write_layer), tag)
                image_id = self.image_id(tag)
                if image_id is not None:
                    return image_id
        with tempfile.TemporaryFile() as layer:
            digest = HashingWriter(layer)
            write_layer(digest)
            layer.seek(0)
            self._load(partial(_stacked_tar, attrs, arch, tag, created_by, (digest.hexdigest(), digest.size),
                               partial(shutil.copyfileobj, layer)), tag)
        image_id = self.image_id(tag)
        if image_id is None:
            raise BuildError(f"the load of {tag} ended without an image.")
        return image_id

    def _load(self, write_tar: Callable[[BinaryIO], object], tag: str) -> None:
        """The engine's image load of the tar `write_tar` writes, streamed while it is written."""
        with _TarStream(write_tar) as body:
            try:
                for chunk in self.stream_client.api.load_image(body):
                    if chunk.get("error"):
                        raise BuildError(f"the engine could not load {tag}: {chunk['error'].strip()}")
            except OSError as exc:  # the engine's answer (APIError), the connection, or the tar's writer
                raise BuildError(body.why_broken(f"load {tag}", exc)) from None

    @property
    def is_local(self) -> bool:
        """Whether the engine runs on this machine (its socket, or TCP to this host's loopback), so
        that its builds with the host's network reach a server the lab listens with on 127.0.0.1."""
        url = urlparse(str(self.client.api.base_url))
        if url.scheme == "http+docker":
            return url.hostname in ("localhost", "localunixsocket")
        return url.hostname in ("127.0.0.1", "localhost", "::1")

    def build(self, write_context: Callable[[BinaryIO], object], arch: Arch, base_ref: str, tag: str,
              buildargs: dict[str, str], on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        """Build a context (`write_context` writes its tar, streamed through a temp file) for `arch`
        and tag it. `network_mode` is the build steps' network ("host" to reach a server on the
        host's loopback); None: the default. The engine knows nothing of plans or templates."""
        with tempfile.TemporaryFile() as ctx:
            write_context(ctx)
            ctx.seek(0)
            return self._build(ctx, tag, arch, {"BASE": base_ref, **buildargs}, on_line, network_mode)

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

    def import_layer(self, write_tar: Callable[[BinaryIO], object], ref: str) -> str:
        """A one-layer image made from a tar stream, as `docker import -` does: the tar goes to the
        engine once, while `write_tar` writes it, and the engine unpacks it straight into a layer,
        with no build context, no `COPY` and no commit. Import takes no platform (the engine
        records its own arch), so this serves images that are only a `COPY --from` source, whose
        tag names the arch. A tar that fails half-way makes no image."""
        repository, _, tag = ref.rpartition(":")
        with _TarStream(write_tar) as body:
            try:
                answer = self.stream_client.api.import_image_from_stream(
                    body, repository=repository, tag=tag, changes=[f"LABEL {LABEL}=true"])
            except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
                raise BuildError(body.why_broken(f"import {ref}", exc)) from None
        for line in str(answer).splitlines():
            with contextlib.suppress(ValueError):
                error = json.loads(line).get("error")
                if error:
                    raise BuildError(f"the engine could not import {ref}: {error.strip()}")
        image_id = self.image_id(ref)
        if image_id is None:
            raise BuildError(f"the import of {ref} ended without an image.")
        return image_id

    # --- containers ----------------------------------------------------------
    def run(self, image: str, command: list[str], env: dict[str, str], out_dir: Path, logs_dir: Path,
            arch: Arch, timeout: float, labels: dict[str, str], events: Events,
            limits: RunLimits | None = None, reserved: Collection[str] = ()) -> RawRun:
        """Run `command`; stdout/stderr go to files in `logs_dir`, and what it left in /out is
        copied into `out_dir` once the container has stopped.

        The script is untrusted: it runs as a non-root user on a read-only root filesystem, with
        a tmpfs /tmp and an anonymous volume at /out (no bind mount: the host touches nothing
        the container controls while it runs), no network (unless `limits.network`), no
        capabilities, no-new-privileges, limits on memory, pids and CPUs, and no core dumps.
        stdout and stderr are read live and kept up to `limits.stream_bytes` each (then only
        their last MiB); /out comes out through the engine's archive API and
        `safetar.extract_outputs` (no link, fifo or device is ever made; at most
        `limits.output_bytes` and `limits.output_files`; names in `reserved` are the lab's own),
        and is checked every few seconds while the script runs: past `limits.output_bytes` the
        container is stopped. The timeout is enforced by killing the container through the
        engine, and so is an emulator crash; the container and its volume are removed whatever
        happens, Ctrl-C included.
        """
        limits = limits or RunLimits()
        logs_dir.mkdir(parents=True, exist_ok=True)
        container = self._create(image, command, env, arch, labels, limits=limits, with_out=True)
        emulated = arch != self.arch
        reader: _StreamReader | None = None
        watch: _OutWatch | None = None
        try:
            reader = _StreamReader(self._attach(container), logs_dir / "stdout.txt", logs_dir / "stderr.txt",
                                   limits.stream_bytes)
            reader.start()
            started = time.monotonic()
            _start(container)
            watch = _OutWatch(container, limits.output_bytes)
            watch.start()
            exit_code, timed_out, stopped_for = self._wait(container, timeout, started, events,
                                                           watch_crash=emulated)
            duration = time.monotonic() - started
            watch.stop()
            streams = reader.finish(_JOIN_S)
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            if watch.over is not None and stopped_for is None:
                stopped_for = STOPPED_OUT_FULL
                events("run", f"/out grew past its cap ({format_bytes(limits.output_bytes)}): "
                              "the container was stopped")
            outputs = self._copy_out(container, out_dir, limits, reserved)
        finally:
            if watch is not None:
                watch.stop()
            _remove(container)
            if reader is not None:  # on the way out early (Ctrl-C, an engine error): close the files
                reader.close()
                reader.finish(5)
        return RawRun(exit_code=exit_code, timed_out=timed_out, oom_killed=oom, duration_s=duration,
                      stdout_path=logs_dir / "stdout.txt", stderr_path=logs_dir / "stderr.txt",
                      loader_dir=out_dir / "ld", emulated=emulated, command=tuple(command),
                      env=tuple(sorted(env.items())), limits=limits, stopped_for=stopped_for,
                      streams=streams, outputs=outputs)

    def output_of(self, image: str, command: list[str], arch: Arch, timeout: float,
                  labels: dict[str, str], background: bool = False,
                  env: dict[str, str] | None = None, gpus: bool = False) -> tuple[int | None, str]:
        """Run a short command in `image`, confined like a run, with `env`, and return (exit code,
        combined output; at most OUTPUT_OF_BYTES of it).
        `background`: the lowest CPU weight (cpu_shares 2 against a run's 1024), for a command run
        beside the script: it gets the CPU the script leaves. `gpus`: with a device request for all
        the engine's GPUs (collect_env of a GPU scenario reports them)."""
        container = self._create(image, command, dict(env or {}), arch, labels,
                                 limits=RunLimits(gpus=gpus), background=background)
        try:
            _start(container)
            exit_code, _, _ = self._wait(container, timeout, time.monotonic(), lambda s, m: None,
                                         watch_crash=arch != self.arch)
            output = _read_capped(container.logs(stdout=True, stderr=True, stream=True, follow=False),
                                  OUTPUT_OF_BYTES).decode("utf-8", "replace")
        finally:
            _remove(container)
        return exit_code, output

    def try_gpu_request(self, image: str, command: list[str], timeout: float = 120) -> tuple[bool, str]:
        """Start a container of `image` running `command`, confined like a run, with a device
        request for all GPUs (as `--gpus all`): (whether it started and exited 0, in words; a
        refusal is the engine's own answer, e.g. `could not select device driver`)."""
        limits = RunLimits(memory_bytes=256 * 1024**2, pids=64, gpus=True)
        container = self._create(image, command, {}, None, {"org.torch-repro-lab.step": "gpu-check"},
                                 limits=limits)
        try:
            try:
                container.start()
            except docker.errors.APIError as exc:
                return False, _explanation(exc)
            exit_code, timed_out, _ = self._wait(container, timeout, time.monotonic(), lambda s, m: None)
            if timed_out:
                return False, f"the test container ({image}) did not end within {timeout:.0f} s"
            if exit_code != 0:
                said = _read_capped(container.logs(stdout=True, stderr=True, stream=True), 4096)
                return False, (f"the test container ({image}) started with the GPUs but exited {exit_code}: "
                               + (said.decode("utf-8", "replace").strip()[:300] or "no output"))
            return True, f"a test container ({image}) started with the GPUs and ran"
        finally:
            _remove(container)

    def read_file(self, image: str, path: str) -> bytes | None:
        """Read one regular file out of an image without starting a container (None when it is
        absent, not a regular file, or larger than READ_FILE_BYTES)."""
        container = self._create(image, ["true"], {}, None, {}, limits=RunLimits())
        try:
            stream, stat = container.get_archive(path)
            if int(stat.get("size", 0)) > READ_FILE_BYTES:
                return None
            data = _read_capped(stream, READ_FILE_BYTES + 64 * 1024)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                if member is None or not member.isreg():
                    return None
                fh = tar.extractfile(member)
                return fh.read() if fh else None
        except (docker.errors.NotFound, tarfile.TarError):
            return None
        finally:
            _remove(container)

    def _create(self, image: str, command: list[str], env: dict[str, str], arch: Arch | None,
                labels: dict[str, str], limits: RunLimits, with_out: bool = False, background: bool = False):
        options = container_options(arch, {**LABELS, SESSION_LABEL: SESSION, **labels}, limits, with_out)
        if background:
            options["cpu_shares"] = 2  # Docker's least; cgroup v2's cpu.weight 1
        try:
            with _CREATE_GATE:
                if _STOPPING.is_set():
                    raise EngineError("the lab is stopping (interrupted): no new container is started")
                return self.client.containers.create(
                    image, command=command, environment={"HOME": RUN_HOME, **env}, **options)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not create a container from {image}: {_short(exc)}") from None

    def _attach(self, container) -> Iterator[tuple[bytes | None, bytes | None]]:
        """stdout and stderr, demultiplexed, from before the start (nothing is missed)."""
        try:
            return self.stream_client.api.attach(container.id, stdout=True, stderr=True, stream=True,
                                                 logs=False, demux=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not attach to the run's container: {_short(exc)}") from None

    def _copy_out(self, container, out_dir: Path, limits: RunLimits, reserved: Collection[str]) -> OutputCopy:
        """What the stopped container left in /out, through the engine's archive API (never a
        path on the host that the container could change)."""
        try:
            stream, _ = container.get_archive(OUT_IN_CONTAINER + "/.")
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            out_dir.mkdir(parents=True, exist_ok=True)
            return OutputCopy(folder=out_dir.name, files=0, bytes=0,
                              stopped=f"the engine gave no archive of /out: {_short(exc)}")
        try:
            return extract_outputs(_chunks(stream), out_dir, max_total_bytes=limits.output_bytes,
                                   max_files=limits.output_files, reserved=reserved)
        finally:
            with contextlib.suppress(Exception):
                stream.close()

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
                return _exit_code_after_kill(container), False, STOPPED_EMULATOR
            try:
                result = container.wait(timeout=min(_POLL_S, left))
                return int(result.get("StatusCode", -1)), False, None
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as exc:
                if isinstance(exc, requests.exceptions.ConnectionError) and not self.alive():
                    raise EngineError(f"the Docker engine {self.name} stopped answering while the "
                                      f"container ran ({_short(exc)}).") from None
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

    def image_tags(self, pattern: str) -> list[str]:
        """The tags of local images whose reference matches `pattern` (the engine's `reference`
        filter: `*` within a name part), sorted."""
        try:
            images = self.client.images.list(filters={"reference": pattern})
        except docker.errors.APIError:
            return []
        return sorted(t for image in images for t in image.tags)

    def managed_images(self) -> list[ImageUsage]:
        """Every image the lab made (its label, or a layer anchor's repository), with its sizes and
        the containers of any origin that use it. Sizes come from the engine's disk usage report:
        `unique` is what removing the image alone would free, `shared` what it shares with others."""
        try:
            report = self.client.api.df()
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise EngineError(f"the engine did not report its disk usage: {_short(exc)}") from None
        in_use: dict[str, list[str]] = {}
        for c in report.get("Containers") or []:
            in_use.setdefault(c.get("ImageID") or "", []).append(
                f"{(c.get('Names') or ['?'])[0].lstrip('/')} ({c.get('State') or 'unknown'})")
        found = []
        for img in report.get("Images") or []:
            labels = img.get("Labels") or {}
            tags = tuple(t for t in (img.get("RepoTags") or []) if t != "<none>:<none>")
            anchor = any(t.startswith(LAYERS_REPO + ":") for t in tags)
            if labels.get(LABEL) != "true" and not anchor:
                continue
            size = int(img.get("Size") or 0)
            shared = max(int(img.get("SharedSize") or 0), 0)
            found.append(ImageUsage(
                image_id=img["Id"], tags=tags, size=size, shared=shared, unique=max(size - shared, 0),
                created=float(img.get("Created") or 0), anchor=anchor,
                containers=tuple(in_use.get(img["Id"], ()))))
        return found

    def remove_unused_image(self, image: ImageUsage) -> bool:
        """Remove one image the lab made, tag by tag, never by force: the engine refuses while a
        container uses it. False when the engine refused or it was gone."""
        refs = list(image.tags) or [image.image_id]
        removed = False
        for ref in refs:
            try:
                self.client.images.remove(ref, noprune=False)
                removed = True
            except docker.errors.ImageNotFound:
                continue
            except docker.errors.APIError:
                return False
        return removed

    def remove_session_containers(self) -> int:
        """Remove (by force) every container this process started on this engine; how many. From
        then on this process starts no container on any engine (Ctrl-C ends it)."""
        removed = 0
        with _CREATE_GATE:
            _STOPPING.set()
        with contextlib.suppress(Exception):
            for c in self.client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={SESSION}"}):
                with contextlib.suppress(Exception):
                    c.remove(force=True, v=True)
                    removed += 1
        return removed

    def managed_containers(self) -> list[str]:
        return [c.name for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}=true"})]


def container_options(arch: Arch | None, labels: dict[str, str], limits: RunLimits, with_out: bool) -> dict:
    """The confinement of every container the lab starts (see `Engine.run`)."""
    options: dict = dict(
        labels=labels, detach=True, user=RUN_USER, read_only=True,
        # exec: Inductor dlopens the kernels it compiles under /tmp/torchinductor_<user>.
        tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={limits.tmp_bytes}"},
        network_mode="bridge" if limits.network else "none",
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
        ulimits=[Ulimit(name="core", soft=0, hard=0)],
        log_config=LogConfig(type=LogConfig.types.JSON, config=dict(ENGINE_LOG)))
    if arch is not None:
        options["platform"] = arch.platform
    if with_out:
        # An anonymous volume: it starts with the image's /out (owned by the run user) and is
        # removed with the container. Its content is read back with get_archive, never mounted.
        options["mounts"] = [Mount(target=OUT_IN_CONTAINER, source=None, type="volume", labels=dict(LABELS))]
    if limits.memory_bytes:
        options.update(mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes)
    if limits.pids:
        options["pids_limit"] = limits.pids
    if limits.cpus:
        options["nano_cpus"] = int(limits.cpus * 1e9)
    if limits.gpus:
        options["device_requests"] = [gpu_request()]
    return options


def gpu_request() -> DeviceRequest:
    """A device request for all the engine's GPUs, as `docker run --gpus all`. An engine without the
    NVIDIA container toolkit refuses it when the container starts: `could not select device driver`."""
    return DeviceRequest(count=-1, capabilities=[["gpu"]])


class _StreamReader(threading.Thread):
    """Reads an attached container's stdout and stderr into two capped files, as they come."""

    def __init__(self, stream, stdout: Path, stderr: Path, cap: int) -> None:
        super().__init__(daemon=True, name="lab-streams")
        self.stream = stream
        self.out = _Capture("stdout", stdout, cap)
        self.err = _Capture("stderr", stderr, cap)
        self.note: str | None = None

    def run(self) -> None:
        try:
            for out, err in self.stream:
                if out:
                    self.out.feed(out)
                if err:
                    self.err.feed(err)
        except Exception as exc:  # the connection broke: keep what came, and say so
            self.note = f"reading it stopped early: {_short(exc)}"

    def finish(self, wait_s: float) -> tuple[StreamCapture, StreamCapture]:
        """Wait for the streams to end (at most `wait_s`), then close both files."""
        if self.is_alive():
            self.join(wait_s)
        note = self.note
        if self.is_alive():
            note = f"the stream was still open {wait_s:.0f} s after the container ended; what came is kept"
            self.close()
            self.join(5)
        return self.out.finish(note), self.err.finish(note)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.close()


class _OutWatch(threading.Thread):
    """Best effort against a script filling the engine's disk through /out: every few seconds,
    `du` in the container (an exec: no host path is touched); past the cap, the container is
    killed. A script can evade it (it shares the user that runs `du`, and a full pids limit
    stops the exec), so the copy after the run has its own cap as well."""

    def __init__(self, container, cap: int) -> None:
        super().__init__(daemon=True, name="lab-out-watch")
        self.container, self.cap = container, cap
        self.over: int | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(_OUT_CHECK_S):
            used = _du(self.container)
            if used is not None and used > self.cap:
                self.over = used
                _kill(self.container)
                return

    def stop(self) -> None:
        self._stop.set()


# The check's own environment: an exec inherits the container's, where LD_DEBUG would make `du`
# write a loader log into /out/ld (false evidence), and the scenario's env could preload anything.
_DU_ENV = {"LD_DEBUG": "", "LD_DEBUG_OUTPUT": "", "LD_PRELOAD": "", "LD_LIBRARY_PATH": "", "PATH": "/usr/bin:/bin"}


def _du(container) -> int | None:
    """Bytes allocated under /out (what `du` could read), or None when the check could not run."""
    try:
        _, output = container.exec_run(["du", "-sk", OUT_IN_CONTAINER], stderr=False, user=RUN_USER,
                                       environment=_DU_ENV)
        last = output.decode("ascii", "replace").strip().splitlines()[-1]
        return int(last.split()[0]) * 1024
    except (docker.errors.APIError, requests.exceptions.RequestException, ValueError, IndexError):
        return None


def _read_capped(chunks, cap: int) -> bytes:
    buf = bytearray()
    try:
        for chunk in chunks:
            buf += chunk
            if len(buf) >= cap:
                del buf[cap:]
                break
    finally:
        with contextlib.suppress(Exception):
            chunks.close()
    return bytes(buf)


def _chunks(stream) -> Iterator[bytes]:
    """The archive stream, with the engine's errors turned into OSError (extract_outputs notes it)."""
    try:
        yield from stream
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        raise OSError(f"the engine's archive stream broke: {_short(exc)}") from None


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


def _start(container) -> None:
    try:
        container.start()
    except docker.errors.APIError as exc:
        raise EngineError(f"the engine could not start the container: {_short(exc)}") from None


def _kill(container) -> None:
    with contextlib.suppress(docker.errors.APIError):
        container.kill()


def _remove(container) -> None:
    """Remove the container and its anonymous volumes (/out)."""
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError:
        time.sleep(1)
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True, v=True)


def _stacked_tar(attrs: dict, arch: Arch, tag: str, created_by: str, layer: tuple[str, int],
                 write_layer: Callable[[BinaryIO], object], out: BinaryIO) -> None:
    """The image load's tar for `Engine.stack_layer`: an empty placeholder for each of the parent's
    layers, the manifest, the config (the parent's, with the new layer's digest added), and the
    layer itself, which `write_layer` writes straight into the stream. A layer that turns out
    longer or shorter than its size breaks the tar, so the load fails rather than take it."""
    digest, size = layer
    parents = list(attrs.get("RootFS", {}).get("Layers") or [])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the cache's last use falls back on it
    config = json.dumps({
        "architecture": attrs.get("Architecture") or arch.value, "os": attrs.get("Os") or "linux",
        **({"variant": attrs["Variant"]} if attrs.get("Variant") else {}),
        "created": now, "config": attrs.get("Config") or {},
        "rootfs": {"type": "layers", "diff_ids": [*parents, f"sha256:{digest}"]},
        "history": [{"created": now, "created_by": created_by}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [f"parent{i}/layer.tar" for i in range(len(parents))] + ["stacked/layer.tar"]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode()
    for name, data in [(n, b"") for n in names[:-1]] + [("manifest.json", manifest), (config_name, config)]:
        _tar_member(out, name, len(data), lambda o, data=data: o.write(data))

    def write_counted(o: BinaryIO) -> None:
        counted = CountingWriter(o)  # the engine checks the digest itself
        write_layer(counted)
        if counted.size != size:
            raise OSError(f"the layer is {counted.size} bytes, not the {size} counted before")

    _tar_member(out, names[-1], size, write_counted)
    out.write(b"\0" * 1024)  # the end of the archive


def _tar_member(out: BinaryIO, name: str, size: int, write_data: Callable[[BinaryIO], object]) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    out.write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
    write_data(out)
    out.write(b"\0" * (-size % tarfile.BLOCKSIZE))


class _TarStream:
    """A tar that `write_tar` writes in a thread, read in chunks as a request's body (chunked), so
    that the engine receives it while it is written, with no temp file. When writing fails, reading
    raises instead of ending, so the engine sees a broken upload, never a short tar."""

    def __init__(self, write_tar: Callable[[BinaryIO], object]) -> None:
        self.failure: BaseException | None = None
        self._read_fd, write_fd = os.pipe()

        def produce() -> None:
            try:
                with open(write_fd, "wb", buffering=1 << 20) as out:
                    write_tar(out)
            except BrokenPipeError:
                pass  # the request ended first: its own error says why
            except BaseException as exc:  # noqa: BLE001 - handed to the request's thread
                self.failure = exc

        self._writer = threading.Thread(target=produce, name="tar-stream", daemon=True)
        self._writer.start()
        self._reader = open(self._read_fd, "rb", buffering=0)  # noqa: SIM115 - closed by __exit__

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._reader.read(1 << 20):
            yield chunk
        self._writer.join()
        if self.failure is not None:
            raise OSError(f"the tar could not be written: {self.failure}")

    def why_broken(self, what: str, exc: BaseException) -> str:
        if self.failure is not None:
            return f"the tar to {what} could not be written: {self.failure}"
        return f"the engine could not {what}: {_short(exc)}"

    def __enter__(self) -> _TarStream:
        return self

    def __exit__(self, *exc) -> None:
        self._reader.close()  # a writer still writing gets a broken pipe and ends
        self._writer.join(timeout=_JOIN_S)


def _explanation(exc: docker.errors.APIError) -> str:
    """The engine's own words in an API error (without the HTTP status line), else its first line."""
    said = getattr(exc, "explanation", None)
    return said.strip()[:300] if isinstance(said, str) and said.strip() else _short(exc)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ----------------------------------------------------------------------------- Docker contexts

def docker_config_dir() -> Path:
    """The docker CLI's configuration folder: DOCKER_CONFIG, else ~/.docker."""
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def docker_context(name: str) -> tuple[str, object | None] | None:
    """(host URL, TLS config) of the Docker CLI context `name` (`docker context ls`), or None.

    Read from the CLI's context store (contexts/meta/<sha256 of the name>/meta.json and
    contexts/tls/<id>/docker/*.pem) as the docker CLI does: docker-py's own reader finds no store
    where the folder has no config.json, which `docker context create` does not write."""
    if name == "default":
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock", None
    import hashlib
    import json

    import docker.tls
    ident = hashlib.sha256(name.encode()).hexdigest()
    store = docker_config_dir() / "contexts"
    try:
        meta = json.loads((store / "meta" / ident / "meta.json").read_text())
        endpoint = meta["Endpoints"]["docker"]
        host = str(endpoint.get("Host") or "unix:///var/run/docker.sock")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    tls_dir = store / "tls" / ident / "docker"
    pems = {p.stem: str(p) for p in tls_dir.glob("*.pem")} if tls_dir.is_dir() else {}
    if not pems:
        return host, None
    cert = (pems["cert"], pems["key"]) if "cert" in pems and "key" in pems else None
    verify = not endpoint.get("SkipTLSVerify", False)
    return host, docker.tls.TLSConfig(client_cert=cert, ca_cert=pems.get("ca"), verify=verify)


def current_context_name() -> str:
    """The Docker CLI's current context (config.json `currentContext`), `default` when none."""
    import json
    try:
        data = json.loads((docker_config_dir() / "config.json").read_text())
        return str(data.get("currentContext") or "default")
    except (OSError, ValueError, AttributeError):
        return "default"


def env_tls():
    """TLS settings from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, as the docker CLI reads them."""
    if not (os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_CERT_PATH")):
        return None
    from docker.utils import kwargs_from_env
    try:
        return kwargs_from_env().get("tls")
    except Exception:  # noqa: BLE001 - bad cert paths show up when connecting
        return None
