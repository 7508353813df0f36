"""bin/sweep: what the suite made goes, what was there before stays (the cache and pytest's folders;
the Docker half is the same diff over image ids, run by bin/test against the real engine)."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep(*args, env):
    proc = subprocess.run([sys.executable, str(ROOT / "bin" / "sweep"), *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_only_what_was_made_since_the_snapshot_goes(tmp_path):
    cache, temp = tmp_path / "cache", tmp_path / "tmp"
    env = {**os.environ, "LAB_CACHE_DIR": str(cache), "TMPDIR": str(temp),
           "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    old = [cache / "site" / "old-tree", cache / "uv" / "archive-v0" / "old",
           cache / "uv" / "wheels-v5" / "pypi" / "numpy"]
    for p in old:
        p.mkdir(parents=True)
        (p / "f").write_text("kept")
    pytest_dir = temp / f"pytest-of-{getpass.getuser()}"
    (pytest_dir / "pytest-1").mkdir(parents=True)
    sweep("snapshot", str(tmp_path / "state.json"), env=env)
    new = [cache / "site" / "new-tree", cache / "venv" / "new-venv", cache / "uv" / "archive-v0" / "new",
           cache / "uv" / "wheels-v5" / "pypi" / "torch", pytest_dir / "pytest-2"]
    for p in new:
        p.mkdir(parents=True)
        (p / "f").write_bytes(b"x" * 1000)
    out = sweep("restore", str(tmp_path / "state.json"), env=env)
    assert all(p.is_dir() and (p / "f").read_text() == "kept" for p in old)
    assert not any(p.exists() for p in new)
    assert (pytest_dir / "pytest-1").is_dir()
    assert out.startswith("[sweep] removed") and "0 images" in out


def test_a_cache_folder_that_was_not_there_goes_whole(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "LAB_CACHE_DIR": str(cache), "TMPDIR": str(tmp_path),
           "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    sweep("snapshot", str(tmp_path / "state.json"), env=env)
    (cache / "site" / "tree").mkdir(parents=True)
    sweep("restore", str(tmp_path / "state.json"), env=env)
    assert not cache.exists()
