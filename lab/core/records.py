"""Data that moves between stages and has no better home: what the engine hands back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# QEMU's last words when the emulator itself crashes (not the bug, and not its absence).
EMULATOR_CRASH = "qemu: uncaught target signal"

# Progress events: (stage, message). Stages: "base", "build", "run", "collect_env".
# Only the CLI shows them; the pipeline just emits.
Events = Callable[[str, str], None]


def no_events(stage: str, message: str) -> None:
    """An Events sink that drops everything (library use, tests)."""


@dataclass(frozen=True, slots=True)
class BaseImage:
    """The image a case's Dockerfile starts FROM, and where it came from."""

    requested: str          # the scenario's `base`, e.g. debian:bookworm
    ref: str                # what the build uses as BASE (a tag present on the engine)
    image_id: str
    origin: str             # "local" | "pulled" | "bootstrapped"
    recipe: str | None = None  # for bootstrapped bases: the exact command that made the rootfs


@dataclass(frozen=True, slots=True)
class LocalImage:
    """What the local engine runs a case in (lab.image.localenv makes it): the role an image plays."""

    python: str                         # the interpreter the script runs with
    binds: tuple[str, ...]              # host folders the sandbox binds read-only at their own paths
    path: tuple[str, ...]               # first entries of PATH (the venv's bin/)
    lab_dir: Path                       # holds repro/ (the script) and tools/ (the runner): the run folder
    freeze: str = ""                    # pip freeze of the environment
    env: tuple[tuple[str, str], ...] = ()  # VIRTUAL_ENV, when it is a venv
    gpu: bool = False                   # pass the NVIDIA device nodes through
    kind: str = "venv"                  # "venv" (made by uv, cached) | "current" (the interpreter there)
    python_version: str = ""            # 3.11.7
    where: str = ""                     # the venv's folder, or the interpreter's path


@dataclass(frozen=True, slots=True)
class MountedImage:
    """A Docker image whose venv packages are not in it: each container gets the host's
    cross-installed tree (`site`, a cache entry) read-only at their paths in the venv
    (lab.image.sitemount). What a local Docker engine runs in place of a tag."""

    tag: str
    site: Path                          # the cache entry (lab.image.crossinstall), mounted read-only
    python: str                         # "3.11": the venv's lib/pythonX.Y

    def __str__(self) -> str:
        return self.tag


@dataclass(frozen=True, slots=True)
class BuiltImage:
    tag: str
    image_id: str
    base: BaseImage
    cached: bool            # True when the content-addressed tag already existed
    build_seconds: float
    base_seconds: float = 0.0  # of which: making sure the base is there (bootstrap, when cold)
    local: LocalImage | None = None  # the local engine's environment (then `tag` names it)
    mounted: MountedImage | None = None  # the tree is mounted into each run, not in the image

    @property
    def recorded_base(self) -> BaseImage | None:
        """The base the run records (result.json's `base`): None for the local engine's environment."""
        return self.base if self.local is None else None

    @property
    def ref(self) -> str | LocalImage | MountedImage:
        """What the engine runs: the tag, the image with its mounted tree, or the local engine's
        environment."""
        if self.local is not None:
            return self.local
        return self.mounted if self.mounted is not None else self.tag


# What the lab copies out of a run at most (scenario `limits: {output: ..., logs: ...}` changes
# the byte caps; the file cap and the size of /tmp are fixed here).
OUTPUT_BYTES = 1024**3          # /out, copied into the run folder after the run (and checked during it)
OUTPUT_FILES = 100_000          # entries of /out copied at most
STREAM_BYTES = 64 * 1024**2     # stdout and stderr, each: the first this many bytes are kept
STREAM_TAIL_BYTES = 1024**2     # ... and, past the cap, the last this many
TMP_BYTES = 8 * 1024**3         # the tmpfs at /tmp when memory is unlimited (else the memory limit)


@dataclass(frozen=True, slots=True)
class ImageUsage:
    """An image the lab made, as the engine's disk-usage report sees it (Engine.managed_images)."""

    image_id: str
    tags: tuple[str, ...]
    size: int               # every layer of the image
    shared: int             # bytes of its layers that other images use too
    unique: int             # what removing it alone frees
    created: float          # seconds since the epoch
    anchor: bool = False    # a layer anchor kept by bisect (Engine.anchor_shared_layers)
    containers: tuple[str, ...] = ()  # containers (of any origin, in any state) made from it


