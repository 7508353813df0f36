"""Taking stock of the cache, removing entries, and enforcing the cap after runs and bisect probes.

What counts as "in use" (never removed, not even by `lab cache prune --all`):

- an image that any container (of any origin, running or stopped) was made from;
- what a lab run still in progress uses. Each run (one bisect probe is one run) holds a lease,
  `<cache_dir>/leases/<pid>-<start ns>.lease` (its mtime is the start), for as long as it runs, and
  marks what it uses when it uses it: the site tree (or venv) and the unpacked wheels in uv's cache
  it came from get their mtime touched (`note_use`, `note_wheels_used`), an image a stamp
  `<cache_dir>/stamps/<image id>`, and each is named in the lease file (one JSON line each). While the
  run is still making what it needs (its base, tree, image), its lease also covers anything used
  since it began, since what is being made is not named yet; once it has named everything its script
  runs on (`settle_lease`), it covers only what it names. So a long emulated script of one process no
  longer keeps every tree that another process's bisection used meanwhile. A lease whose process is
  gone is ignored and deleted. A bisection holds no lease of its own: a finished probe's tree, image
  and wheels are free to go before the next probe starts (a lease over the whole bisection kept every
  probe's 5-7 GB "in use" until it ended: 55 GiB against a cap of 18.8 GiB);
- what a process holds by name until it uses it or lets go (`hold`: a tree prepared for the next
  round), `<cache_dir>/leases/<pid>-<start ns>.hold`, a JSON list of paths and image ids;
- what the user pinned (`lab cache pin`), `<cache_dir>/pins.json`;
- a site tree whose `<key>.lock` is held (it is being made), or whose `<key>.inuse` is locked (a
  container on a Docker engine on this host has it mounted: lab.image.sitemount).


Sizes: files are counted once per inode, so a site tree hard-linked to uv's cache is not counted
twice; an entry's size is what removing it frees (an inode with links outside the entry stays). The
bytes no one entry frees alone (a site tree's or a local venv's files and the unpacked wheels in uv's
cache they were installed from, hard links to one inode: most of a CUDA tree's 5-7 GB) are counted
apart, as `linked`, so that the parts add up to the total.
Images: each image's unique size (what removing it frees), plus the layers they share counted once,
taken as the largest shared size among them (exact when the images share one stem, as a scenario's
images do over a base).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from lab.cache_policy.policy import DISK_MARGIN, LINKED, PARTS, Entry, choose, default_cap
from lab.core.cache import in_use_by_a_run, unless_in_use
from lab.core.config import current
from lab.core.errors import LabError
from lab.core.records import Events, ImageUsage, no_events
from lab.image.crossinstall import CrossInstallError, uv_binary

LEASES, STAMPS, LAST_COUNT, PINS = "leases", "stamps", "last-count.json", "pins.json"
_OWN = (LEASES, STAMPS, LAST_COUNT, PINS, "locks")    # the lab's bookkeeping: counted, never evicted
# The full count walks the cache folder (about 190,000 files, 3-8 s, for 11 GiB here): after a run it
# is made again only when the last one is older than this, or found the cache over this share of its cap,
# or when the disk has lost so much free space since that the cache may have grown past that share (one
# CUDA torch version adds 10-12 GB of wheels, site tree and image in a few minutes).
RECOUNT_S = 600.0
RECOUNT_SHARE = 0.75
_SLACK_S = 5.0                         # clock granularity between a lease's start and a use
BASE_REPO = "torch-repro-lab/debian"   # lab.image.base.BOOTSTRAP_REPO (a later layer)


@dataclass(frozen=True)
class Inventory:
    root: Path
    entries: tuple[Entry, ...]
    total: int                      # disk files counted once per inode, plus images
    cap: int
    cap_source: str                 # "cache_cap (<where>)" or how the default was reached
    free: int                       # free bytes on the cache folder's disk
    shared_image_bytes: int = 0     # layers the lab's images share, counted once
    notes: tuple[str, ...] = ()     # what could not be looked at (the engine did not answer, ...)
    margin: int = 0                 # the free disk a run must leave (`disk_margin`)
    engine: str | None = None       # the engine whose images are counted
    runs: tuple[tuple[str, int], ...] = ()  # (runs folder, bytes): shown, outside the cap
    linked_bytes: int = 0           # disk bytes linked from more than one entry: freed only when all go

    def part_sizes(self) -> dict[str, int]:
        """Each part's bytes (what removing all its entries frees, the images' shared layers with the
        images), and `linked`: what only removing entries of several parts together frees. They add up
        to `total`."""
        sizes = dict.fromkeys(PARTS, 0)
        for e in self.entries:
            sizes[e.part] += e.size
        sizes["images"] += self.shared_image_bytes
        sizes[LINKED] = self.linked_bytes
        return sizes

    def as_json(self) -> dict:
        sizes = self.part_sizes()
        return {"cache_dir": str(self.root), "total_bytes": self.total, "cap_bytes": self.cap,
                "cap_source": self.cap_source, "free_bytes": self.free, "over_cap": self.total > self.cap,
                "parts": [{"part": p, "bytes": sizes[p], "entries": sum(e.part == p for e in self.entries)}
                          for p in (*PARTS, LINKED)],
                "entries": [{"part": e.part, "name": e.name, "bytes": e.size, "last_used": e.last_used,
                             "in_use": e.in_use, "label": e.label,
                             "pinned": bool(e.in_use and e.in_use.startswith(PINNED))} for e in self.entries],
                "notes": list(self.notes),
                "disk_margin_bytes": self.margin, "engine": self.engine,
                "images_by_engine": {self.engine or "none": sum(sizes[p] for p in IMAGE_PARTS)},
                "runs": [{"dir": d, "bytes": n} for d, n in self.runs]}


IMAGE_PARTS = ("images", "anchors", "base_images")
PINNED = "pinned by you"


@dataclass(frozen=True)
class Pruned:
    removed: tuple[Entry, ...]
    freed: int
    before: Inventory
    notes: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- leases and stamps

def _root() -> Path:
    return current().cache_dir


def _own_dir(name: str) -> Path:
    path = _root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


# The lease of the run in progress in this thread (a bisection's probes run in threads of one process,
# each with a lease of its own): what `note_use` names goes into it.
_CURRENT_LEASE: ContextVar[Path | None] = ContextVar("lab_current_lease", default=None)
SETTLED = {"settled": True}    # the lease's line that ends its "anything used since it began" cover


@contextlib.contextmanager
def lease() -> Iterator[None]:
    """Hold a lease while a run goes on: what it uses is not evicted meanwhile (see the module's text)."""
    path = None
    with contextlib.suppress(OSError):
        path = _own_dir(LEASES) / f"{os.getpid()}-{time.time_ns()}.lease"
        path.write_text(f"{os.getpid()}\n")
    token = _CURRENT_LEASE.set(path)
    try:
        yield
    finally:
        _CURRENT_LEASE.reset(token)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def _name_in_lease(line: dict) -> None:
    """One JSON line into this thread's lease, if it holds one (appended whole: one write)."""
    path = _CURRENT_LEASE.get()
    if path is not None:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def settle_lease() -> None:
    """This thread's run has named everything its script runs on (its tree or venv, its image and base):
    from now on its lease covers only those, not anything used since it began."""
    _name_in_lease(SETTLED)


def note_use(paths: tuple[Path, ...] = (), image_ids: tuple[str, ...] = ()) -> None:
    """Mark cache folders and images as used now (for least-recently-used eviction), and name them in
    this thread's lease."""
    for p in paths:
        with contextlib.suppress(OSError):
            os.utime(p)
    for image_id in image_ids:
        with contextlib.suppress(OSError):
            stamp = _own_dir(STAMPS) / _stamp_name(image_id)
            stamp.touch()
            os.utime(stamp)
    if paths or image_ids:
        _name_in_lease({"paths": [_resolved(p) for p in paths], "images": [_stamp_name(i) for i in image_ids]})


def _resolved(p: Path) -> str:
    with contextlib.suppress(OSError):
        return str(Path(p).resolve())
    return str(p)


def _stamp_name(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:64]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Lease:
    """A live run's lease: its process, its start, what it named, and whether it has named everything
    its script runs on (then it covers only that; before, anything used since `start` too)."""
    pid: int
    start: float
    paths: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()
    settled: bool = False


def _read_lease(path: Path, pid: int, start: float) -> Lease:
    paths: set[str] = set()
    images: set[str] = set()
    settled = False
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines()[1:]:
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a line being written: the rest still counts
            if not isinstance(item, dict):
                continue
            settled = settled or item == SETTLED
            paths.update(str(p) for p in item.get("paths", ()) if isinstance(p, str))
            images.update(str(i) for i in item.get("images", ()) if isinstance(i, str))
    return Lease(pid, start, frozenset(paths), frozenset(images), settled)


def live_leases(root: Path) -> list[Lease]:
    """Every lease whose process still runs; stale ones are deleted."""
    found = []
    folder = root / LEASES
    for path in sorted(folder.glob("*.lease")) if folder.is_dir() else ():
        try:
            pid = int(path.name.split("-")[0])
            start = path.stat().st_mtime
        except (ValueError, OSError):
            continue
        if _alive(pid):
            found.append(_read_lease(path, pid, start))
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


class Hold:
    """What one process keeps by name until it lets go (`release`, or its exit): a site tree or image
    prepared for a later probe, which no run lease covers yet."""

    def __init__(self, paths: tuple[Path, ...] = (), image_ids: tuple[str, ...] = (), why: str = "held") -> None:
        self.path: Path | None = None
        with contextlib.suppress(OSError):
            self.path = _own_dir(LEASES) / f"{os.getpid()}-{time.time_ns()}.hold"
            self.path.write_text(json.dumps({"pid": os.getpid(), "why": why,
                                             "paths": [_resolved(p) for p in paths],
                                             "images": [_stamp_name(i) for i in image_ids]}))

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold(paths: tuple[Path, ...] = (), image_ids: tuple[str, ...] = (), why: str = "held") -> Hold:
    """Keep these cache folders and images from eviction until `release()` (or the process ends)."""
    return Hold(paths, image_ids, why)


def live_holds(root: Path) -> list[tuple[int, str, set[str], set[str]]]:
    """(pid, why, paths, image ids) of every hold whose process still runs; stale ones are deleted."""
    found = []
    folder = root / LEASES
    for path in sorted(folder.glob("*.hold")) if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text())
            pid = int(data["pid"])
            item = (pid, str(data.get("why", "held")), set(data.get("paths", ())), set(data.get("images", ())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            found.append(item)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def pins(root: Path | None = None) -> list[str]:
    """What the user pinned (`lab cache pin`): entry names, or words of their names or labels."""
    root = _root() if root is None else root
    try:
        data = json.loads((root / PINS).read_text())
        return [str(p) for p in data.get("pins", ()) if str(p)]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def set_pins(words: list[str], root: Path | None = None) -> None:
    root = _root() if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{PINS}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"pins": sorted(set(words))}, indent=1) + "\n")
    tmp.replace(root / PINS)


