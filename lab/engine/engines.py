"""Which Docker engines the lab can use, and what each one is.

The local engine (`local`: this host, no container, lab.engine.local_engine) is listed too, and
used when named (`--engine local`, or `local` in the `engines` setting).

An engine is otherwise Docker's own notion: a Docker context (`docker context create ...`) or a DOCKER_HOST
URL (`unix://`, `tcp://` with TLS, `ssh://`). The lab uses the current one (DOCKER_HOST, else
DOCKER_CONTEXT, else the CLI's current context) plus those named in the config file (`engines`)
and with `--engine`. Each is connected once and described by its facts (architecture, CPUs,
memory, GPU runtime, version, free disk); one that does not answer is listed with the reason and
skipped, never fatal.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from lab.core.arch import Arch
from lab.core.cache import cache_root
from lab.core.errors import EngineError
from lab.engine.docker_client import context_address, current_address, env_tls, socket_on_this_host
from lab.engine.docker_engine import DockerEngine
from lab.engine.local_engine import LOCAL, LocalEngine, LocalOptions, memory_bytes
from lab.engine.protocol import Engine
from lab.engine.slurm import PREFIX as SLURM_PREFIX
from lab.engine.slurm import SLURM, SlurmEngine, SlurmError, partition_names

GiB = 1024**3
# One probe or matrix cell (pip, Inductor's C++ compiler, QEMU) wants about two cores and 4 GiB.
CORES_PER_SLOT = 2
MEMORY_PER_SLOT = 4 * GiB
CONNECT_TIMEOUT_S = 20
BINFMT = Path("/proc/sys/fs/binfmt_misc")
SCHEMES = ("unix", "tcp", "ssh", "npipe", "http", "https")


@dataclass(frozen=True)
class EngineSpec:
    """One engine to try: its name (a context's, or the URL itself) and how to reach it."""

    name: str
    url: str | None
    source: str                       # "current", "config" or "--engine"
    tls: object | None = field(default=None, compare=False, repr=False)  # docker.tls.TLSConfig
    problem: str | None = None        # why it cannot even be tried (no such context)
    kind: str = "docker"              # "local": this host without containers
    options: object | None = field(default=None, compare=False, repr=False)  # LocalOptions of a local one


@dataclass(frozen=True)
class EngineFacts:
    """What `lab engines` shows for one engine; `reason` says why an unreachable one is skipped."""

    name: str
    url: str | None
    source: str
    reachable: bool
    reason: str | None = None
    arch: str | None = None           # amd64 or arm64 (the engine's native architecture)
    cpus: int | None = None
    memory: int | None = None         # bytes
    gpu: bool | None = None           # the NVIDIA container runtime is registered; for a GPU case the
                                      # Fleet replaces it with the engine's answer to a test container
    gpu_answer: str | None = None     # that answer, in the engine's words (lab.engine.gpu)
    version: str | None = None
    free_disk: int | None = None      # bytes free under the engine's data root, when this host can see it
    free_disk_note: str | None = None
    emulates: tuple[str, ...] | None = None  # arches it runs through QEMU; None: unknown (a remote engine)
    local: bool = False               # the engine's socket is on this host
    kind: str = "docker"              # "local": the local engine (no container)
    confinement: str | None = None    # the local engine: bubblewrap's version, or why it cannot confine
    nodes: int | None = None          # a Slurm partition: its nodes (cpus, memory and gpus are per node)
    gpus: int | None = None           # a Slurm partition: GPUs per node

    @property
    def slots(self) -> int:
        """How many cases this engine runs at once by default: one per two cores and 4 GiB."""
        if not self.reachable:
            return 0
        by_cpu = (self.cpus or 1) // CORES_PER_SLOT
        by_mem = (self.memory or MEMORY_PER_SLOT) // MEMORY_PER_SLOT
        return max(1, min(by_cpu, by_mem)) * (self.nodes or 1)

    def can_run(self, arch: str) -> str | None:
        """'native', 'emulated' (known to work), 'maybe' (a remote engine: unknown) or None."""
        if not self.reachable or self.arch is None:
            return None
        if arch == self.arch:
            return "native"
        if self.emulates is None:
            return "maybe"
        return "emulated" if arch in self.emulates else None

    def as_json(self) -> dict:
        return {"name": self.name, "url": self.url, "source": self.source, "reachable": self.reachable,
                "reason": self.reason, "arch": self.arch, "cpus": self.cpus, "memory": self.memory,
                "gpu": self.gpu, "version": self.version, "free_disk": self.free_disk,
                "free_disk_note": self.free_disk_note,
                "emulates": list(self.emulates) if self.emulates is not None else None,
                "local": self.local, "slots": self.slots, "kind": self.kind,
                "confinement": self.confinement, "nodes": self.nodes, "gpus": self.gpus}


# ----------------------------------------------------------------------------- which engines

def current_spec() -> EngineSpec:
    """The engine the docker CLI would use: DOCKER_HOST, else DOCKER_CONTEXT, else the current context."""
    name, url, tls, problem = current_address()
    return EngineSpec(name, url, "current", tls=tls, problem=problem)


def _from_context(name: str, source: str) -> EngineSpec:
    name, url, tls, problem = context_address(name)
    return EngineSpec(name, url, source, tls=tls, problem=problem)


def parse_spec(text: str, source: str) -> EngineSpec:
    """A `--engine`/config value: a DOCKER_HOST URL, or a Docker context name."""
    text = text.strip()
    if text == LOCAL or text == "local://":
        return EngineSpec(LOCAL, "local://", source, kind=LOCAL)
    if text.startswith(SLURM_PREFIX):
        if not text[len(SLURM_PREFIX):]:
            return EngineSpec(text, None, source, problem="name the partition: slurm:PARTITION (see `sinfo`)")
        return EngineSpec(text, text, source, kind=SLURM)
    if "://" in text:
        scheme = urlparse(text).scheme
        if scheme not in SCHEMES:
            return EngineSpec(text, None, source, problem=f"{scheme}:// is not a Docker engine address "
                                                          "(unix://, tcp://, ssh://)")
        return EngineSpec(text, text, source, tls=env_tls() if scheme == "tcp" else None)
    return _from_context(text, source)


def engine_specs(flags: Sequence[str] = (), configured: Sequence[str] = (), *,
                 include_current: bool = True) -> list[EngineSpec]:
    """The engines to consider, current first, each address once (the first name given wins)."""
    specs = [current_spec()] if include_current else []
    specs += [parse_spec(t, "config") for t in configured]
    specs += [parse_spec(t, "--engine") for t in flags]
    seen: set[str] = set()
    unique = []
    for s in specs:
        key = s.url or f"name:{s.name}"
        if key in seen:
            continue
        seen.add(key)
        unique.append(s)
    return unique


# ----------------------------------------------------------------------------- connecting and facts

def connect(spec: EngineSpec, answer_within: float = CONNECT_TIMEOUT_S) -> Engine:
    """An Engine for `spec`; EngineError (with the reason) when it does not answer."""
    if spec.kind == LOCAL:
        return LocalEngine(spec.options if isinstance(spec.options, LocalOptions) else None)
    if spec.kind == SLURM and not spec.problem:
        engine = SlurmEngine(spec.name[len(SLURM_PREFIX):],
                             spec.options if isinstance(spec.options, LocalOptions) else None)
        engine.facts()  # SlurmError (an EngineError) when Slurm or the partition does not answer
        return engine
    if spec.problem or not spec.url:
        raise EngineError(f"engine {spec.name}: {spec.problem or 'no address'}.")
    return DockerEngine.connect_url(spec.url, name=spec.name, tls=spec.tls, answer_within=answer_within)


def emulated_arches(native: str) -> tuple[str, ...]:
    """The arches this host runs through binfmt (QEMU user mode), besides its own."""
    names = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}
    found = []
    for arch, entry in names.items():
        if arch == native:
            continue
        try:
            if (BINFMT / entry).read_text().splitlines()[0].strip() == "enabled":
                found.append(arch)
        except (OSError, IndexError):
            continue
    return tuple(found)


