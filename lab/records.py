"""Data that moves between stages and has no better home: what the engine hands back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
