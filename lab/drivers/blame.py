"""Blame at a bisection's boundary: torch, or the packages around it?

A bisection changes torch and, with it, every dependency that resolves differently for the two
releases (or, under `deps: latest`, whatever the index serves today). After it finds
(last_old, first_new), this step asks whether torch alone flips the verdict:

1. each side rebuilt with the other side's dependency set (when the sets differ), then
2. each side rebuilt with its own era's set (lab.image.era), where that differs from what it ran.

The first rebuild whose verdict flips is narrowed down by delta debugging (lab.drivers.ddmin) over
the packages that differ, one run per step, to the smallest set that flips it; those packages are
the blame. When no rebuild flips, torch alone flips the verdict (its dependency set was the same on
both sides, or swapping it changed nothing), and the blame is `torch`. When the sets differ and no
rebuild with the other side's set gave a verdict (it could not be resolved or built), there is no
blame: the summary says it is not known, and why.

Pure orchestration: the runs and the era sets come in as callables (lab.drivers.bisect_run gives
real ones, unit tests fakes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from lab.core.records import Events, no_events
from lab.core.results import NOT_REPRODUCED, REPRODUCED, SKIP, BisectResult, Blamed, BlameStep, outcome_of
from lab.drivers.ddmin import ddmin

# (torch, full pin set {name: version}, label, changed packages) -> the finished step
RunWith = Callable[[str, dict[str, str], str, tuple[str, ...]], BlameStep]
EraSet = Callable[[str], "dict[str, str] | None"]   # torch -> its era's set; None when unknown


@dataclass(frozen=True)
class Check:
    torch: str                 # the side rebuilt
    verdict: str               # its outcome with the set it ran with
    ran: dict[str, str]        # the set it ran with
    other: dict[str, str]      # the set it is rebuilt with
    words: str                 # "2.3.0's dependencies", "its era's dependencies (as of ...)"
    era: bool                  # the other set is its era's (else the other side's)
    other_torch: str = ""      # the other side (for a cross check)


def diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Packages whose version differs (or that one side lacks), sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def blame_boundary(result: BisectResult, sets: tuple[dict[str, str] | None, dict[str, str] | None],
                   run_with: RunWith, era_set: EraSet, events: Events = no_events,
                   failed_differently: str = SKIP) -> dict:
    """The fields of BisectResult the blame step fills (blame, blame_summary, blame_fix, blame_steps)."""
    old, new = result.last_old, result.first_new
    steps: list[BlameStep] = []
    if not old or not new or result.status != "found":
        return {"blame_summary": "not run: the bisection found no boundary"}
    set_old, set_new = sets
    if set_old is None or set_new is None:
        return {"blame_summary": "not run: a boundary probe has no pip freeze (what it installed is unknown)"}
    v_old, v_new = result.from_verdict or "", result.to_verdict or ""
    checks: list[Check] = []
    if diff(set_old, set_new):
        checks.append(Check(old, v_old, set_old, set_new, f"{new}'s dependencies", False, new))
        checks.append(Check(new, v_new, set_new, set_old, f"{old}'s dependencies", False, old))
    eras = {}
    for version, ran, verdict in ((old, set_old, v_old), (new, set_new, v_new)):
        try:
            eras[version] = era_set(version)
        except Exception as exc:  # noqa: BLE001 - an unknown era is a note, never a failed bisection
            events("blame", f"the era of torch {version} is unknown: {exc}")
            eras[version] = None
        era = eras[version]
        if era is not None and diff(ran, {k: era[k] for k in era}):
            checks.append(Check(version, verdict, ran, era, "its era's dependencies", True))
    if not checks:
        return {"blame": (Blamed(package="torch", old=old, new=new),),
                "blame_summary": f"torch alone flips the verdict: {old} and {new} ran with the same dependency "
                                 "set, and each one's era has the same",
                "blame_fix": "torch alone"}
    flipped: Check | None = None
    for n, c in enumerate(checks, 1):
        changed = tuple(diff(c.ran, c.other))
        events("blame", f"torch {c.torch} with {c.words} ({len(changed)} packages differ: "
                        f"{', '.join(changed[:8])}{'...' if len(changed) > 8 else ''})")
        step = run_with(c.torch, merged(c.ran, c.other, changed), f"check{n}", changed)
        step = _judged(step, c.verdict, failed_differently)
        steps.append(step.model_copy(update={"label": f"torch {c.torch} with {c.words}"}))
        if step.flips:
            flipped = c
            break
    crossed = [s for c, s in zip(checks, steps, strict=False) if not c.era and s.flips is False]
    if flipped is None and diff(set_old, set_new) and not crossed:
        # the two sides ran with different sets and no rebuild with the other side's set gave a verdict:
        # whether torch alone flips it is not known (each side's own era, kept or not, does not say)
        return {"blame_summary": "not known: the two sides ran with different dependencies and no rebuild "
                                 f"with the other side's set gave a verdict ({_tried(steps)})",
                "blame_steps": tuple(steps)}
    if flipped is None:
        return {"blame": (Blamed(package="torch", old=old, new=new),),
                "blame_summary": "torch alone flips the verdict: every rebuild kept its side's verdict "
                                 f"({_tried(steps)})",
                "blame_fix": "torch alone", "blame_steps": tuple(steps)}
    c = flipped
    packages = diff(c.ran, c.other)
    count = [0]

    def test(subset: tuple[str, ...]) -> bool | None:
        count[0] += 1
        events("blame", f"ddmin step {count[0]}: torch {c.torch} with {', '.join(subset)} from {c.words}")
        step = _judged(run_with(c.torch, merged(c.ran, c.other, subset), f"dd{count[0]}", subset),
                       c.verdict, failed_differently)
        steps.append(step.model_copy(update={"label": f"ddmin {count[0]}: torch {c.torch} with {c.words} "
                                                      f"for {', '.join(subset)}"}))
        return step.flips
    found = ddmin(packages, test).minimal
    blamed = tuple(_entry(p, c) for p in found)
    summary, fix = sentence(c, blamed, old, new)
    return {"blame": blamed, "blame_summary": summary, "blame_fix": fix, "blame_steps": tuple(steps)}


def merged(ran: dict[str, str], other: dict[str, str], packages) -> dict[str, str]:
    """`ran` with `packages` taken from `other` (a package `other` lacks is dropped)."""
    out = dict(ran)
    for p in packages:
        if p in other:
            out[p] = other[p]
        else:
            out.pop(p, None)
    return out


def _judged(step: BlameStep, base: str, failed_differently: str) -> BlameStep:
    outcome = outcome_of(step.verdict, failed_differently)
    flips = None if outcome == SKIP else outcome != base
    return step.model_copy(update={"flips": flips})


def _tried(steps: list[BlameStep]) -> str:
    return "; ".join(f"{s.label}: {s.verdict}" for s in steps) or "no rebuild"


def _entry(package: str, c: Check) -> Blamed:
    """old: the older side's (or the era's) version; new: the newer side's (or what it ran with)."""
    if c.era:
        return Blamed(package=package, old=c.other.get(package), new=c.ran.get(package))
    a, b = (c.ran, c.other) if _version(c.torch) < _version(c.other_torch) else (c.other, c.ran)
    return Blamed(package=package, old=a.get(package), new=b.get(package))


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _word(verdict: str) -> str:
    return {REPRODUCED: "reproduces", NOT_REPRODUCED: "does not reproduce"}.get(verdict, verdict)


