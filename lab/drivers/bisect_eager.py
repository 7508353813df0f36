"""Bisection with S slots that starts a probe as soon as a slot is free (issue 34).

A k-ary round (lab.drivers.bisect with `width` S) starts S probes together and waits for the slowest
before it picks again: while the first round's new end makes its 7 GB tree, the old end's slot idles
for minutes, and every later round waits on its slower probe. This search never waits for a probe
whose answer it does not need to choose the next one:

- The ends are probed first, with the ends' walk inwards over skips as in the serial search.
- While an end is still running, the search assumes the ends differ and probes inside: with one end
  known the other is its opposite (a verdict is one of two outcomes, or a skip); with none known it
  only splits by position. When the ends turn out to agree (`no_change`) those probes were wasted;
  they ran on slots that would have idled.
- Each free slot takes the untested release nearest the middle of the largest stretch of untested
  releases that the interval's running probes leave (with no probe running inside: the midpoint, as
  in binary search).
- The interval is worked out again from every answer after each one (the newest release answering
  like the old end before the oldest answering like the new end), so an answer that arrives after
  the interval moved past it is still used, and an answer that contradicts another (the verdict
  changes more than once) is a note, as in the round search.
- A running probe whose answer is no longer needed (the interval moved past it, or the search is
  over) is asked to stop (lab.core.cancel: the Docker and local engines kill its run between polls);
  it leaves no step and no run folder, only a note. An engine that cannot stop a run (a probe
  outside its container wait, Slurm) finishes it, and its answer is kept as a step.
- It ends when no untested release is left inside the interval and no probe is running.

For a verdict that changes once, it finds the boundary the serial search finds (the tests check it
against every history and every order of finishing). It may make more probes than the serial search
(an answer can make a running probe useless), but never more than the releases, and each release at
most once. The order of probes depends on which finishes first, so it is not deterministic across
runs; a resumed bisection still reuses every finished probe's folder.

`EagerSearch` is the logic alone (no threads, no clock: tests drive it with simulated durations);
`run_eager` runs it with one daemon thread per running probe.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.core import cancel
from lab.core.errors import BisectError
from lab.core.results import (
    AMBIGUOUS,
    FOUND,
    NO_CHANGE,
    NO_RUNNABLE_PAIR,
    NOT_REPRODUCED,
    REPRODUCED,
    SKIP,
    BisectResult,
    Probe,
)

_OTHER = {REPRODUCED: NOT_REPRODUCED, NOT_REPRODUCED: REPRODUCED}


@dataclass(frozen=True)
class Where:
    """What the answers so far say: the ends in use, the interval, and whether the search is over."""

    old_end: int | None       # the runnable old end, or the candidate for it still to be answered
    new_end: int | None
    lo: int                   # the interval (lo, hi) the boundary lies in
    hi: int
    status: str | None        # set when no more probes are needed (running ones are then stopped)
    old_verdict: str | None = None
    new_verdict: str | None = None
    first_new: int | None = None


class EagerSearch:
    """The bisection's state: which releases answered what, which are running (see the module)."""

    def __init__(self, versions: Sequence[str], width: int) -> None:
        self.versions = list(versions)
        self.width = max(1, width)
        self.seen: dict[int, Probe] = {}
        self.running: set[int] = set()
        self.steps: list[Probe] = []
        self.stopped: list[int] = []   # probes stopped before they answered: no longer needed
        self.starts = 0   # the moments probes were started at (the first: the ends together)

    # -- what the answers say ------------------------------------------------------------------

    def _known(self, i: int) -> str | None:
        p = self.seen.get(i)
        return p.outcome if p is not None else None

    def where(self) -> Where:
        last = len(self.versions) - 1
        i = 0
        while i < last and self._known(i) == SKIP:
            i += 1
        old_end = i if i < last else None
        j = last
        while old_end is not None and j > old_end and self._known(j) == SKIP:
            j -= 1
        new_end = j if old_end is not None and j > old_end else None
        if old_end is None or new_end is None:  # every release on one side was skipped
            done = old_end is not None and self._known(old_end) is not None or \
                old_end is None and self._known(last) is not None
            return Where(old_end, new_end, 0, last, NO_RUNNABLE_PAIR if done else None)
        a, b = self._known(old_end), self._known(new_end)
        if a is not None and b is not None and a == b:
            return Where(old_end, new_end, old_end, new_end, NO_CHANGE, a, b)
        old_v = a if a is not None else _OTHER.get(b) if b is not None else None
        new_v = b if b is not None else _OTHER.get(a) if a is not None else None
        lo, hi, first_new = old_end, new_end, None
        if old_v is not None:
            inside = sorted(k for k in self.seen if old_end < k < new_end)
            first_new = next((k for k in inside if self._known(k) == new_v), None)
            hi = first_new if first_new is not None else new_end
            lo = max((k for k in inside if k < hi and self._known(k) == old_v), default=old_end)
        ends_known = a is not None and b is not None
        open_ = any(k not in self.seen for k in range(lo + 1, hi))
        status = None
        if ends_known and not open_:
            status = AMBIGUOUS if hi - lo > 1 else FOUND
        return Where(old_end, new_end, lo, hi, status, old_v, new_v, first_new)

    # -- what to start -------------------------------------------------------------------------

    def _split(self, lo: int, hi: int, taken: set[int]) -> int | None:
        """The untested release nearest the middle of the largest stretch of untested releases in
        (lo, hi) between the probes in `taken`; None when none is untested."""
        cuts = [lo, *sorted(k for k in taken if lo < k < hi), hi]
        middle = (lo + hi) / 2
        best: tuple[int, float, int] | None = None
        choice = None
        for a, b in zip(cuts, cuts[1:], strict=False):
            untested = [k for k in range(a + 1, b) if k not in self.seen and k not in taken]
            if not untested:
                continue
            n = len(untested)
            pick = untested[max(0, (n + 1) // 2 - 1)]
            key = (-n, abs((a + b) / 2 - middle), a)
            if best is None or key < best:
                best, choice = key, pick
        return choice

    def wanted(self, free: int) -> list[int]:
        """Up to `free` releases to start now: an end not answered yet first, then the splits."""
        w = self.where()
        if w.status is not None or free <= 0:
            return []
        picks: list[int] = []
        taken = set(self.running)
        for end in (w.old_end, w.new_end if w.new_end is not None else len(self.versions) - 1):
            if end is not None and end not in self.seen and end not in taken and len(picks) < free:
                picks.append(end)
                taken.add(end)
        if w.old_end is None or w.new_end is None:
            return picks
        while len(picks) < free:
            k = self._split(w.lo, w.hi, taken)
            if k is None:
                break
            picks.append(k)
            taken.add(k)
        return picks

    def ahead(self) -> list[int]:
        """What a slot may be given next, whichever running probe answers first: the split of each
        stretch the running probes leave in the interval, the stretch nearest the middle first."""
        w = self.where()
        if w.status is not None or w.old_end is None or w.new_end is None:
            return []
        cuts = [w.lo, *sorted(k for k in self.running if w.lo < k < w.hi), w.hi]
        middle = (w.lo + w.hi) / 2
        parts = sorted(zip(cuts, cuts[1:], strict=False), key=lambda p: abs((p[0] + p[1]) / 2 - middle))
        out: list[int] = []
        for a, b in parts:
            k = self._split(a, b, set(self.running))
            if k is not None and k not in out:
                out.append(k)
        return out

    def start(self, indices: list[int]) -> None:
        if indices:
            self.starts += 1
            self.running.update(indices)

    def answer(self, i: int, probe: Probe) -> None:
        if not isinstance(probe, Probe):
            raise BisectError(f"the probe for {self.versions[i]} returned {type(probe).__name__}, not a Probe.")
        if probe.version != self.versions[i]:
            raise BisectError(f"asked to probe {self.versions[i]}, the probe answered for {probe.version}.")
        self.running.discard(i)
        self.seen[i] = probe
        self.steps.append(probe)

    def useless(self) -> list[int]:
        """The running probes whose answers the search no longer needs: outside the interval and not
        an end still to be answered, or every one once the search is over."""
        w = self.where()
        if w.status is not None:
            return sorted(self.running)
        ends = {e for e in (w.old_end, w.new_end) if e is not None}
        if w.old_end is None or w.new_end is None:
            ends.add(len(self.versions) - 1)
        return sorted(k for k in self.running if k not in ends and not w.lo < k < w.hi)

    def stop(self, i: int) -> None:
        """Probe `i` was stopped before it answered (it may be asked again if it is needed again)."""
        self.running.discard(i)
        self.stopped.append(i)

    @property
    def finished(self) -> bool:
        return not self.running and self.where().status is not None

    # -- the answer ----------------------------------------------------------------------------

    def _reason(self, i: int) -> str:
        p = self.seen[i]
        return p.reason.strip().rstrip(".") or p.verdict

    def result(self) -> BisectResult:
        w = self.where()
        v = self.versions
        last = len(v) - 1
        notes: list[str] = []
        for i in dict.fromkeys(k for k in self.stopped if k not in self.seen):
            notes.append(f"{v[i]} was stopped before it answered: the other probes' answers made it unnecessary")
        old_end, new_end = w.old_end, w.new_end
        skipped_old = [i for i in range(0, old_end if old_end is not None else last) if i in self.seen]
        if skipped_old:
            tail = f"using {v[old_end]} as the old end" if old_end is not None else "no runnable old end"
            notes.append("; ".join([*(f"{v[i]} skipped: {self._reason(i)}" for i in skipped_old), tail]))
        if old_end is not None:
            stop = new_end if new_end is not None else old_end
            skipped_new = [j for j in range(last, stop, -1) if j in self.seen]
            if skipped_new:
                tail = f"using {v[new_end]} as the new end" if new_end is not None else "no runnable new end"
                notes.append("; ".join([*(f"{v[j]} skipped: {self._reason(j)}" for j in skipped_new), tail]))
        base = {"from_version": v[0], "to_version": v[-1], "width": self.width, "rounds": self.starts,
                "eager": True}
        if w.status == NO_RUNNABLE_PAIR:
            if old_end is not None:
                known = {"from_verdict": self.seen[old_end].outcome, "old_end": v[old_end]}
            elif self._known(last) not in (None, SKIP):
                known = {"to_verdict": self.seen[last].outcome, "new_end": v[last]}
            else:
                known = {}
            return BisectResult(status=NO_RUNNABLE_PAIR, steps=tuple(self.steps), notes=tuple(notes), **base,
                                **known)
        assert old_end is not None and new_end is not None and w.status is not None
        ends = {"from_verdict": w.old_verdict, "to_verdict": w.new_verdict, "old_end": v[old_end],
                "new_end": v[new_end]}
        if w.status == NO_CHANGE:
            return BisectResult(status=NO_CHANGE, steps=tuple(self.steps), notes=tuple(notes), **base, **ends)
        for p in self.steps:  # skips inside the ends, in the order they answered
            i = v.index(p.version)
            if old_end < i < new_end and p.outcome == SKIP:
                notes.append(f"{p.version} skipped: {self._reason(i)}")
        if w.first_new is not None:
            for i in sorted(self.seen):
                if w.first_new < i < new_end and self._known(i) == w.old_verdict:
                    notes.append(f"{v[i]} answered {w.old_verdict} after {v[w.first_new]} answered "
                                 f"{w.new_verdict}: the verdict changes more than once in this range")
        between = tuple(v[w.lo + 1:w.hi])
        if between:
            notes.append(f"the boundary is ambiguous: {', '.join(between)} could not be run between "
                         f"{v[w.lo]} and {v[w.hi]}")
        return BisectResult(status=AMBIGUOUS if between else FOUND, steps=tuple(self.steps), notes=tuple(notes),
                            **base, **ends, last_old=v[w.lo], first_new=v[w.hi], ambiguous=bool(between),
                            skipped_between=between)


def run_eager(versions: Sequence[str], probe: Callable[[str], Probe], width: int, *,
              prepare: Callable[[list[str]], None] | None = None,
              on_interrupt: Callable[[], None] = lambda: None) -> BisectResult:
    """The search above with `probe(version)` on daemon threads, at most `width` at once. The first
    exception a probe raises stops new starts; it is raised once the running probes have ended.
    Ctrl-C calls `on_interrupt` (it removes the containers, so the probes end) and goes on."""
    s = EagerSearch(versions, width)
    done: queue.Queue[tuple[int, Probe | None, BaseException | None]] = queue.Queue()
    failure: BaseException | None = None
    stops: dict[int, threading.Event] = {}

    def one(i: int, stop: threading.Event) -> None:
        try:
            with cancel.scope(stop):
                answer = probe(s.versions[i])
            done.put((i, answer, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread (Cancelled too)
            done.put((i, None, exc))

    hinted: list[int] = []
    try:
        while True:
            if failure is None:
                todo = s.wanted(s.width - len(s.running))
                s.start(todo)
                for i in todo:
                    stops[i] = threading.Event()
                    threading.Thread(target=one, args=(i, stops[i]), daemon=True,
                                     name=f"lab-probe-{s.versions[i]}").start()
                later = s.ahead()
                if prepare is not None and later and later != hinted:
                    hinted = later
                    prepare([s.versions[i] for i in later])
            if not s.running:
                break
            while True:
                try:
                    i, answer, exc = done.get(timeout=0.5)
                    break
                except queue.Empty:
                    continue
            if isinstance(exc, cancel.Cancelled):
                s.stop(i)
            elif exc is not None:
                s.running.discard(i)
                failure = failure or exc
            else:
                assert answer is not None
                s.answer(i, answer)
            for k in s.useless():
                stops[k].set()
    except KeyboardInterrupt:
        on_interrupt()
        raise
    if failure is not None:
        raise failure
    return s.result()