def pinned_by(e: Entry, words: list[str]) -> str | None:
    for w in words:
        if w == e.name or w in e.name or (e.label and w in e.label):
            return w
    return None


def _mounted(engine, notes: list[str]) -> dict[str, str]:
    """Host paths that the engine's containers (running or stopped) mount, and a container of each:
    an engine that mounts cache entries (a site tree, read-only) says so by `mounted_sources()`."""
    ask = getattr(engine, "mounted_sources", None) if engine is not None else None
    if ask is None:
        return {}
    try:
        return {str(Path(path).resolve()): name for path, name in dict(ask()).items()}
    except Exception as exc:  # noqa: BLE001 - an engine that cannot say: its mounts are unknown
        notes.append(f"container mounts left out: {type(exc).__name__}: {exc}")
        return {}


def _held(e: Entry, holds: list[tuple[int, str, set[str], set[str]]]) -> str | None:
    if isinstance(e.ref, ImageUsage):
        stamp = _stamp_name(e.ref.image_id)
        for pid, why, _, images in holds:
            if stamp in images:
                return f"{why} (pid {pid})" if pid else why
        return None
    mine = {_resolved(p) for p in (e.ref or ()) if isinstance(p, Path)}
    for pid, why, paths, _ in holds:
        if mine & paths:
            return f"{why} (pid {pid})" if pid else why
    return None


