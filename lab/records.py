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
class BuiltImage:
    tag: str
    image_id: str
    base: BaseImage
    cached: bool            # True when the content-addressed tag already existed
    build_seconds: float


@dataclass(frozen=True, slots=True)
class RunLimits:
    """How a repro container is confined. The script comes from a bug report: it is untrusted."""

    memory_bytes: int | None = 8 * 1024**3   # RAM, with no swap on top
    pids: int | None = 4096
    cpus: float | None = None                # None: every core the engine has
    network: bool = False                    # False: network_mode="none"

    def describe(self) -> str:
        parts = [f"memory {format_bytes(self.memory_bytes)}" if self.memory_bytes else "memory unlimited",
                 f"pids {self.pids}" if self.pids else "pids unlimited",
                 f"cpus {self.cpus:g}" if self.cpus else "all cpus",
                 "network on" if self.network else "no network"]
        return ", ".join(parts)


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
