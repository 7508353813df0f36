"""A Docker engine's containers: a run confined and timed out, its streams read live by a thread
and capped, /out watched while it runs and copied out through the archive API, short commands
(`output_of`), files read out of an image, and the GPU request."""

from __future__ import annotations

import contextlib
import io
import tarfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import docker
import docker.errors
import requests.exceptions
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from lab.core import cancel
from lab.core.arch import Arch
from lab.core.cache import entry_in_use
from lab.core.errors import EngineError
from lab.core.records import (
    EMULATOR_CRASH,
    STOPPED_EMULATOR,
    STOPPED_OUT_FULL,
    Events,
    MountedImage,
    OutputCopy,
    RawRun,
    RunLimits,
    StreamCapture,
    format_bytes,
)
from lab.core.safetar import extract_outputs
from lab.engine.docker_client import LABELS, SESSION, SESSION_LABEL, explanation, short
from lab.engine.streams import StreamFile as _Capture
from lab.image.layout import OUT, RUN_HOME, RUN_USER, VENV
from lab.image.sitemount import host_path, site_binds

# The user the script runs as (lab.image.layout): the image's `lab` user, made by the Dockerfile
# template (which also makes /out and its sub-folders, owned by it: Docker copies them into the new
# volume). Numeric, so that an image without that user (a bare base in `lab doctor`) runs too.
# Ctrl-C closes the gate: a worker thread that goes on (to collect_env, say) after its run's
# container was removed gets no new container. Creating holds the gate, so none is half made
# when the session's containers are listed for removal.
_CREATE_GATE = threading.Lock()
_SEEN_FOLDERS: dict[tuple[str, str], bool] = {}  # (engine, host folder) -> whether it can bind it
_STOPPING = threading.Event()
# The engine's own copy of the streams (json-file), bounded: the lab reads the streams live from
# an attach; this log serves the emulator-crash watcher, which reads its last lines.
ENGINE_LOG = {"max-size": "16m", "max-file": "2"}
READ_FILE_BYTES = 64 * 1024**2  # read_file reads at most this much of one file
OUTPUT_OF_BYTES = 16 * 1024**2  # output_of keeps at most this much output
_POLL_S = 2.0
_OUT_CHECK_S = 10.0  # how often the size of /out is checked while the script runs
_JOIN_S = 60.0       # how long the stream reader may take to drain after the container ends
# After QEMU's crash line (seen with aarch64 torch 2.13.0 and 2.15.0 under qemu-user 7.2) the
# crashed process can run on for 20+ minutes, so the lab stops the container itself.
_CRASH_GRACE_S = 5.0


