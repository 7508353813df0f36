"""Under the cap's pressure the lab runs uv's own `cache prune` first (real uv, no network): what no
install refers to goes, and every wheel a later install uses stays."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

from lab.cache_policy.inventory import prune, prune_uv, take_inventory
from lab.image.crossinstall import uv_binary


def _wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, made here (the network is not needed)."""
    files = {"tinypkg/__init__.py": b"X = 1\n", "tinypkg-1.0.dist-info/METADATA":
             b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n", "tinypkg-1.0.dist-info/WHEEL":
             b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for n, d in files.items()]
    files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join([*record, "tinypkg-1.0.dist-info/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True)
    path = folder / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def _install(cache: Path, wheels: Path, target: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([uv_binary(), "pip", "install", "--cache-dir", str(cache), "--target", str(target),
                           "--no-index", "--find-links", str(wheels), *extra, "tinypkg"],
                          capture_output=True, text=True)


def _orphan(cache: Path, size: int) -> Path:
    """An unpacked archive nothing refers to any more, as uv leaves behind at a re-download."""
    orphan = cache / "archive-v0" / "OrphanedByAnEarlierDownload"
    orphan.mkdir(parents=True)
    (orphan / "libbig.so").write_bytes(b"\x7fELF" + bytes(size))
    return orphan


def test_over_the_cap_uv_prunes_the_unreferenced_and_nothing_else_goes(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    wheels, uv_cache = tmp_path / "wheels", root / "uv"
    _wheel(wheels)
    assert _install(uv_cache, wheels, tmp_path / "t1").returncode == 0
    orphan = _orphan(uv_cache, 8 * 1024**2)
    before = take_inventory().total
    monkeypatch.setenv("LAB_CACHE_CAP", str(before - 4 * 1024**2))  # over the cap by half the orphan
    pruned = prune()
    assert not orphan.exists()
    assert any("uv cache prune removed 1 file" in n and "no install refers to" in n for n in pruned.notes)
    assert pruned.removed == ()  # under the cap once uv pruned: the uv cache itself stays
    # what stays still serves an install with no index and no network
    again = _install(uv_cache, wheels, tmp_path / "t2", "--offline")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "t2" / "tinypkg" / "__init__.py").read_bytes() == b"X = 1\n"


def test_under_the_cap_uv_is_not_asked_and_an_absent_cache_is_nothing(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    orphan = _orphan(root / "uv", 1024)
    monkeypatch.setenv("LAB_CACHE_CAP", "10GiB")
    assert not [n for n in prune().notes if "uv" in n] and orphan.exists()
    assert prune_uv(tmp_path / "nowhere") is None