# ----------------------------------------------------------------------------- the disk

@dataclass
class _Walk:
    """Sizes counted once per inode: who holds each link."""

    inodes: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # -> (bytes, nlink)

    def entry(self, paths: list[Path]) -> tuple[int, float]:
        """(bytes removing `paths` frees, newest mtime among them)."""
        links: dict[tuple[int, int], int] = {}
        newest = 0.0
        for top in paths:
            try:
                st = os.lstat(top)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                newest = max(newest, self._tree(str(top), links))
            else:
                self._file(st, links)
        frees = sum(self.inodes[k][0] for k, n in links.items() if n >= self.inodes[k][1])
        return frees, newest

    def _file(self, st: os.stat_result, links: dict[tuple[int, int], int]) -> None:
        key = (st.st_dev, st.st_ino)
        self.inodes[key] = (st.st_blocks * 512, st.st_nlink)
        links[key] = links.get(key, 0) + 1

    def _tree(self, folder: str, links: dict[tuple[int, int], int]) -> float:
        newest = 0.0
        stack = [folder]
        while stack:
            try:
                with os.scandir(stack.pop()) as it:
                    for item in it:
                        try:
                            st = item.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        newest = max(newest, st.st_mtime)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append(item.path)
                        else:
                            self._file(st, links)
            except OSError:
                continue
        return newest

    def total(self) -> int:
        return sum(size for size, _ in self.inodes.values())


