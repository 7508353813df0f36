"""Host-side cache folders (the `cache_dir` setting: LAB_CACHE_DIR, lab.toml, or platformdirs'
user cache folder), created on demand.

    bases/   rootfs tarballs while a Debian base is bootstrapped (lab.base)
    index/   the release lists of torch read from the package index (lab.releases)
    uv/      uv's cache: each wheel downloaded once, for every build and bisect step (lab.crossinstall)
    site/    venv trees cross-installed for images, one per key, with their digests (lab.crossinstall)
    collect_env/  collect_env's answer per (engine, image) (lab.pipeline)
    leases/, stamps/, last-count.json   the cache cap's bookkeeping (lab.cache_policy.inventory)

Everything here can be deleted at any time; it is made again when needed. `lab cache info` shows
what each part holds, and `cache_cap` bounds it (lab.cache_policy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from lab.core.config import current

ENTRY_LOCK_WAIT_S = 3 * 3600     # another process may be downloading 5 GB of CUDA wheels


def cache_root() -> Path:
    return current().cache_dir


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def entry_lock(lock_path: Path, waiting: Callable[[], None], error: type[Exception]) -> Iterator[None]:
    """Hold the file lock of one cache entry while it is made. When another lab process holds it,
    `waiting()` says so once, and the wait lasts up to ENTRY_LOCK_WAIT_S before `error` is raised."""
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        waiting()
        try:
            lock.acquire(timeout=ENTRY_LOCK_WAIT_S)
        except Timeout:
            raise error(f"{lock_path} is still held after {ENTRY_LOCK_WAIT_S} s") from None
    try:
        yield
    finally:
        lock.release()
