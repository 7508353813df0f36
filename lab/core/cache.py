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

from pathlib import Path

from lab.core.config import current


def cache_root() -> Path:
    return current().cache_dir


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