def _lock_held(lock: Path) -> bool:
    if not lock.exists():
        return False
    try:
        FileLock(str(lock)).acquire(timeout=0).lock.release()
    except Timeout:
        return True
    except OSError:
        return False
    return False


def disk_entries(root: Path, walk: _Walk) -> list[Entry]:
    entries: list[Entry] = []
    if not root.is_dir():
        return entries

    def add(part: str, name: str, paths: list[Path], in_use: str | None = None) -> None:
        size, newest = walk.entry(paths)
        entries.append(Entry(part, name, size, newest, in_use, ref=tuple(paths)))

    for top in sorted(root.iterdir()):
        name = top.name
        if name in ("site", "venv") and top.is_dir():  # one entry per key: the tree, its .json and .lock
            keys = sorted({p.name.split(".")[0] for p in top.iterdir()})
            for key in keys:
                paths = sorted(p for p in top.iterdir() if p.name.split(".")[0] == key)
                if all(p.name.endswith(".lock") for p in paths):
                    continue  # a lock alone (left by a removal or a failed make): nothing to free
                lock = top / f"{key}.lock"
                add(name, key, paths, "being made (its lock is held)" if _lock_held(lock) else
                    "mounted into a running container" if in_use_by_a_run(top / key) else None)
                entries[-1] = _with_label(entries[-1], top / f"{key}.json")
        elif name == "bases" and top.is_dir():
            for work in sorted(top.iterdir()):
                add("bases", work.name, [work])
        elif name == "uv" and top.is_dir():
            _uv_entries(top, add)
        elif name in ("index", "collect_env"):
            add(name, name, [top])
        elif name in _OWN:
            add("other", name, [top], "the lab's own bookkeeping")
        else:
            add("other", name, [top], "not one of the lab's parts: `lab cache prune` leaves it")
    return entries


def _with_label(e: Entry, meta: Path) -> Entry:
    """A site tree named by what it holds: its first requirement (the torch pin) and its target."""
    try:
        data = json.loads(meta.read_text())
        reqs = data.get("requirements") or []
        label = " ".join(str(x) for x in (reqs[:1] + [data.get("target") or ""]) if x)
    except (OSError, ValueError, AttributeError, TypeError):
        return e
    return Entry(e.part, e.name, e.size, e.last_used, e.in_use, e.ref, label)


UV_REST = "uv (indexes and wheel pointers)"