def describe(spec: EngineSpec, engine: Engine | None = None) -> EngineFacts:
    """Connect (unless given the engine) and read the engine's facts; unreachable is a fact too."""
    base = dict(name=spec.name, url=spec.url, source=spec.source)
    if spec.problem:
        return EngineFacts(**base, reachable=False, reason=spec.problem)
    if spec.kind == SLURM:
        return describe_slurm(spec, engine if isinstance(engine, SlurmEngine) else None)
    if spec.kind == LOCAL:
        return describe_local(spec, engine if isinstance(engine, LocalEngine) else None)
    try:
        engine = engine or connect(spec)
        info = engine.info()
        arch = engine.arch.value
    except EngineError as exc:
        return EngineFacts(**base, reachable=False, reason=exc.message.rstrip("."))
    local = socket_on_this_host(spec.url)
    free, note = None, "not visible from this host (a remote engine)"
    if local:
        root = info.get("DockerRootDir") or "/var/lib/docker"
        try:
            free, note = shutil.disk_usage(root).free, None
        except OSError:
            note = f"{root} is not visible from this host"
    return EngineFacts(**base, reachable=True, arch=arch, cpus=int(info.get("NCPU") or 0) or None,
                       memory=int(info.get("MemTotal") or 0) or None, gpu=engine.has_gpu_runtime(),
                       version=engine.version, free_disk=free, free_disk_note=note,
                       emulates=emulated_arches(arch) if local else None, local=local)


