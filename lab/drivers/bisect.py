"""Bisection over an ordered list of releases: pure logic, no I/O.

The driver hands in the candidate releases (oldest first, already cut to
[--from, --to]) and a `probe(version) -> Probe` callable that builds, runs and
judges one release (and, to resume, reuses a run folder it already has). This
module only decides which release to probe next, like mozregression's
`Bisection`: both ends first, then binary search.

A probe whose verdict says nothing about the bug (`error`, `timeout`: a failed
build or install, a crash under emulation) is a *skip*, as in `git bisect skip`.
A skipped release is never reported as a boundary. When an end is skipped, the
nearest runnable release inwards stands in for it; when a midpoint is skipped,
the untested release nearest the middle is tried instead. If skips surround the
boundary, the result is `ambiguous` and names the range.

With `width` S > 1 (S probes can run at once), each round probes S releases that split what
is left into S+1 parts (k-ary bisection): ceil(log_(S+1) K) rounds instead of ceil(log2 K)
probes one after another. The ends are probed together in the first round. With S = 1 the
order is exactly the binary search's, and for a verdict that changes once, every width finds
the same boundary.

The search is deterministic: the same list, width and probe answers give the same probe
order, so a resumed bisection asks for the same releases again.

`prepare(versions)`, when given, is told before each round which releases the *next* round may ask
for, whatever this round answers (both possible midpoints; with width S, the S picks of each of the
S+1 parts this round leaves), nearest first, so the driver makes them ready (installs, site trees)
while this round runs. It is a hint: it never changes which releases are probed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lab.core.errors import BisectError
from lab.core.results import (
    AMBIGUOUS,
    FOUND,
    NO_CHANGE,
    NO_RUNNABLE_PAIR,
    NOT_REPRODUCED,
    OUTCOMES,
    REPRODUCED,
    SKIP,
    BisectResult,
    Probe,
    outcome_of,
)
from lab.drivers.bisect_eager import run_eager

__all__ = ["AMBIGUOUS", "FOUND", "NO_CHANGE", "NO_RUNNABLE_PAIR", "NOT_REPRODUCED", "OUTCOMES", "REPRODUCED",
           "SKIP", "BisectError", "BisectResult", "Probe", "bisect", "cost_bound", "outcome_of"]


def cost_bound(k: int) -> int:
    """The most non-skipped probes a bisection over `k` releases makes: ceil(log2 k) + 2."""
    return (k - 1).bit_length() + 2 if k > 0 else 0


def rounds_bound(k: int, width: int) -> int:
    """The most rounds (without skips) of a bisection over `k` releases probing `width` at once:
    one for the ends, then ceil(log_(width+1) (k-1)) to close the gap between them."""
    if k <= 1:
        return 0
    rounds, gap = 1, k - 1  # releases strictly inside plus one: the gap between the two ends
    while gap > 1:
        gap = -(-gap // (width + 1))
        rounds += 1
    return rounds


class _Search:
    """One bisection: remembers every probe, asks each release at most once."""

    def __init__(self, versions: Sequence[str], probe: Callable[[str], Probe],
                 probe_many: Callable[[list[str]], list[Probe]] | None = None,
                 prepare: Callable[[list[str]], None] | None = None) -> None:
        self.versions = list(versions)
        self.prepare = prepare
        self.probe_fn = probe
        self.probe_many = probe_many or (lambda vs: [probe(v) for v in vs])
        self.seen: dict[int, Probe] = {}
        self.steps: list[Probe] = []
        self.notes: list[str] = []
        self.rounds = 0

    def outcome(self, i: int) -> str:
        self.ask([i])
        return self.seen[i].outcome

    def ask(self, indices: Sequence[int]) -> None:
        """Probe the releases not asked yet, at once (one round)."""
        todo = [i for i in dict.fromkeys(indices) if i not in self.seen]
        if not todo:
            return
        self.rounds += 1
        answers = self.probe_many([self.versions[i] for i in todo]) if len(todo) > 1 else \
            [self.probe_fn(self.versions[todo[0]])]
        if len(answers) != len(todo):
            raise BisectError(f"asked for {len(todo)} probes, got {len(answers)} answers.")
        for i, result in zip(todo, answers, strict=True):
            version = self.versions[i]
            if not isinstance(result, Probe):
                raise BisectError(f"the probe for {version} returned {type(result).__name__}, not a Probe.")
            if result.version != version:
                raise BisectError(f"asked to probe {version}, the probe answered for {result.version}.")
            self.seen[i] = result
            self.steps.append(result)

    def reason(self, i: int) -> str:
        p = self.seen[i]
        return p.reason.strip().rstrip(".") or p.verdict

    def walk(self, start: int, stop: int, step: int, which: str) -> int | None:
        """From the end at `start`, the first runnable release towards (not including) `stop`."""
        skipped: list[str] = []
        i = start
        while i != stop:
            if self.outcome(i) != SKIP:
                break
            skipped.append(f"{self.versions[i]} skipped: {self.reason(i)}")
            i += step
        else:
            i = None
        if skipped:
            tail = f"using {self.versions[i]} as the {which} end" if i is not None else f"no runnable {which} end"
            self.notes.append("; ".join([*skipped, tail]))
        return i

    def pick(self, lo: int, hi: int, width: int = 1) -> list[int]:
        """`width` untested releases that split (lo, hi) into width+1 parts, counted over untested
        releases only (with width 1: the one nearest the middle, so each runnable answer halves
        what is left); [] when every release inside is known."""
        untested = [i for i in range(lo + 1, hi) if i not in self.seen]
        n = len(untested)
        if not n:
            return []
        if width >= n:
            return untested
        return sorted({untested[max(0, (j + 1) * (n + 1) // (width + 1) - 1)] for j in range(width)})

    def ahead(self, lo: int, hi: int, batch: Sequence[int], width: int) -> None:
        """Tell `prepare` what the round after `batch` (probing inside (lo, hi)) may ask for: the picks
        of each part the batch leaves, the parts nearest the batch's middle first."""
        if self.prepare is None:
            return
        cuts = [lo, *sorted(batch), hi]
        parts = [(cuts[j], cuts[j + 1]) for j in range(len(cuts) - 1)]
        middle = (lo + hi) / 2
        parts.sort(key=lambda part: abs((part[0] + part[1]) / 2 - middle))
        known = set(self.seen) | set(batch)
        later: list[int] = []
        for a, b in parts:
            untested = [i for i in range(a + 1, b) if i not in known]
            n = len(untested)
            if not n:
                continue
            picks = untested if width >= n else sorted(
                {untested[max(0, (j + 1) * (n + 1) // (width + 1) - 1)] for j in range(width)})
            later += [i for i in picks if i not in later]
        if later:
            self.prepare([self.versions[i] for i in later])


def bisect(versions: Sequence[str], probe: Callable[[str], Probe], *, width: int = 1,
           probe_many: Callable[[list[str]], list[Probe]] | None = None,
           prepare: Callable[[list[str]], None] | None = None, eager: bool = False,
           on_interrupt: Callable[[], None] = lambda: None) -> BisectResult:
    """Find where the verdict changes between `versions[0]` and `versions[-1]` (oldest first).

    `width` releases are probed per round, through `probe_many(versions) -> probes` (in the same
    order) when given, else one `probe` after another. `prepare(versions)` hears, before each round,
    what the next round may probe (see the module's docstring). With `eager` and `width` > 1, there
    are no rounds: each `probe` runs on its own thread and a slot is given its next release as soon
    as it is free (lab.drivers.bisect_eager; `on_interrupt` is called on Ctrl-C).

    Raises BisectError for fewer than two releases or repeated ones. Every other
    situation is a result: `found`, `ambiguous` (skips hide the exact boundary),
    `no_change` (the runnable ends agree) or `no_runnable_pair`.
    """
    versions = list(versions)
    if len(versions) < 2:
        raise BisectError(
            "there is nothing to bisect: " + (f"only {versions[0]} is a candidate release in the range"
                                              if versions else "no candidate releases in the range") + ".",
            hint="Widen --from/--to so that the range holds at least two releases.")
    repeated = sorted({v for v in versions if versions.count(v) > 1})
    if repeated:
        raise BisectError(f"the candidate releases repeat {', '.join(repeated)}; each must appear once.")

    width = max(1, width)
    if eager and width > 1:
        return run_eager(versions, probe, width, prepare=prepare, on_interrupt=on_interrupt)
    s = _Search(versions, probe, probe_many, prepare)
    last = len(versions) - 1
    if prepare is not None:  # while the ends run: the new end (serial) and the first round inside
        first = s.pick(0, last, width)
        prepare([versions[i] for i in ([] if width > 1 else [last]) + first])
    if width > 1:
        s.ask([0, last])
    s.outcome(0)
    s.outcome(last)
    lo = s.walk(0, last, 1, "old")
    hi = s.walk(last, lo, -1, "new") if lo is not None else None
    base = {"from_version": versions[0], "to_version": versions[-1]}

    def done(status: str, **kw) -> BisectResult:
        return BisectResult(status=status, steps=tuple(s.steps), notes=tuple(s.notes), width=width,
                            rounds=s.rounds, **base, **kw)

    if lo is None or hi is None:
        if lo is not None:
            known = {"from_verdict": s.seen[lo].outcome, "old_end": versions[lo]}
        elif s.seen[last].outcome != SKIP:
            known = {"to_verdict": s.seen[last].outcome, "new_end": versions[last]}
        else:
            known = {}
        return done(NO_RUNNABLE_PAIR, **known)
    old_verdict, new_verdict = s.seen[lo].outcome, s.seen[hi].outcome
    ends = {"from_verdict": old_verdict, "to_verdict": new_verdict,
            "old_end": versions[lo], "new_end": versions[hi]}
    if old_verdict == new_verdict:
        return done(NO_CHANGE, **ends)

    while batch := s.pick(lo, hi, width):
        s.ahead(lo, hi, batch, width)
        s.ask(batch)
        # the boundary lies after the last old answer before the first new one
        first_new = next((i for i in batch if s.seen[i].outcome == new_verdict), None)
        for i in batch:
            answer = s.seen[i].outcome
            if answer not in (old_verdict, new_verdict):
                s.notes.append(f"{versions[i]} skipped: {s.reason(i)}")
            elif answer == new_verdict:
                hi = min(hi, i) if i == first_new else hi
            elif first_new is None or i < first_new:
                lo = max(lo, i)
            else:  # old again after a new answer in the same round: the verdict changed more than once
                s.notes.append(f"{versions[i]} answered {answer} after {versions[first_new]} answered "
                               f"{new_verdict}: the verdict changes more than once in this range")

    between = tuple(versions[lo + 1:hi])  # all probed, all skipped
    if between:
        s.notes.append(f"the boundary is ambiguous: {', '.join(between)} could not be run between "
                       f"{versions[lo]} and {versions[hi]}")
    return done(AMBIGUOUS if between else FOUND, **ends, last_old=versions[lo], first_new=versions[hi],
                ambiguous=bool(between), skipped_between=between)
