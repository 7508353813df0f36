"""Which run folders the lab made for the user: a marker written when the folder is made.

`lab runs --gc` deletes folders, so it must know which ones are the user's own runs. A result.json
says nothing about that: a replay unpacks a stranger's bundle (its result.json, with any case
and any `started` date) under `<run>/replayed/`, and a user may unpack a bundle by hand anywhere.
So the lab writes `.lab-run` into each run folder as it makes it (`mark_run`): the time the lab
saw the folder made, and an HMAC of that time and the folder's path relative to the runs root,
keyed by a random key kept in `<runs root>/.lab-key` (mode 0600, made on first use). A stranger's
bundle cannot carry a marker that checks out (it does not know the key, and its folder is not
where the marker's path says), and a marker copied from another folder does not check out either.

`created_ns` of a marker that checks out is what gc orders by and compares ages with: a date the
lab itself observed, never the `started` written inside a result.json.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

MARKER = ".lab-run"
KEY_NAME = ".lab-key"
_KEY_BYTES = 32
_MAX_MARKER_BYTES = 4096


def _rel(root: Path, run_dir: Path) -> str:
    run_dir = Path(run_dir).resolve()
    try:
        return run_dir.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return run_dir.as_posix()


def _read_key(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            key = fh.read(_KEY_BYTES + 1)
    except OSError:
        return None
    return key if len(key) == _KEY_BYTES else None


def runs_key(root: Path, *, create: bool) -> bytes | None:
    """The runs root's marker key; made (atomically, never replacing one) when `create`."""
    path = Path(root) / KEY_NAME
    key = _read_key(path)
    if key is not None or not create:
        return key
    Path(root).mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{KEY_NAME}.", dir=root)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(_KEY_BYTES))
        os.chmod(tmp, 0o600)
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs holds
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _mac(key: bytes, rel: str, created_ns: int) -> str:
    return hmac.new(key, f"{rel}\0{created_ns}".encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def mark_run(root: Path, run_dir: Path, created_ns: int | None = None) -> str | None:
    """Mark `run_dir` (under the runs root `root`) as a run folder the lab made now; an existing
    marker is left as it is (a folder is made once). A failure is a note (returned), never a lost
    run: the folder then stays out of `lab runs --gc`. `created_ns` is for tests."""
    path = Path(run_dir) / MARKER
    if path.exists() or path.is_symlink():
        return None
    try:
        key = runs_key(root, create=True)
        if key is None:
            raise OSError(f"its key {Path(root) / KEY_NAME} cannot be read")
        created_ns = time.time_ns() if created_ns is None else created_ns
        data = {"lab": "torch-repro-lab run folder", "created_ns": created_ns,
                "mac": _mac(key, _rel(root, run_dir), created_ns)}
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(json.dumps(data) + "\n")
    except FileExistsError:
        return None
    except OSError as exc:
        return f"{run_dir} was not marked as the lab's (so `lab runs --gc` will leave it): {exc}"
    return None


def marked_since(root: Path, run_dir: Path, key: bytes | None) -> int | None:
    """When the lab made `run_dir` (ns since the epoch) if its marker checks out, else None."""
    path = Path(run_dir) / MARKER
    if key is None or path.is_symlink():
        return None
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(_MAX_MARKER_BYTES))
        created_ns, mac = data["created_ns"], data["mac"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(created_ns, int) or isinstance(created_ns, bool) or not isinstance(mac, str):
        return None
    return created_ns if hmac.compare_digest(mac, _mac(key, _rel(root, run_dir), created_ns)) else None