def _uv_entries(top: Path, add) -> None:
    """uv's cache, one entry per unpacked wheel (`archive-v*/<id>`, named by its dist-info), so the
    cap can evict the wheels no recent run used, and one entry for the rest (its indexes and the
    pointers to those wheels). uv takes a missing unpacked wheel as a cache miss and fetches the
    wheel again; its own files at the top (`.lock`, `CACHEDIR.TAG`) are not entries."""
    rest = []
    for sub in sorted(top.iterdir()):
        if not sub.is_dir():
            continue
        if sub.name.startswith("archive-v"):
            for archive in sorted(sub.iterdir()):
                add("uv", _wheel_name(archive), [archive])
        else:
            rest.append(sub)
    if rest:
        add("uv", UV_REST, rest)


def _wheel_name(archive: Path) -> str:
    """'torch-2.5.1 (archive-v0/Ab12...)' from the dist-info the unpacked wheel holds."""
    with contextlib.suppress(OSError):
        infos = sorted(p.name.removesuffix(".dist-info") for p in archive.iterdir() if p.name.endswith(".dist-info"))
        if infos:
            return f"{infos[0]} ({archive.parent.name}/{archive.name})"
    return f"{archive.parent.name}/{archive.name}"


def note_wheels_used(prefix: Path, uv_cache: Path | None = None) -> int:
    """Mark as used now the unpacked wheels in uv's cache that the site tree or venv at `prefix` was
    installed from (their `METADATA` is the same file, hard-linked; where uv copied instead, the
    wheel of the same name and version), and name them in this thread's lease. The number marked."""
    uv_cache = _root() / "uv" if uv_cache is None else uv_cache
    installed: dict[str, tuple[int, int] | None] = {}
    for info in prefix.glob("lib/python*/site-packages/*.dist-info"):
        try:
            st = os.stat(info / "METADATA")
            installed[info.name] = (st.st_dev, st.st_ino)
        except OSError:
            installed[info.name] = None
    if not installed or not uv_cache.is_dir():
        return 0
    linked, named = [], []
    for archives in uv_cache.glob("archive-v*"):
        for archive in archives.iterdir():
            with contextlib.suppress(OSError):
                for info in archive.iterdir():
                    if info.name in installed:
                        st = os.stat(info / "METADATA")
                        same = (st.st_dev, st.st_ino) == installed[info.name]
                        (linked if same else named).append((info.name, archive))
    found = {name for name, _ in linked}
    chosen = [a for _, a in linked] + [a for name, a in named if name not in found]
    for archive in chosen:
        with contextlib.suppress(OSError):
            os.utime(archive)
    if chosen:
        _name_in_lease({"paths": [_resolved(a) for a in chosen]})
    return len(chosen)


# ----------------------------------------------------------------------------- images

def image_entries(images: list[ImageUsage], stamps: Path) -> tuple[list[Entry], int]:
    entries = []
    for img in images:
        stamp = stamps / _stamp_name(img.image_id)
        try:
            used = max(img.created, stamp.stat().st_mtime)
        except OSError:
            used = img.created
        part = ("anchors" if img.anchor else
                "base_images" if any(t.startswith(BASE_REPO + ":") for t in img.tags) else "images")
        why = f"used by container {', '.join(img.containers)}" if img.containers else None
        name = ", ".join(img.tags) or img.image_id[:19]
        entries.append(Entry(part, name, img.unique, used, why, ref=img))
    shared = max((img.shared for img in images), default=0)
    return entries, shared


# ----------------------------------------------------------------------------- stock, prune, enforce