class DockerContainers:
    """The container half of lab.engine.docker_engine.DockerEngine."""

    client: docker.DockerClient
    stream_client: docker.DockerClient
    name: str
    arch: Arch                      # (DockerEngine's properties and methods)
    alive: Callable[[], bool]

    def run(self, image: str | MountedImage, command: list[str], env: dict[str, str], out_dir: Path, logs_dir: Path,
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
        happens, Ctrl-C included. A `MountedImage` gets its cross-installed tree as read-only bind
        mounts at the venv's paths (lab.image.sitemount), and the tree's cache entry is marked in
        use (lab.core.cache.entry_in_use) until the container is gone.
        """
        limits = limits or RunLimits()
        logs_dir.mkdir(parents=True, exist_ok=True)
        with _site_in_use(image):
            return self._run(image, command, env, out_dir, logs_dir, arch, timeout, labels, events, limits, reserved)

    def _run(self, image: str | MountedImage, command: list[str], env: dict[str, str], out_dir: Path,
             logs_dir: Path, arch: Arch, timeout: float, labels: dict[str, str], events: Events,
             limits: RunLimits, reserved: Collection[str]) -> RawRun:
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

    def output_of(self, image: str | MountedImage, command: list[str], arch: Arch, timeout: float,
                  labels: dict[str, str], background: bool = False,
                  env: dict[str, str] | None = None, gpus: bool = False) -> tuple[int | None, str]:
        """Run a short command in `image`, confined like a run, with `env`, and return (exit code,
        combined output; at most OUTPUT_OF_BYTES of it).
        `background`: the lowest CPU weight (cpu_shares 2 against a run's 1024), for a command run
        beside the script: it gets the CPU the script leaves. `gpus`: with a device request for all
        the engine's GPUs (collect_env of a GPU scenario reports them)."""
        with _site_in_use(image):
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
                return False, explanation(exc)
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

    def read_file(self, image: str | MountedImage, path: str) -> bytes | None:
        """Read one regular file out of an image without starting a container (None when it is
        absent, not a regular file, or larger than READ_FILE_BYTES). A file of a mounted tree is
        read from the tree (the lab's cache entry, which no container can write)."""
        if isinstance(image, MountedImage):
            if path.startswith(VENV + "/"):
                found = host_path(image.site, image.python, path)
                if found is None or found.stat().st_size > READ_FILE_BYTES:
                    return None
                return found.read_bytes()
            image = image.tag
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

    def sees_host_folder(self, path: Path, image: str) -> bool:
        """Whether a bind mount of `path` is possible on this engine: a container made with it (never
        started) is accepted, once per folder and process. Where the lab runs in a container with the
        host's socket (compose.yaml), its cache is not on the engine's host, and the engine refuses."""
        seen = _SEEN_FOLDERS.get((self.name, str(path)))
        if seen is not None:
            return seen
        try:
            container = self.client.containers.create(
                image, ["true"], labels={**LABELS, SESSION_LABEL: SESSION}, network_mode="none",
                mounts=[Mount(target="/lab-check", source=str(path), type="bind", read_only=True)])
        except docker.errors.APIError:
            seen = False
        else:
            seen = True
            _remove(container)
        _SEEN_FOLDERS[(self.name, str(path))] = seen
        return seen

    def _create(self, image: str | MountedImage, command: list[str], env: dict[str, str], arch: Arch | None,
                labels: dict[str, str], limits: RunLimits, with_out: bool = False, background: bool = False):
        options = container_options(arch, {**LABELS, SESSION_LABEL: SESSION, **labels}, limits, with_out)
        if isinstance(image, MountedImage):
            options["mounts"] = [*options.get("mounts", []), *site_mounts(image)]
            image = image.tag
        if background:
            options["cpu_shares"] = 2  # Docker's least; cgroup v2's cpu.weight 1
        try:
            with _CREATE_GATE:
                if _STOPPING.is_set():
                    raise EngineError("the lab is stopping (interrupted): no new container is started")
                return self.client.containers.create(
                    image, command=command, environment={"HOME": RUN_HOME, **env}, **options)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not create a container from {image}: {short(exc)}") from None

    def _attach(self, container) -> Iterator[tuple[bytes | None, bytes | None]]:
        """stdout and stderr, demultiplexed, from before the start (nothing is missed)."""
        try:
            return self.stream_client.api.attach(container.id, stdout=True, stderr=True, stream=True,
                                                 logs=False, demux=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not attach to the run's container: {short(exc)}") from None

    def _copy_out(self, container, out_dir: Path, limits: RunLimits, reserved: Collection[str]) -> OutputCopy:
        """What the stopped container left in /out, through the engine's archive API (never a
        path on the host that the container could change)."""
        try:
            stream, _ = container.get_archive(OUT + "/.")
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            out_dir.mkdir(parents=True, exist_ok=True)
            return OutputCopy(folder=out_dir.name, files=0, bytes=0,
                              stopped=f"the engine gave no archive of /out: {short(exc)}")
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
            if cancel.requested():  # an eager bisection no longer needs this probe's answer
                events("run", "no longer needed: stopping the container")
                _kill(container)
                raise cancel.Cancelled()
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
                                      f"container ran ({short(exc)}).") from None
                events("run", f"{time.monotonic() - started:.0f} s")
            if watch_crash and crashed_at is None and _emulator_crashed(container):
                crashed_at = time.monotonic()

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


def container_options(arch: Arch | None, labels: dict[str, str], limits: RunLimits, with_out: bool) -> dict:
    """The confinement of every container the lab starts (see `DockerContainers.run`)."""
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
        options["mounts"] = [Mount(target=OUT, source=None, type="volume", labels=dict(LABELS))]
    if limits.memory_bytes:
        options.update(mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes)
    if limits.pids:
        options["pids_limit"] = limits.pids
    if limits.cpus:
        options["nano_cpus"] = int(limits.cpus * 1e9)
    if limits.gpus:
        options["device_requests"] = [gpu_request()]
    return options


def site_mounts(image: MountedImage) -> list[Mount]:
    """The tree's read-only bind mounts (lab.image.sitemount.site_binds): its entries only, each at
    its path in the venv; never a link (refused when the plan was made, and checked again here)."""
    try:
        binds = site_binds(image.site, image.python)
    except (ValueError, OSError) as exc:
        raise EngineError(f"the cross-installed tree {image.site} cannot be mounted: {exc}") from None
    return [Mount(target=b.target, source=str(b.source), type="bind", read_only=True) for b in binds]


@contextlib.contextmanager
def _site_in_use(image: object) -> Iterator[None]:
    """While a container sees a mounted tree, its cache entry is not evicted nor made again."""
    if not isinstance(image, MountedImage):
        yield
        return
    with entry_in_use(image.site):
        if not image.site.is_dir():
            raise EngineError(f"the cross-installed tree {image.site} is gone (removed from the cache); "
                              "run the case again to make it")
        yield


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
            self.note = f"reading it stopped early: {short(exc)}"

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
        _, output = container.exec_run(["du", "-sk", OUT], stderr=False, user=RUN_USER,
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
        raise OSError(f"the engine's archive stream broke: {short(exc)}") from None


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
        raise EngineError(f"the engine could not start the container: {short(exc)}") from None


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
