"""What a bisection does beside its probes (issue 34): the next round made ready while one runs, and
two emulated probes at once on a machine whose cores an emulated script leaves idle.

- `Prefetcher` runs, on one background thread, what makes a release ready to probe (on Docker: its
  base and the site tree uv installs on the host; on the local engine: its venv), for the releases
  lab.drivers.bisect says the next round may ask for. A new hint replaces what was not started yet;
  what was started finishes (the probe that needs it waits on the cache entry's lock, never makes
  it twice). It runs at nice 10, so the running probes keep the cores. A preparation that fails
  is only a note: the probe makes it again and says why. It
  starts nothing while the cache is over three quarters of its cap at its last count, so what it
  makes ahead never pushes the cache over its cap.
- `emulated_width` is how many probes run at once when every engine that fits runs the arch
  through QEMU: an emulated script keeps one core busy (one OpenBLAS thread, one compile thread), so
  one probe per core, as memory (4 GiB each) and the engine's free disk (8 GiB each, where the
  host can see it) allow, instead of one per two cores.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

from lab.cache_policy import inventory as cache_policy
from lab.core.records import Events, no_events
from lab.engine.engines import MEMORY_PER_SLOT
from lab.engine.routing import Fleet, NoEngineError

PREFETCH_SHARE = 0.75   # of the cap, at the last count: above it nothing is made ahead
PREFETCH_NICE = 10      # the nice value of what is made ahead, below the running probes'
DISK_PER_PROBE = 8 * 1024**3   # free disk per emulated probe at once: AArch64 torch from 2.11 is a 7 GB tree


def room_ahead() -> bool:
    """Whether the cache had room under its cap at its last count (unknown: yes)."""
    counted = cache_policy.last_count()
    return counted is None or counted[0] <= PREFETCH_SHARE * counted[1]


class Prefetcher:
    """One thread that makes releases ready ahead of their probes (see the module's docstring)."""

    def __init__(self, make: Callable[[str], None], events: Events = no_events,
                 room: Callable[[], bool] = room_ahead) -> None:
        self.make = make
        self.events = events
        self.room = room
        self.pending: list[str] = []
        self.started: set[str] = set()
        self.done: dict[str, float] = {}        # release -> seconds its preparation took
        self.failed: dict[str, str] = {}
        self.skipped_for_room: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, daemon=True, name="lab-bisect-prefetch")
        self._thread.start()

    def ask(self, versions: list[str]) -> None:
        """Make these ready next, in this order; what was asked before and not started is dropped."""
        with self._cond:
            self.pending = [v for v in dict.fromkeys(versions) if v not in self.started]
            self._cond.notify_all()

    def forget(self, version: str) -> None:
        """The probe of `version` starts now: it makes what it needs itself (or waits for the lock)."""
        with self._cond:
            if version in self.pending:
                self.pending.remove(version)
            self.started.add(version)

    def close(self, wait: bool = True) -> None:
        """Stop: nothing new starts; what runs finishes (waited for, unless not `wait`: an interrupted
        bisection; the thread is a daemon, and a half-made cache entry is made again when needed)."""
        with self._cond:
            self._closed = True
            self.pending = []
            self._cond.notify_all()
        if wait:
            self._thread.join()

    def _work(self) -> None:
        # What is made ahead is a bet; the probes running now are what the bisection waits for. This
        # thread, and the uv installs, unpacking and bootstraps it starts (a child keeps the nice value
        # of the thread that forked it, on Linux), yields the cores to them.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           max(PREFETCH_NICE, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        while True:
            with self._cond:
                while not self.pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                version = self.pending.pop(0)
                self.started.add(version)
            if not self.room():
                self.skipped_for_room.append(version)
                self.events("bisect", f"torch {version} not made ready ahead: the cache is near its cap")
                continue
            began = time.monotonic()
            try:
                self.make(version)
            except Exception as exc:  # noqa: BLE001 - a hint that failed: the probe makes it again
                self.failed[version] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                self.events("bisect", f"torch {version} could not be made ready ahead ({self.failed[version]}); "
                                      "its probe makes it")
                continue
            self.done[version] = round(time.monotonic() - began, 2)
            self.events("bisect", f"torch {version} made ready ahead in {self.done[version]:.0f} s")


def emulated_width(fleet: Fleet, arch: str, gpu: bool) -> int:
    """Probes at once when every engine that fits runs `arch` through QEMU: one per core, 4 GiB of
    memory and 8 GiB of free disk of each such engine (at least its own slots); else the fleet's
    slots."""
    try:
        found = fleet.routes(arch, gpu)
    except NoEngineError:
        return fleet.slots
    if not found or any(not r.emulated for r in found):
        return fleet.slots
    facts = {f.name: f for f in fleet.facts}
    # engines whose sockets are on this host share its cores: together they get one probe per core
    on_host = sum(1 for r in found if (f := facts.get(r.engine)) is not None and f.local)
    host_share = max(1, (os.cpu_count() or 1) // on_host) if on_host else None
    width = 0
    for route in found:
        f = facts.get(route.engine)
        if f is None or f.kind != "docker":
            return fleet.slots
        per_core = max(1, min(f.cpus or 1, (f.memory or MEMORY_PER_SLOT) // MEMORY_PER_SLOT,
                              (f.free_disk // DISK_PER_PROBE) if f.free_disk is not None else 1 << 20))
        if f.local and host_share is not None:
            per_core = min(per_core, host_share)
        fleet.widen(route.engine, per_core)
        width += fleet.capacity.get(route.engine, 0)
    return max(width, fleet.slots)
