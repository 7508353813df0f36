"""The Docker engine: lab.engine.protocol.Engine on a Docker engine (local socket, TCP, ssh://).

Its parts live beside it, one concern each: connecting and the Docker CLI's context store
(`docker_client`), images and the docker-save archives the lab writes (`docker_images`), containers
and the threads that read their streams (`docker_containers`), and housekeeping (`docker_housekeeping`).
This module composes them and adds what the protocol asks of a whole engine: the facts, the
refusals before a build, and making a case's image (lab.image.builder).

Every container and image the lab creates carries the label `org.torch-repro-lab.managed=true`,
and every container is removed when its run ends (with its anonymous /out volume): on success, on
error, on timeout and on Ctrl-C. The engine package is the only one that imports `docker`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import docker

from lab.core.arch import Arch
from lab.core.background import beside, timed
from lab.core.errors import EngineError
from lab.core.records import BuiltImage, Events, RunLimits, no_events
from lab.core.results import LocalRef
from lab.engine import gpu
from lab.engine.docker_client import client_on_this_host, current_address, open_clients
from lab.engine.docker_containers import DockerContainers
from lab.engine.docker_housekeeping import DockerHousekeeping
from lab.engine.docker_images import DockerImages
from lab.engine.protocol import Pending, nothing_pending
from lab.image.base import ensure_base
from lab.image.builder import build_image
from lab.image.hostpip import HostPip
from lab.image.render import BuildPlan, system_packages
from lab.image.resolve import Case


class DockerEngine(DockerImages, DockerContainers, DockerHousekeeping):
    """One Docker engine, through the docker SDK: lab.engine.protocol.Engine."""

    kind = "docker"

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
    def connect(cls, answer_within: float = 20) -> DockerEngine:
        """Connect the way the docker CLI does: DOCKER_HOST, else DOCKER_CONTEXT, else the current
        Docker context (the local socket by default)."""
        name, url, tls, problem = current_address()
        if problem or not url:
            raise EngineError(f"engine {name}: {problem or 'no address'}.")
        return cls.connect_url(url, name=name, tls=tls, answer_within=answer_within)

    @classmethod
    def connect_url(cls, url: str, *, name: str, tls=None, timeout: float = 300,
                    answer_within: float = 20) -> DockerEngine:
        """Connect to one engine address (unix://, tcp:// with `tls`, ssh:// through paramiko). An
        engine that does not answer within `answer_within` seconds is unreachable; requests of a
        connected engine may take `timeout`."""
        client, stream_client = open_clients(url, name=name, tls=tls, timeout=timeout, answer_within=answer_within)
        return cls(client, stream_client, name=name, url=url)

    def alive(self) -> bool:
        """Whether the engine still answers (after a failure: was it the engine, or the case?)."""
        try:
            return bool(self.client.ping())
        except Exception:  # noqa: BLE001 - any failure to answer means it is gone
            return False

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

    @property
    def gpu(self) -> bool:
        return self.has_gpu_runtime()

    @property
    def native_arches(self) -> frozenset[Arch]:
        return frozenset({self.arch})

    @property
    def emulates(self) -> bool:
        return True  # another arch runs under QEMU (binfmt on the engine's host); a missing one fails the run

    @property
    def confined(self) -> bool:
        return True  # every container: read-only root, no capabilities, no network, limits

    @property
    def unconfined_reason(self) -> str | None:
        return None

    @property
    def keeps_images(self) -> bool:
        return True

    @property
    def cross_installs(self) -> bool:
        return True

    @property
    def on_this_host(self) -> bool:
        """Whether the engine runs on this machine (its socket, or TCP to this host's loopback), so
        that its builds with the host's network reach a server the lab listens with on 127.0.0.1."""
        return client_on_this_host(self.client)

    def environment_python(self) -> str | None:
        return None  # the base image's Python

    def resume_args(self) -> tuple[str, ...]:
        return ()

    # --- one case ------------------------------------------------------------
    def run_elsewhere(self, case: Case, host: HostPip, runs_root: Path, events: Events = no_events,
                      **options: object) -> None:
        """None: this engine runs each step of the case here (see Engine.run_elsewhere)."""
        return None

    def check(self, case: Case, events: Events = no_events) -> str | None:
        """A GPU case: the engine answers a test container that requests all GPUs
        (lab.engine.gpu.check_case); the refusal is its own. Nothing else is refused ahead: another
        arch runs emulated, and the image brings the system packages."""
        gpu.check_case(case, self)
        return None

    def begin(self, case: Case, events: Events = no_events) -> Pending:
        """The base image (a bootstrap under QEMU takes minutes), made in a thread while uv works on
        the host; `prepare` finds it there."""
        answer = beside(partial(timed, ensure_base, self, case.scenario.base, case.arch, events,
                                system_packages(case)))
        return lambda: answer()[1]

    def prepare(self, case: Case, plan: BuildPlan, host: HostPip, run_dir: Path, events: Events = no_events,
                *, ready: Pending = nothing_pending) -> BuiltImage:
        """The case's image, built from `plan` unless its content-addressed tag is there."""
        base_s = ready()
        image = build_image(plan, self, host, events, run_dir / "build.log")
        return replace(image, base_seconds=image.base_seconds + base_s)

    def describe(self, image: BuiltImage, limits: RunLimits, system: str | None) -> LocalRef | None:
        return None  # the image (result.json's `image` and `base`) says where it ran

    def discard(self, tag: str) -> None:
        """Anchor the layers the next probe shares (system packages, venv), then untag the image."""
        self.anchor_shared_layers(tag)
        self.remove_image(tag)


# The name the lab used before the protocol: the Docker engine.
Engine = DockerEngine
