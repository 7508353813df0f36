"""A container CPU architecture, named as Docker names it (amd64, arm64), with its aliases."""

from __future__ import annotations

from enum import Enum

__all__ = ["EMULATED_ENV", "Arch", "with_emulated_env"]

# Under QEMU user mode, a fork of the multi-threaded Python can deadlock in the child: torch 2.3.1
# forks Inductor's compile workers (a ProcessPoolExecutor) as soon as Dynamo imports Inductor, even with
# the eager backend, and at exit Python then waits for a worker that never started (seen with
# vmap-inside-compile on torch 2.3.1 arm64, two emulated runs at once: the run hung until its timeout).
# Emulated runs therefore compile in one process unless the scenario's env says otherwise; under
# emulation the worker pool only costs time anyway.
# torch's aarch64 wheels bundle OpenBLAS, whose thread pool (OMP_NUM_THREADS threads, or one per CPU)
# starts at `import torch`. Under QEMU user mode its idle threads never go to sleep: measured on
# torch 2.5.1 (OpenBLAS 0.3.25) with OMP_NUM_THREADS=2, one thread holds a whole core for as long as
# the process lives, while the script sleeps, and the same with OPENBLAS_THREAD_TIMEOUT=4,
# OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0; on two cores, the script, g++ and collect_env then
# share the other one. Emulated runs therefore use one OpenBLAS thread unless the scenario's env
# says otherwise (torch's own OpenMP threads are not touched).
EMULATED_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def with_emulated_env(env: dict[str, str], emulated: bool) -> dict[str, str]:
    """`env` with EMULATED_ENV's defaults under it when the run is emulated (`env`'s own values win)."""
    return {**EMULATED_ENV, **env} if emulated else env

_ARCH_ALIASES = {"x86_64": "amd64", "x86-64": "amd64", "x64": "amd64", "aarch64": "arm64", "arm64v8": "arm64"}


class Arch(str, Enum):
    """A container CPU architecture, named as Docker names it."""

    AMD64 = "amd64"
    ARM64 = "arm64"

    def __str__(self) -> str:
        return self.value

    @property
    def platform(self) -> str:
        """The Docker platform string, e.g. `linux/arm64`."""
        return f"linux/{self.value}"

    @property
    def uname(self) -> str:
        """What `uname -m` prints inside such a container."""
        return "x86_64" if self is Arch.AMD64 else "aarch64"

    @classmethod
    def parse(cls, value: str | Arch) -> Arch:
        """Parse `amd64`/`arm64` or an alias (`x86_64`, `aarch64`, `linux/arm64`); ValueError if unknown."""
        if isinstance(value, Arch):
            return value
        key = str(value).strip().lower().removeprefix("linux/")
        try:
            return cls(_ARCH_ALIASES.get(key, key))
        except ValueError:
            raise ValueError(
                f"unknown architecture {repr(value)[:60]}; use amd64 or arm64 (aliases: x86_64, aarch64)"
            ) from None
