"""torch releases and the day each reached PyPI (the first upload of its files), to pick the release
that was current on an issue's date, and the release branch cuts, to pick the release that first
shipped a nightly's or a source build's code.

Read from https://pypi.org/pypi/torch/json on 2026-11-25. A release newer than this table is still
usable with --torch; the table only feeds the inference."""

from __future__ import annotations

from datetime import date

from packaging.version import InvalidVersion, Version

__all__ = ["BRANCH_CUTS", "CUT_1_13", "RELEASES", "MIN_CP311", "MIN_COMPILE", "before", "first_of", "newest",
           "normalize", "OLDER", "on_date", "python_for", "shipped_after", "wheel_pythons"]

RELEASES: tuple[tuple[str, date], ...] = tuple((v, date.fromisoformat(d)) for v, d in (
    ("1.13.0", "2022-10-28"), ("1.13.1", "2022-12-15"), ("2.0.0", "2023-03-15"), ("2.0.1", "2023-05-08"),
    ("2.1.0", "2023-10-04"), ("2.1.1", "2023-11-15"), ("2.1.2", "2023-12-14"), ("2.2.0", "2024-01-30"),
    ("2.2.1", "2024-02-22"), ("2.2.2", "2024-03-27"), ("2.3.0", "2024-04-24"), ("2.3.1", "2024-06-05"),
    ("2.4.0", "2024-07-24"), ("2.4.1", "2024-09-04"), ("2.5.0", "2024-10-17"), ("2.5.1", "2024-10-29"),
    ("2.6.0", "2025-01-29"), ("2.7.0", "2025-04-23"), ("2.7.1", "2025-06-04"), ("2.8.0", "2025-08-06"),
    ("2.9.0", "2025-10-15"), ("2.9.1", "2025-11-12"), ("2.10.0", "2026-01-21"), ("2.11.0", "2026-03-23"),
    ("2.12.0", "2026-05-13"), ("2.12.1", "2026-06-17"), ("2.13.0", "2026-07-08"), ("2.14.0", "2026-09-02"),
    ("2.14.1", "2026-09-30"), ("2.15.0", "2026-10-28"),
))
# Releases before 1.13.0, which have no CPython 3.11 wheel: a page that names one keeps it, and its
# scenario gets a base whose python3 the release has wheels for (lab.issue.infer._base). Not used to
# place a date (`on_date`), only a version the page names.
OLDER: tuple[tuple[str, date], ...] = tuple((v, date.fromisoformat(d)) for v, d in (
    ("1.10.0", "2021-10-21"), ("1.10.1", "2021-12-15"), ("1.10.2", "2022-01-27"), ("1.11.0", "2022-03-10"),
    ("1.12.0", "2022-06-28"), ("1.12.1", "2022-08-05"),
))
# When each release branch was cut from main: code on main up to that day first shipped in that minor
# release. From the "Release cadence table" of pytorch/pytorch's RELEASE.md (read through the search
# tool's stored copy on 2026-11-27); where it gives only a month ("Aug 2023"), its last day is taken,
# so a nightly of the cut's own month can be placed one release early. 1.13 and 2.0 are not in that
# table: before 2.1's cut, a nightly's own version says its release.
BRANCH_CUTS: tuple[tuple[str, date], ...] = tuple((v, date.fromisoformat(d)) for v, d in (
    ("2.1", "2023-08-31"), ("2.2", "2023-12-31"), ("2.3", "2024-03-31"), ("2.4", "2024-06-30"),
    ("2.5", "2024-09-30"), ("2.6", "2024-12-31"), ("2.7", "2025-03-31"), ("2.8", "2025-06-30"),
    ("2.9", "2025-09-30"), ("2.10", "2025-12-31"), ("2.11", "2026-02-16"), ("2.12", "2026-04-13"),
    ("2.13", "2026-06-08"), ("2.14", "2026-08-10"), ("2.15", "2026-10-05"), ("2.16", "2026-11-30"),
))
# 1.13's cut is not in that table either: "[v.1.13.0] Release Tracker" (pytorch/pytorch#86312, opened
# 2022-10-05) says the release/1.13 branch had been cut; 1.12.0 was out on 2022-06-28, so main between
# the two was 1.13's code. A 1.13.0.devYYYYMMDD nightly of September 2022 is therefore rightly 1.13.0: a
# bug fixed on main before 2022-10-05 never shipped in a 1.13 release.
CUT_1_13 = date(2022, 10, 5)
RELEASE_1_12 = date(2022, 6, 28)
# CPython versions each release has x86-64 Linux wheels for (PyPI's files for torch, read 2026-11-28).
# Before 1.13.0 there is no cp311 wheel; from 2.9.0 no cp39 and from 2.15.0 no cp310 wheel.
_PY = {"1.10": ("3.8", "3.9"), "1.11": ("3.8", "3.9", "3.10"), "1.12": ("3.8", "3.9", "3.10"),
       "1.13": ("3.8", "3.9", "3.10", "3.11"), "2.0": ("3.8", "3.9", "3.10", "3.11"),
       "2.1": ("3.8", "3.9", "3.10", "3.11"), "2.2": ("3.8", "3.9", "3.10", "3.11", "3.12"),
       "2.3": ("3.8", "3.9", "3.10", "3.11", "3.12"), "2.4": ("3.8", "3.9", "3.10", "3.11", "3.12"),
       "2.5": ("3.9", "3.10", "3.11", "3.12", "3.13"), "2.6": ("3.9", "3.10", "3.11", "3.12", "3.13"),
       "2.7": ("3.9", "3.10", "3.11", "3.12", "3.13"), "2.8": ("3.9", "3.10", "3.11", "3.12", "3.13"),
       "2.15": ("3.11", "3.12", "3.13", "3.14", "3.15")}