@dataclass(frozen=True, slots=True)
class RunLimits:
    """How a repro container is confined. The script comes from a bug report: it is untrusted."""

    memory_bytes: int | None = 8 * 1024**3   # RAM, with no swap on top
    pids: int | None = 4096
    cpus: float | None = None                # None: every core the engine has
    network: bool = False                    # False: network_mode="none"
    output_bytes: int = OUTPUT_BYTES         # /out: the most bytes copied into the run folder
    output_files: int = OUTPUT_FILES
    stream_bytes: int = STREAM_BYTES         # stdout and stderr, each
    gpus: bool = False                       # a device request for all the engine's GPUs (`--gpus all`)

    @property
    def tmp_bytes(self) -> int:
        """The size of the tmpfs at /tmp: its pages count against the memory limit anyway."""
        return self.memory_bytes or TMP_BYTES

    def describe(self) -> str:
        parts = [f"memory {format_bytes(self.memory_bytes)}" if self.memory_bytes else "memory unlimited",
                 f"pids {self.pids}" if self.pids else "pids unlimited",
                 f"cpus {self.cpus:g}" if self.cpus else "all cpus",
                 "network on" if self.network else "no network"]
        if self.gpus:
            parts.append("gpus: all")
        return ", ".join(parts)

    def describe_caps(self) -> str:
        """'/out copied up to 1 GiB and 100000 files, stdout and stderr kept up to 64 MiB each'."""
        return (f"/out copied up to {format_bytes(self.output_bytes)} and {self.output_files} files, "
                f"stdout and stderr kept up to {format_bytes(self.stream_bytes)} each")


def format_bytes(n: int | None) -> str:
    """8589934592 -> '8 GiB'; 536870912 -> '512 MiB'."""
    if n is None:
        return "unlimited"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True, slots=True)
class RawRun:
    """What one container run left behind, before any interpretation."""

    exit_code: int | None   # None when killed by the lab's timeout before it exited
    timed_out: bool
    oom_killed: bool
    duration_s: float
    stdout_path: Path
    stderr_path: Path
    loader_dir: Path        # LD_DEBUG_OUTPUT files, one per process
    emulated: bool
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    limits: RunLimits | None = None
    stopped_for: str | None = None  # why the lab stopped the container early (e.g. the emulator crashed)
    streams: tuple[StreamCapture, ...] = ()  # stdout and stderr: how much was written and kept
    outputs: OutputCopy | None = None       # what was copied out of /out, and what was not
    unit: str = "container"                 # what the lab stopped or killed: "container", or "sandbox" (local)

    def output_words(self) -> list[str]:
        """What the lab cut or refused while taking the outputs, in plain words."""
        lines = [words for s in self.streams if (words := s.plain_words())]
        return lines + (self.outputs.plain_words() if self.outputs is not None else [])


# Why the lab stopped a container early (RawRun.stopped_for).
STOPPED_EMULATOR = "emulator crash"
STOPPED_OUT_FULL = "/out over its cap"


@dataclass(frozen=True, slots=True)
class StreamCapture:
    """One captured stream: the first `cap` bytes are kept, and past it only the last few."""

    name: str               # "stdout" | "stderr"
    total_bytes: int        # what the container wrote to it (as far as the lab read it)
    kept_bytes: int         # bytes of the stream in the file (head, plus the tail past a cut)
    cap: int
    note: str | None = None  # something that went wrong while reading it

    @property
    def cut(self) -> bool:
        return self.total_bytes > self.kept_bytes

    def plain_words(self) -> str | None:
        if self.cut:
            return (f"{self.name} was cut at {format_bytes(self.cap)}: the script wrote "
                    f"{format_bytes(self.total_bytes)}; {self.name}.txt keeps the first "
                    f"{format_bytes(self.cap)} and the last {format_bytes(self.kept_bytes - self.cap)}, "
                    "with a marker line between")
        return f"{self.name}: {self.note}" if self.note else None

    def to_json(self) -> dict:
        return {"bytes": self.total_bytes, "kept": self.kept_bytes, "cap": self.cap, "cut": self.cut,
                "note": self.note}


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry of /out the lab did not copy: a link, fifo or device, an unsafe name, ..."""

    path: str
    kind: str               # "symbolic link", "hard link", "fifo", "device file", "unsafe name", ...
    detail: str = ""        # e.g. "to '/root/.ssh/authorized_keys'"

    def words(self) -> str:
        return f"`{self.path}` ({self.kind}{', ' + self.detail if self.detail else ''})"


@dataclass(frozen=True, slots=True)
class OutputCopy:
    """What came out of a container's /out into the run folder (lab.safetar.extract_outputs)."""

    folder: str             # the run folder's sub-folder it went to: "out" or "diagnose"
    files: int
    bytes: int
    skipped: tuple[Skipped, ...] = ()
    stopped: str | None = None  # why the copy stopped before the end of /out (a cap, an error)

    def plain_words(self, most: int = 10) -> list[str]:
        lines = []
        if self.skipped:
            shown = ", ".join(s.words() for s in self.skipped[:most])
            more = f" and {len(self.skipped) - most} more" if len(self.skipped) > most else ""
            lines.append(f"{self.folder}/: {len(self.skipped)} entr{'ies' if len(self.skipped) != 1 else 'y'} "
                         f"of /out not copied (the lab never creates links, fifos or devices): {shown}{more}")
        if self.stopped:
            lines.append(f"{self.folder}/: the copy of /out stopped early: {self.stopped}")
        return lines

    def to_json(self) -> dict:
        return {"folder": self.folder, "files": self.files, "bytes": self.bytes,
                "skipped": [{"path": s.path, "kind": s.kind, "detail": s.detail} for s in self.skipped],
                "stopped": self.stopped}