def sentence(c: Check, blamed: tuple[Blamed, ...], old: str, new: str) -> tuple[str, str]:
    """The answer in words, and the line a maintainer can act on."""
    names = ", ".join(b.package for b in blamed) or "the dependency set"
    flipped = NOT_REPRODUCED if c.verdict == REPRODUCED else REPRODUCED
    if c.era:
        versions = "; ".join(f"{c.torch}'s era: {b.package} {b.old}, what it ran with: {b.new}" for b in blamed)
        summary = (f"the verdict on torch {c.torch} ({_word(c.verdict)}) depends on {names} ({versions}); "
                   f"with its era's {names}, torch {c.torch} {_word(flipped)}")
    else:
        versions = "; ".join(f"{b.package} {b.old} on {old}'s side, {b.new} on {new}'s" for b in blamed)
        summary = (f"the verdict on torch {c.torch} ({_word(c.verdict)}) depends on {names} ({versions}); "
                   f"with {c.words} for {names}, torch {c.torch} {_word(flipped)}")
    fix = "; ".join(_pin(b) for b in blamed)
    line = f"{c.torch}".rsplit(".", 1)[0] + ".x"
    return summary, f"pin {fix} on torch <= {line}" if c.torch == old else f"pin {fix} on torch >= {line}"


def _pin(b: Blamed) -> str:
    """`numpy<2` when the major version changed, else `name==old`."""
    try:
        o, n = Version(b.old or ""), Version(b.new or "")
    except InvalidVersion:
        return f"{b.package}=={b.old}"
    if o.major < n.major:
        return f"{b.package}<{n.major}"
    return f"{b.package}=={b.old}"