_PY_2_9_ON = ("3.10", "3.11", "3.12", "3.13", "3.14")  # 2.9.0 to 2.14.1
MIN_CP311 = "1.13.0"   # the first torch with CPython 3.11 wheels (debian:bookworm's python3)
MIN_COMPILE = "2.0.0"  # the first with torch.compile and torch._dynamo


def wheel_pythons(version: str) -> tuple[str, ...]:
    """The CPython versions (X.Y) a release has x86-64 Linux wheels for; () for one the table does not
    know (older than 1.10, or newer than 2.15 and so probably like 2.15)."""
    v = Version(Version(version).base_version)
    minor = f"{v.major}.{v.minor}"
    if minor in _PY:
        return _PY[minor]
    if Version("2.9") <= v < Version("2.15"):
        return _PY_2_9_ON
    return _PY["2.15"] if v > Version("2.15") else ()


def python_for(version: str, preferred: str | None) -> str | None:
    """The Python to run `version` in: `preferred` (a base's python3) when the release has wheels for it,
    else the newest it has wheels for that is older than `preferred` (or, when none is older, the
    oldest newer one); None when the table does not know the release."""
    tags = wheel_pythons(version)
    if not tags:
        return None
    if preferred is None or preferred in tags:
        return preferred or tags[-1]
    key = Version(preferred)
    older = [t for t in tags if Version(t) < key]
    return older[-1] if older else tags[0]


def newest() -> str:
    return RELEASES[-1][0]


def on_date(day: date) -> str | None:
    """The newest release published on or before `day` (None before the table starts)."""
    found = [v for v, d in RELEASES if d <= day]
    return found[-1] if found else None


def before(version: str) -> str | None:
    """The newest release older than `version`'s release (2.2.0a0+git... -> 2.1.2)."""
    target = Version(Version(version).base_version)
    found = [v for v, _ in RELEASES if Version(v) < target]
    return found[-1] if found else None


def first_of(version: str) -> str | None:
    """The oldest release at or after `version`'s release (2.4.0.dev20240521 -> 2.4.0; None when the
    table has none yet)."""
    target = Version(Version(version).base_version)
    found = [v for v, _ in RELEASES if Version(v) >= target]
    return found[0] if found else None


