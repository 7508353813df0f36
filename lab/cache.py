"""Host-side cache folders (platformdirs), created on demand."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("LAB_CACHE_DIR") or platformdirs.user_cache_dir("torch-repro-lab"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
