"""Room for the next run, checked before it starts: what it will add to the cache, and whether the cap
and the disk can take it.

`estimate(case, engine)` says how many bytes a run of `case` adds: nothing new when its site tree
(or venv) is cached (plus the image the engine copies it into, where it does), else the size of the
cached tree of the same target and the same kind of build whose torch release is nearest (releases
next to each other differ little: 4-5 GB for x86-64 CUDA builds, 7 GB for AArch64 from 2.11), else a
typical size. A CUDA build (it pulls `nvidia-*` wheels) is never estimated from a CPU build's tree nor
the other way round: AArch64 2.10.0's tree is 0.6 GB and 2.11.0's about 7 GB. uv's wheels are
hard-linked into the tree, so they are counted once.

`make_room(need, ...)` evicts, least recently used first and never what is in use, until the cache
plus `need` fits the cap; it reports whether the cap can be kept and whether the disk keeps
`disk_margin` free after the run. `before_run` is the hook a run calls before anything is made: it
warns when the cap cannot be kept and refuses (CacheSpaceError) when the disk would fill.
`may_prepare` is the same question, asked quietly by whoever prepares ahead (the bisection's next
round): it never warns and never refuses.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from lab.cache_policy import inventory
from lab.cache_policy.policy import GiB
from lab.core.config import current
from lab.core.errors import LabError
from lab.core.records import Events, no_events
from lab.image.crossinstall import target_for

# When no tree of the target was made yet: what one torch release adds, by what is known of it.
TYPICAL_CPU = 1 * GiB                      # a +cpu wheel and its few dependencies
TYPICAL_BYTES = {"amd64": 5 * GiB, "arm64": 2 * GiB}   # x86-64 with its CUDA wheels; AArch64 before 2.11
TYPICAL_ARM64_CUDA = 7 * GiB               # AArch64 torch from 2.11 on carries CUDA wheels
NEAREST_SLACK = 1.1                        # a neighbour release may be a little larger


class CacheSpaceError(LabError):
    """A run would fill the disk: refused before it starts."""


@dataclass(frozen=True)
class Need:
    bytes: int
    source: str            # how it was estimated, in words


@dataclass(frozen=True)
class Room:
    need: int
    total: int             # the cache after eviction, before the run
    cap: int
    free: int              # free disk after eviction, before the run
    margin: int
    freed: int = 0
    counted: bool = True   # False: decided from the last count, without walking the cache

    @property
    def cap_kept(self) -> bool:
        return self.total + self.need <= self.cap

    @property
    def disk_kept(self) -> bool:
        return self.free - self.need >= self.margin

    @property
    def ok(self) -> bool:
        return self.cap_kept and self.disk_kept


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _pin(requirements: list, project: str = "torch") -> str | None:
    for r in requirements:
        r = str(r).replace(" ", "")
        if r.lower().startswith(f"{project}=="):
            return r.split("==", 1)[1]
    return None


def _copies_into_image(engine) -> bool:
    """Whether the engine writes the tree into an image as well (a layer): the bytes count twice.
    An engine that mounts the cached tree instead says so with `site_tree_in_image = False`."""
    if engine is None:
        return False
    explicit = getattr(engine, "site_tree_in_image", None)
    if explicit is not None:
        return bool(explicit)
    try:
        return bool(engine.cross_installs)
    except Exception:  # noqa: BLE001 - a fake or a gone engine: count the tree once
        return False


def cuda_build(torch: str, arch: str) -> bool:
    """Whether torch `torch` from PyPI for `arch` is a CUDA build (it pulls `nvidia-*` wheels): every
    x86-64 release but a `+cpu` one, AArch64 from 2.11.0 on."""
    if "+cpu" in torch:
        return False
    if arch == "arm64":
        wanted = _version(torch)
        return wanted is not None and wanted >= Version("2.11")
    return True


def _arch_of(target: str) -> str:
    return "arm64" if "arm64" in target or "aarch64" in target else "amd64"


def _cuda_tree(data: dict, version: str | None, target: str) -> bool:
    """Whether a cached tree is a CUDA build: what it installed says (a site tree's `packages`, a
    venv's `freeze`), else the rule for its release."""
    names = [str(p.get("name", "")) for p in data.get("packages") or () if isinstance(p, dict)]
    names += [str(line).split("==", 1)[0] for line in data.get("freeze") or ()]
    if names:
        return any(n.lower().startswith("nvidia") for n in names)
    return cuda_build(version or "", _arch_of(target))


def _trees(root: Path, project: str = "torch") -> list[tuple[str | None, str, int, bool]]:
    """(version of `project`, target, bytes, whether a CUDA build) of every site tree and venv the
    cache describes."""
    found = []
    for part in ("site", "venv"):
        folder = root / part
        for meta in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                data = json.loads(meta.read_text())
                version = _pin(list(data.get("requirements") or []), project)
                target = str(data.get("target") or "")
                found.append((version, target, int(data.get("size") or 0), _cuda_tree(data, version, target)))
            except (OSError, ValueError, TypeError, AttributeError):
                continue
    return found


def estimate_bytes(torch: str, arch: str, target: str | None, copies: bool, root: Path | None = None,
                   project: str = "torch") -> Need:
    """What a run of `project` (torch) `torch` for `target` adds to the cache (see the module's words)."""
    root = current().cache_dir if root is None else root
    trees = [t for t in _trees(root, project) if target is None or t[1] in (target, "")]  # a venv: this host
    factor = 2 if copies else 1
    for version, _, size, _cuda in trees:
        if version == torch:
            extra = size if copies else 0
            return Need(extra, f"its tree is cached ({_gib(size)})" + (
                "; the engine copies it into the case image" if copies else ""))
    wanted = _version(torch)
    cuda = project == "torch" and cuda_build(torch, arch)  # another project: its trees are alike
    measured = [(v, s) for v, _, s, c in trees if v and s > 0 and c == cuda]  # the same kind of build
    if wanted is not None and measured:
        def distance(item: tuple[str, int]) -> tuple[float, int]:
            v = _version(item[0])
            if v is None:
                return (float("inf"), 0)
            a, b = wanted.release + (0, 0, 0), v.release + (0, 0, 0)
            return (abs((a[0] - b[0]) * 10000 + (a[1] - b[1]) * 100 + (a[2] - b[2])), -item[1])
        near, size = min(measured, key=distance)
        return Need(int(size * NEAREST_SLACK) * factor, f"the cached tree of {project} {near} ({_gib(size)})")
    if "+cpu" in torch:
        base = TYPICAL_CPU
    elif arch == "arm64" and cuda:
        base = TYPICAL_ARM64_CUDA
    else:
        base = TYPICAL_BYTES.get(arch, max(TYPICAL_BYTES.values()))
    kind = "CUDA" if cuda else "CPU"
    return Need(base * factor, f"a typical {kind} build of torch for {arch} ({_gib(base)}); no tree of that kind "
                               "was made yet")


def estimate(case, engine=None) -> Need:
    try:
        target = target_for(case)
    except Exception:  # noqa: BLE001 - an unknown base: any target
        target = None
    return estimate_bytes(case.torch, case.arch.value, target.label if target is not None else None,
                          _copies_into_image(engine))


def _quick(need: int, now: float) -> Room | None:
    """The answer from the last count, when it is recent and far from the cap and the disk is far
    from its margin: no walk of the cache before every run."""
    settings = current()
    root = settings.cache_dir
    last = inventory.last_count()
    if last is None:
        return None
    try:
        recorded = json.loads((root / inventory.LAST_COUNT).read_text())
        at = float(recorded["at"])
        free_then = int(recorded.get("free", 0))
        promised = int(recorded.get("promised", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    total, last_cap = last
    cap = settings["cache_cap"] if settings["cache_cap"] is not None else last_cap
    free = inventory._free(root)
    # what the cache grew by since the count: the disk's drop, which another process's deletions on
    # the same disk can hide, and never less than what the runs answered from it said they would add
    grown = max(free_then - free if free_then else 0, promised, 0)
    if not (0 <= now - at < inventory.RECOUNT_S):
        return None
    room = Room(need, total + grown, int(cap), free, inventory.disk_margin(), counted=False)
    if not (room.ok and room.total + need <= inventory.RECOUNT_SHARE * cap):
        return None
    _promise(root, recorded, need)
    return room


def _promise(root: Path, recorded: dict, need: int) -> None:
    """Add `need` to the bytes promised since the last count, so the next quick answer counts them
    even when the disk's free space does not show them."""
    try:
        recorded = {**recorded, "promised": int(recorded.get("promised", 0)) + int(need)}
        tmp = root / f"{inventory.LAST_COUNT}.{os.getpid()}.promise.tmp"
        tmp.write_text(json.dumps(recorded))
        tmp.replace(root / inventory.LAST_COUNT)
    except (OSError, ValueError, TypeError):
        pass


def make_room(need: int, engine=None, events: Events = no_events, *, now: float | None = None,
              evict: bool = True) -> Room:
    """Evict (least recently used first, never what is in use or pinned) until the cache plus `need`
    fits the cap; then say whether the cap and the disk margin hold."""
    now = time.time() if now is None else now
    quick = _quick(need, now)
    if quick is not None:
        return quick
    inv = inventory.take_inventory(engine, now)
    inventory._remember(inv.root, now, inv.total, inv.cap)  # the next run's check starts from this count
    total, freed = inv.total, 0
    if evict and inv.total + need > inv.cap:
        pruned = inventory.prune(engine, cap=max(inv.cap - need, 0), now=now, events=events)
        total, freed = pruned.before.total - pruned.freed, inv.total - (pruned.before.total - pruned.freed)
        inventory._remember(inv.root, now, total, pruned.before.cap)
    return Room(need, total, inv.cap, inventory._free(inv.root), inv.margin, freed)


def may_prepare(need: int, engine=None, *, now: float | None = None) -> bool:
    """For preparing ahead (the next round's trees and images): True when `need` more bytes fit the
    cap and leave the disk margin, after evicting what nothing uses. Never raises, never warns."""
    try:
        return make_room(need, engine, now=now).ok
    except Exception:  # noqa: BLE001 - a question, not a run: no answer is a no
        return False


def before_run(case, engine, events: Events = no_events, *, now: float | None = None) -> Room | None:
    """Before a run (or a bisect probe) makes anything: room for what it adds. A warning event when
    the cap cannot be kept; CacheSpaceError when the disk would keep less than `disk_margin` free.
    None when the check itself failed (said as an event: a run is not refused for that)."""
    try:
        need = estimate(case, engine)
    except Exception as exc:  # noqa: BLE001 - the check never fails a run by itself
        events("cache", f"the room for this run was not checked: {type(exc).__name__}: {exc}")
        return None
    return check_room(need, f"torch {case.torch} ({case.arch.value})", engine, events, now=now)


def check_room(need: Need, what: str, engine=None, events: Events = no_events, *,
               now: float | None = None) -> Room | None:
    """`before_run` for a need already estimated; `what` names the run in its messages."""
    try:
        room = make_room(need.bytes, engine, events, now=now)
    except Exception as exc:  # noqa: BLE001 - the check never fails a run by itself
        events("cache", f"the room for this run was not checked: {type(exc).__name__}: {exc}")
        return None
    what = f"{what} adds about {_gib(need.bytes)} ({need.source})"
    if not room.disk_kept:
        raise CacheSpaceError(
            f"not started: {what}, and the disk has {_gib(room.free)} free at {current().cache_dir}, which would "
            f"leave less than the disk_margin of {_gib(room.margin)}; the cache holds {_gib(room.total)} "
            "after removing what nothing uses (see `lab cache info`)",
            hint="Free disk space, unpin or prune what `lab cache info` shows, or lower disk_margin.")
    if not room.cap_kept:
        events("cache", f"warning: {what}; the cache holds {_gib(room.total)} after removing what nothing "
                        f"uses, so it will go over its cap of {_gib(room.cap)} by about "
                        f"{_gib(room.total + room.need - room.cap)} (the rest is in use or pinned: "
                        "`lab cache info` shows what); raise cache_cap or free it")
    return room