def shipped_after(day: date) -> tuple[str, str] | None:
    """(release, why) for code on main on `day` (a nightly's date, a build from main): the first
    release of the first minor whose branch was cut on or after that day. None before 2.1's cut, or
    when that release is not out yet (then the newest is the nearest, said by the caller)."""
    previous = next(d for v, d in RELEASES if v == "2.0.0")  # 2.0's cut came before its release
    if RELEASE_1_12 < day <= CUT_1_13:
        return "1.13.0", f"main on {day} shipped first in 1.13.0 (its branch was cut by {CUT_1_13:%Y-%m-%d})"
    if day <= previous:
        return None  # 2.0's cut is not in the table: before 2.0.0 was out, main may be 2.0's or 2.1's
    for minor, cut in BRANCH_CUTS:
        if cut >= day:
            first = next((v for v, _ in RELEASES if Version(v).release[:2] == Version(minor).release[:2]), None)
            if first is None:
                return None
            return first, f"main on {day} shipped first in {first} (its branch was cut {cut:%Y-%m-%d} or before)"
    return None


def normalize(text: str) -> tuple[str, str | None]:
    """(a release of the table, why it differs from `text` or None). Local labels (+cpu, +cu121) are
    dropped; a pre-release, nightly or source build becomes the release before it; 2.1 becomes its
    newest patch release; a version newer than the table becomes the newest release."""
    try:
        v = Version(text)
    except InvalidVersion:
        return newest(), f"{text!r} is not a version"
    known = {Version(r): r for r, _ in RELEASES}
    public = Version(v.public)
    if public.is_prerelease or public.is_devrelease:
        # a nightly (2.4.0.dev20240521) or a source build (2.3.0a0+git...) of X.Y.0 is main's code before
        # X.Y's branch cut: it first shipped in X.Y.0
        kind = ("a nightly" if public.is_devrelease and not public.pre else
                "a release candidate" if public.pre and public.pre[0] == "rc" and not v.local else "a source build")
        own = first_of(text)
        shipped = next((r for r, _ in OLDER if Version(r) == Version(public.base_version)), None)
        if shipped is not None:
            py = python_for(shipped, "3.11")
            return shipped, f"{text} is {kind} of {public.base_version}: {shipped}, the release that first " \
                            f"shipped its code (no wheel for Python 3.11: a base with Python {py})"
        if Version(public.base_version) < Version(RELEASES[0][0]):
            return RELEASES[0][0], f"{text} is {kind} of {public.base_version}, older than any release with " \
                                   f"wheels for the lab's Python: {RELEASES[0][0]}"
        if own is None:
            return newest(), f"{text} is {kind} of {public.base_version}, newer than the releases the lab knows: " \
                             f"the newest, {newest()}"
        if Version(own).release[:2] != public.release[:2]:
            return own, f"{text} is {kind} of {public.base_version}, which was never released: {own}, the next"
        return own, f"{text} is {kind} of {public.base_version}: {own}, the release that first shipped its code"
    older = {Version(r): r for r, _ in OLDER}
    if public in older:
        return older[public], (f"{text} has no wheel for Python 3.11: it runs on a base with Python "
                               f"{python_for(older[public], '3.11')}"
                               + (", without its local label" if v.local else ""))
    same_minor = [r for r, _ in RELEASES if Version(r).release[:2] == public.release[:2]]
    if len(public.release) == 2 and same_minor:
        return same_minor[-1], f"{text} names no patch release: its newest, {same_minor[-1]}"
    if public in known:
        return known[public], (f"{text} without its local label" if v.local else None)
    if public > Version(newest()):
        return newest(), f"{text} is newer than the releases the lab knows: the newest, {newest()}"
    older = [r for r, _ in RELEASES if Version(r) <= public]
    if older:
        return older[-1], f"{text} is not a release on PyPI: the nearest older one"
    return RELEASES[0][0], f"{text} is older than any release with wheels for the lab's Python"