def take_inventory(engine=None, now: float | None = None,
                   only: Callable[[ImageUsage], bool] | None = None, *, with_runs: bool = False) -> Inventory:
    """What the cache holds now. `engine` None (or one that fails) leaves the images out, with a note.
    `only` narrows the images considered (tests on a shared engine look at their own images only)."""
    settings = current()
    root = settings.cache_dir
    now = time.time() if now is None else now
    walk = _Walk()
    entries = disk_entries(root, walk)
    notes: list[str] = []
    shared = 0
    if engine is not None:
        try:
            managed = [i for i in engine.managed_images() if only is None or only(i)]
            images, shared = image_entries(managed, root / STAMPS)
            entries += images
        except LabError as exc:
            notes.append(f"images left out: {exc}")
        except Exception as exc:  # noqa: BLE001 - an engine that cannot list images leaves them out
            notes.append(f"images left out: {type(exc).__name__}: {exc}")
    else:
        notes.append("images left out: no Docker engine")
    leases = live_leases(root)
    making = [le for le in leases if not le.settled]  # still making what it runs on: covers by time too
    if making:
        since = min(le.start for le in making) - _SLACK_S
        pids = ", ".join(str(pid) for pid in sorted({le.pid for le in making}))
        entries = [e if e.in_use or e.last_used < since else
                   Entry(e.part, e.name, e.size, e.last_used, f"used by a lab run in progress (pid {pids})", e.ref,
                         e.label)
                   for e in entries]
    holds, pinned = live_holds(root), pins(root)
    holds = [*((le.pid, "used by a lab run in progress", set(le.paths), set(le.images)) for le in leases
               if le.paths or le.images), *holds]
    mounted = _mounted(engine, notes)
    if mounted:
        holds = [*holds, *((0, f"mounted by container {name}", {path}, set()) for path, name in mounted.items())]
    if holds or pinned:
        def why(e: Entry) -> str | None:
            if e.in_use or e.part == "other":
                return e.in_use
            word = pinned_by(e, pinned)
            return f"{PINNED} (lab cache pin {word})" if word else _held(e, holds)
        entries = [Entry(e.part, e.name, e.size, e.last_used, why(e), e.ref, e.label) for e in entries]
    on_disk = walk.total()
    linked = max(on_disk - sum(e.size for e in entries if e.part not in IMAGE_PARTS), 0)
    total = on_disk + sum(e.size for e in entries if e.part in IMAGE_PARTS) + shared
    free = _free(root)
    cap = settings["cache_cap"]
    if cap is not None:
        cap_source = f"cache_cap ({settings.origins['cache_cap']})"
    else:
        cap = default_cap(free, total)
        cap_source = "default: 30 GiB or a quarter of the free disk plus the cache, whichever is smaller"
    entries.sort(key=lambda e: (PARTS.index(e.part), e.name))
    return Inventory(root, tuple(entries), total, int(cap), cap_source, free, shared, tuple(notes),
                     margin=disk_margin(), engine=getattr(engine, "name", None) if engine is not None else None,
                     runs=tuple(_runs_sizes(settings) if with_runs else ()), linked_bytes=linked)


def disk_margin() -> int:
    margin = current()["disk_margin"]
    return DISK_MARGIN if margin is None else int(margin)


def _runs_sizes(settings) -> list[tuple[str, int]]:
    """The runs folder and what it holds (outside the cap: run folders are results, never evicted)."""
    folder = settings.runs_dir.resolve()
    if not folder.is_dir():
        return [(str(folder), 0)]
    size, _ = _Walk().entry([folder])
    return [(str(folder), size)]


