"""uv's cache under the cap, one unpacked wheel at a time (real uv, no network): the wheels the
current run installed from stay, an older run's go first, and uv fetches a removed wheel again.
Before, uv's cache was one entry that the enforcing run had just used, so it was never evicted and
grew past the cap over a series of runs (37 GB against a cap of about 18 GB in bench/from_issue)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from lab.cache_policy import inventory as inv
from lab.image.crossinstall import uv_binary

DAY = 86400


def _wheel(folder: Path, name: str, payload: int) -> None:
    """A pure-Python wheel made here, with `payload` bytes of data so that it weighs something."""
    files = {f"{name}/__init__.py": b"X = 1\n", f"{name}/data.bin": os.urandom(payload),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL":
             b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for n, d in files.items()]
    files[f"{name}-1.0.dist-info/RECORD"] = ("\n".join([*record, f"{name}-1.0.dist-info/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        for n, data in files.items():
            z.writestr(n, data)


def _venv_with(cache: Path, wheels: Path, venv: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    uv = uv_binary()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, capture_output=True)
    return subprocess.run([uv, "pip", "install", "--cache-dir", str(cache), "--python", str(venv / "bin" / "python"),
                           "--no-index", "--find-links", str(wheels), "--link-mode", "hardlink", *extra, name],
                          capture_output=True, text=True)


def _age(tree: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [tree, *tree.rglob("*")]:
        os.utime(p, (then, then), follow_symlinks=False)


def test_the_cap_evicts_an_older_runs_wheel_and_keeps_the_one_this_run_uses(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    wheels, uv_cache = tmp_path / "wheels", root / "uv"
    _wheel(wheels, "oldpkg", 6 * 1024**2)
    _wheel(wheels, "newpkg", 6 * 1024**2)
    # an earlier run: its venv is gone, its wheel stays in uv's cache
    assert _venv_with(uv_cache, wheels, tmp_path / "earlier", "oldpkg").returncode == 0
    subprocess.run(["rm", "-rf", str(tmp_path / "earlier")], check=True)
    for archive in (uv_cache).glob("archive-v*/*"):
        _age(archive, 3 * DAY)
    stock = inv.take_inventory()
    names = [e.name for e in stock.entries if e.part == "uv"]
    assert any(n.startswith("oldpkg-1.0 (archive-v") for n in names), names
    assert inv.UV_REST in names
    with inv.lease():  # this run: it installs newpkg, marks its wheel, then the cap is enforced
        venv = tmp_path / "this-run"
        assert _venv_with(uv_cache, wheels, venv, "newpkg").returncode == 0
        _age(venv, 0)
        for archive in uv_cache.glob("archive-v*/*"):
            _age(archive, 3 * DAY)  # as if uv had unpacked it long ago: only the mark says it is used
        time.sleep(1.1)  # past the lease's start (mtime resolution)
        assert inv.note_wheels_used(venv) == 1
        total = inv.take_inventory().total
        monkeypatch.setenv("LAB_CACHE_CAP", str(total - 3 * 1024**2))
        pruned = inv.prune()
    gone = [e.name for e in pruned.removed]
    assert len(gone) == 1 and gone[0].startswith("oldpkg-1.0"), gone
    left = [e for e in inv.take_inventory().entries if e.part == "uv"]
    assert any(e.name.startswith("newpkg-1.0") for e in left)
    assert not any(e.name.startswith("oldpkg-1.0") for e in left)
    # uv takes the removed wheel as a miss: offline it is not there any more, with its index it comes back
    again = _venv_with(uv_cache, wheels, tmp_path / "later", "oldpkg", "--offline")
    assert again.returncode == 0, again.stderr
    assert (next((tmp_path / "later").glob("lib/python*/site-packages/oldpkg/data.bin"))).stat().st_size == 6 * 1024**2


def test_wheels_are_matched_by_their_hard_linked_metadata_not_only_their_name(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    wheels, uv_cache = tmp_path / "wheels", root / "uv"
    _wheel(wheels, "pkg", 1024)
    venv = tmp_path / "v"
    assert _venv_with(uv_cache, wheels, venv, "pkg").returncode == 0
    # a second unpacked wheel of the same name and version (another platform's build, say)
    (real,) = uv_cache.glob("archive-v*/*")
    twin = real.parent / "AnotherBuildOfPkg"
    subprocess.run(["cp", "-r", str(real), str(twin)], check=True)
    for archive in (real, twin):
        _age(archive, DAY)
    assert inv.note_wheels_used(venv) == 1
    assert real.stat().st_mtime > time.time() - 60 and twin.stat().st_mtime < time.time() - DAY / 2
    assert inv.note_wheels_used(tmp_path / "nothing-here") == 0
