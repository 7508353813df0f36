"""Host-side cache folders (the `cache_dir` setting: LAB_CACHE_DIR, lab.toml, or platformdirs'
user cache folder), created on demand.

    bases/   rootfs tarballs while a Debian base is bootstrapped (lab.base)
    index/   the release lists of torch read from the package index (lab.releases)
    uv/      uv's cache: each wheel downloaded once, for every build and bisect step (lab.crossinstall)
    site/    venv trees cross-installed for images, one per key, with their digests (lab.crossinstall);
             `<key>.inuse` is locked (shared) while a container has the tree mounted
    collect_env/  collect_env's answer per (engine, image) (lab.pipeline)
    leases/, stamps/, last-count.json   the cache cap's bookkeeping (lab.cache_policy.inventory)

Everything here can be deleted at any time; it is made again when needed. `lab cache info` shows
what each part holds, and `cache_cap` bounds it (lab.cache_policy).
"""

from __future__ import annotations

import fcntl
import os
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


# --- an entry a running container sees --------------------------------------------------------
# A cache entry mounted read-only into a container (a site tree on a local Docker engine) must not
# be removed or made again while the container runs. Each run holds a shared lock on
# `<entry>.inuse` for as long as its container exists; eviction and remaking take the exclusive
# lock without waiting, and leave the entry alone when they cannot get it.
IN_USE_SUFFIX = ".inuse"


def _in_use_file(entry: Path) -> Path:
    return entry.with_name(entry.name + IN_USE_SUFFIX)


@contextmanager
def entry_in_use(entry: Path) -> Iterator[None]:
    """Hold a shared lock on the entry's `.inuse` file (several runs may share one entry)."""
    fd = os.open(_in_use_file(entry), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def unless_in_use(entry: Path) -> Iterator[bool]:
    """Whether no run uses the entry now (True), holding the exclusive lock meanwhile, so that
    no run starts to use it until the block ends; False: a run uses it, leave it alone."""
    path = _in_use_file(entry)
    if not path.exists():
        yield True
        return
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def in_use_by_a_run(entry: Path) -> bool:
    """Whether a running container sees the entry (its `.inuse` lock is held)."""
    with unless_in_use(entry) as free:
        return not free