def _free(root: Path) -> int:
    """Free bytes on the file system that holds (or will hold) `root`; 0 when it cannot be read."""
    for p in (root, *root.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return 0
    return 0


def prune(engine=None, *, everything: bool = False, older_than: float | None = None,
          cap: int | None = None, now: float | None = None, events: Events = no_events,
          only: Callable[[ImageUsage], bool] | None = None) -> Pruned:
    """Remove what the policy chooses; without `everything` or `older_than`, down to the cap."""
    now = time.time() if now is None else now
    inv = take_inventory(engine, now, only)
    uv_note = None
    if not everything and inv.total > (inv.cap if cap is None else cap):
        # uv's own prune first: it frees what no install can use any more, and loses nothing
        uv_note = prune_uv(inv.root / "uv", events)
        if uv_note:
            inv = take_inventory(engine, now, only)
    first, target = inv, inv.cap if cap is None else cap
    removed, notes = [], list(inv.notes) + ([uv_note] if uv_note else [])
    counted_freed, pending = 0, 0    # freed as recounted; sizes removed since the last count
    for _ in range(PRUNE_ROUNDS):
        chosen = choose(inv.entries, total=inv.total, cap=target, now=now, older_than=older_than,
                        everything=everything)
        did = 0
        for e in chosen:
            problem = _remove(e, engine)
            if problem:
                notes.append(f"{e.part} {e.name}: {problem}")
                continue
            events("cache", f"removed {e.part} {e.name} ({_gib(e.size)})")
            removed.append(e)
            did += 1
            pending += e.size
        if everything or older_than is not None or not did:
            break
        # What the removed entries shared by hard links (a site tree and the unpacked wheels in uv's
        # cache it came from) counted in neither alone: counted again, it is what the next round frees.
        inv = take_inventory(engine, now, only)
        counted_freed, pending = max(first.total - inv.total, 0), 0
        if inv.total <= target:
            break
    if removed:
        _forget_stamps(first.root, engine)
    return Pruned(tuple(removed), counted_freed + pending, first, tuple(notes))


PRUNE_ROUNDS = 3                       # a tree and the wheels it is hard-linked to free bytes only together
UV_PRUNE_TIMEOUT_S = 120
_REMOVED = re.compile(r"Removed (\d+) files? \(([^)]*)\)")


def prune_uv(cache: Path, events: Events = no_events, timeout: float = UV_PRUNE_TIMEOUT_S) -> str | None:
    """`uv cache prune` of the lab's uv cache: uv removes the entries that no index entry refers to
    any more (every re-download and every re-lock leaves an unpacked copy behind: 18.5 GiB of them on
    one machine after a day of CUDA-wheel bisections), and keeps every wheel a later install can use.
    uv takes its cache's exclusive lock and waits for other uv processes, so it is given `timeout`
    seconds. A line saying what it freed, or None when it freed nothing or could not run."""
    if not cache.is_dir():
        return None
    try:
        uv = uv_binary()
    except CrossInstallError:
        return None
    events("cache", f"uv cache prune ({cache}): removing what no install refers to")
    try:
        proc = subprocess.run([uv, "cache", "prune", "--cache-dir", str(cache)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"uv cache prune: uv's cache stayed in use by other uv processes for {timeout:.0f} s; not pruned"
    except OSError as exc:
        return f"uv cache prune could not run: {exc}"
    if proc.returncode != 0:
        return f"uv cache prune failed (exit {proc.returncode}): {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    m = _REMOVED.search(proc.stderr + proc.stdout)
    if m is None or m.group(1) == "0":
        return None
    return f"uv cache prune removed {m.group(1)} files ({m.group(2)}) that no install refers to"


UV_LOCK_WAIT_S = 10.0


def _remove_uv(paths: tuple[Path, ...]) -> str | None:
    """Remove part of uv's cache while holding uv's own cache lock (`<uv>/.lock`, exclusive, as
    `uv cache clean` takes it), so that no uv process reads it meanwhile. An unpacked wheel goes
    with the pointers to it (`wheels-v*/.../*.http`, `*.rev`, which name its folder): uv refetches a
    wheel whose pointer is gone, but a pointer to a missing folder fails an install from a
    find-links folder ("failed to read directory")."""
    archive = paths[0] if len(paths) == 1 and paths[0].parent.name.startswith("archive-v") else None
    uv_root = paths[0].parent.parent if archive is not None else paths[0].parent
    try:
        fd = os.open(uv_root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return f"uv's cache lock could not be opened: {exc}"
    try:
        deadline = time.monotonic() + UV_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return "uv is using its cache now (its lock is held)"
                time.sleep(0.2)
        if archive is not None:
            _drop_pointers(uv_root, archive.name.encode())
        return _delete(paths)
    except OSError as exc:
        return f"could not be removed: {exc}"
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _drop_pointers(uv_root: Path, archive_id: bytes, limit: int = 1024**2) -> None:
    """Delete uv's small pointer files that name `archive_id` (outside the unpacked wheels)."""
    for top in uv_root.iterdir():
        if not top.is_dir() or top.name.startswith("archive-v"):
            continue
        for folder, _dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.path.getsize(path) <= limit:
                        with open(path, "rb") as fh:
                            found = archive_id in fh.read()
                        if found:
                            os.unlink(path)


def _remove(e: Entry, engine) -> str | None:
    if isinstance(e.ref, ImageUsage):
        if engine is None:
            return "no engine"
        try:
            return None if engine.remove_unused_image(e.ref) else "the engine did not remove it (in use?)"
        except LabError as exc:
            return str(exc)
    paths: tuple[Path, ...] = e.ref or ()  # type: ignore[assignment]
    if e.part == "uv" and paths:
        return _remove_uv(paths)
    lock = None
    if e.part in ("site", "venv") and paths:
        lock = FileLock(str(paths[0].parent / f"{e.name}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return "being made (its lock is held)"
    try:
        if e.part != "site" or not paths:
            return _delete([p for p in paths if not p.name.endswith(".lock")])
        with unless_in_use(paths[0].parent / e.name) as free:  # no container starts to see it meanwhile
            if not free:
                return "mounted into a running container"
            return _delete([p for p in paths if not p.name.endswith(".lock")])
    finally:
        if lock is not None:
            lock.release()


def _delete(paths) -> str | None:
    """Remove files and folders (a link itself, never what it points to); the problem, or None."""
    try:
        for p in paths:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
    except OSError as exc:
        return f"could not be removed: {exc}"
    return None


def _forget_stamps(root: Path, engine) -> None:
    """Stamps of images that are gone."""
    if engine is None or not (root / STAMPS).is_dir():
        return
    with contextlib.suppress(LabError, OSError):
        present = {_stamp_name(i.image_id) for i in engine.managed_images()}
        for stamp in (root / STAMPS).iterdir():
            if stamp.name not in present:
                stamp.unlink(missing_ok=True)


# The bisect driver enforces once per probe, after removing the probe's image; the runs it makes
# leave it to the driver.
_DEFERRED: list[bool] = []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    _DEFERRED.append(True)
    try:
        yield
    finally:
        _DEFERRED.pop()


def due(root: Path, now: float, cap: int | None = None) -> bool:
    """Whether the cap needs a full count now (see RECOUNT_S); `cap` the configured one (None: the
    default, as last computed)."""
    try:
        last = json.loads((root / LAST_COUNT).read_text())
        at, total, last_cap = float(last["at"]), int(last["total"]), int(last["cap"])
        free_then = int(last.get("free", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return True
    grown = max(free_then - _free(root), 0) if free_then else 0  # at most what the disk lost since
    return not (0 <= now - at < RECOUNT_S) or total + grown > RECOUNT_SHARE * (last_cap if cap is None else cap)


def last_count() -> tuple[int, int] | None:
    """(total, cap) at the last count enforcement made, or None."""
    try:
        last = json.loads((current().cache_dir / LAST_COUNT).read_text())
        return int(last["total"]), int(last["cap"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remember(root: Path, now: float, total: int, cap: int) -> None:
    with contextlib.suppress(OSError):
        tmp = root / f"{LAST_COUNT}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"at": now, "total": total, "cap": cap, "free": _free(root)}))
        tmp.replace(root / LAST_COUNT)


def enforce_cap(engine, events: Events = no_events, *, force: bool = False,
                now: float | None = None) -> Pruned | None:
    """Bring the cache under its cap. Never raises: a problem becomes a `cache` event. None when
    deferred (inside a bisection, which enforces per probe) or when no count was due."""
    if _DEFERRED and not force:
        return None
    now = time.time() if now is None else now
    try:
        settings = current()
        root = settings.cache_dir
        if not due(root, now, settings["cache_cap"]):
            return None
        pruned = prune(engine, events=events, now=now)
        _remember(root, now, pruned.before.total - pruned.freed, pruned.before.cap)
    except Exception as exc:  # noqa: BLE001 - enforcement must never fail a run
        events("cache", f"the cache cap was not enforced: {type(exc).__name__}: {exc}")
        return None
    for note in pruned.notes:
        events("cache", f"note: {note}")
    if pruned.removed:
        events("cache", f"freed {_gib(pruned.freed)} to stay under the cap of {_gib(pruned.before.cap)}")
    elif pruned.before.total > pruned.before.cap:
        events("cache", f"the cache holds {_gib(pruned.before.total)}, over its cap of {_gib(pruned.before.cap)}, "
                        "and nothing more can be removed now (the rest is in use)")
    return pruned


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"