def describe_local(spec: EngineSpec, engine: LocalEngine | None = None) -> EngineFacts:
    """The local engine's facts: this host's arch (and no other: it never emulates), CPUs, memory,
    NVIDIA devices, free disk under the cache folder, and its confinement."""
    engine = engine or LocalEngine(spec.options if isinstance(spec.options, LocalOptions) else None)
    try:
        arch = engine.arch.value
    except EngineError as exc:
        return EngineFacts(spec.name, spec.url, spec.source, reachable=False, reason=exc.message, kind=LOCAL)
    c = engine.confinement
    free, note = None, None
    try:
        root = cache_root()
        while not root.exists():
            root = root.parent
        free = shutil.disk_usage(root).free
    except OSError as exc:
        note = str(exc)
    return EngineFacts(spec.name, spec.url, spec.source, reachable=True, arch=arch, cpus=os.cpu_count(),
                       memory=memory_bytes(), gpu=engine.has_gpu_runtime(), version=engine.version,
                       free_disk=free, free_disk_note=note, emulates=(), local=True, kind=LOCAL,
                       confinement=(f"bubblewrap {c.version}" if c.confined else
                                    f"none ({c.problem}): runs only with --trust-script"))


def describe_slurm(spec: EngineSpec, engine: SlurmEngine | None = None) -> EngineFacts:
    """A Slurm partition's facts (lab.engine.slurm): its nodes' arch, CPUs, memory and GPUs per node.
    It emulates the other arch only when its nodes are declared to run Docker with QEMU
    (LAB_SLURM_NODE_ENGINE=docker); with the local engine, or `auto`, it runs its own arch only."""
    try:
        engine = engine or SlurmEngine(spec.name[len(SLURM_PREFIX):])
        p = engine.facts()
        arch = engine.arch.value
        version = engine.version
    except SlurmError as exc:
        return EngineFacts(spec.name, spec.url, spec.source, reachable=False, reason=exc.message.rstrip("."),
                           kind=SLURM)
    if not p.up:
        return EngineFacts(spec.name, spec.url, spec.source, reachable=False, kind=SLURM, arch=arch,
                           reason=f"partition {p.name} is {p.state} with no usable node "
                                  f"({', '.join(f'{n.name} {n.state}' for n in p.nodes) or 'no nodes'})")
    emulates = tuple(a for a in ("amd64", "arm64") if a not in p.arches) if engine.emulates else ()
    confinement = {"docker": "each task: the Docker engine on its node (container; QEMU for the other arch)",
                   "local": "each task: the local engine on its node (uv venv, bubblewrap)"}.get(
        engine.node_engine, "each task: the Docker engine on its node where one answers, else the local engine")
    return EngineFacts(spec.name, spec.url, spec.source, reachable=True, arch=arch, cpus=p.cpus, memory=p.memory,
                       gpu=p.gpus > 0, version=version, emulates=emulates, kind=SLURM, nodes=len(p.nodes),
                       gpus=p.gpus, confinement=confinement)


def slurm_specs(source: str = "slurm") -> list[EngineSpec]:
    """Every partition of a Slurm that answers here, as `slurm:PARTITION` (none without Slurm)."""
    return [EngineSpec(SLURM_PREFIX + name, SLURM_PREFIX + name, source, kind=SLURM) for name in partition_names()]


def survey(specs: Iterable[EngineSpec]) -> list[tuple[EngineFacts, Engine | None]]:
    """Connect to every engine at once (an unreachable one costs its timeout, not everyone's)."""
    specs = list(specs)

    def one(spec: EngineSpec) -> tuple[EngineFacts, Engine | None]:
        if spec.problem:
            return describe(spec), None
        try:
            engine = connect(spec)
        except EngineError as exc:
            return EngineFacts(spec.name, spec.url, spec.source, reachable=False,
                               reason=exc.message.rstrip(".")), None
        facts = describe(spec, engine)
        return facts, (engine if facts.reachable else None)

    if len(specs) <= 1:
        return [one(s) for s in specs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(specs))) as pool:
        return list(pool.map(one, specs))


def arch_of(facts: EngineFacts) -> Arch | None:
    return Arch(facts.arch) if facts.arch else None
