"""The eviction rule, apart from the disk and the engine: given what the cache holds, what to remove.

Least recently used first. An entry in use (a container made from the image, a run of the lab in
progress that used it, a hold, a pin) is never chosen, and neither is an image that frees nothing (a
base image or a layer anchor while images built on it remain: removing it would only untag it). A
site tree and the unpacked wheels in uv's cache it was installed from share their files by hard
links, so each alone frees little; they are chosen together by their last use (a run marks both),
and the caller counts again after removing them (lab.cache_policy.inventory.prune).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from lab.core.errors import LabError

GiB = 1024**3
DEFAULT_CAP_MAX = 30 * GiB       # the default cap: this much at most ...
DEFAULT_CAP_SHARE = 0.25         # ... or a quarter of the disk the cache may use, whichever is smaller
LOW_FREE_BYTES = 20 * GiB        # `lab doctor` warns under this much free disk
DISK_MARGIN = 2 * GiB            # `disk_margin` default: a probe does not start unless this much stays free after it

# Parts, in the order `lab cache info` lists them; `--all` removes images before what they are built on.
PARTS = ("images", "anchors", "base_images", "bases", "site", "venv", "uv", "index", "collect_env", "other")
# Not a part one can remove: the bytes linked from entries of several of LINKED_PARTS, which only their
# removal together frees (`lab cache info` shows them after the parts, so that all add up to the total).
LINKED = "linked"
PART_TITLES = {"images": "images the lab built", "anchors": "layer anchors (kept by bisect)",
               "base_images": "base images the lab bootstrapped", "bases": "base rootfs (while bootstrapping)",
               "site": "site trees (cross-installed venvs)", "venv": "the local engine's venvs",
               "uv": "uv's wheel cache",
               "index": "release index", "collect_env": "collect_env answers", "other": "anything else",
               LINKED: "files a tree shares with uv's wheels (hard links)"}

LINKED_PARTS = ("site", "venv", "uv")   # hard-linked to each other (uv installs by linking its cache)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


class CacheInputError(LabError):
    """A bad value given to `lab cache` (such as --older-than)."""


@dataclass(frozen=True)
class Entry:
    """One thing the cache holds that can be removed as a whole."""

    part: str
    name: str
    size: int                 # bytes removing it frees (hard links and shared layers counted where they stay)
    last_used: float          # seconds since the epoch
    in_use: str | None = None  # why it must stay, or None
    ref: object = field(default=None, compare=False, repr=False)  # what the remover needs (a path, an image)
    label: str = ""           # what it is for, in words (a site tree: its torch requirement and target)

    @property
    def removable(self) -> bool:
        return self.in_use is None and self.part != "other"


def parse_duration(text: str, option: str = "--older-than") -> float:
    """'45s', '90m', '12h', '7d', '2w' -> seconds."""
    m = _DURATION.match(text or "")
    if not m:
        raise CacheInputError(f"{option}: {text!r} is not a duration.",
                              hint="Write a number and a unit: s, m, h, d or w, such as 7d or 12h.")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def default_cap(free: int, used: int) -> int:
    """The cap when `cache_cap` is not set: 30 GiB, or a quarter of what the cache could use (the free
    disk plus what it already holds), whichever is smaller."""
    return int(min(DEFAULT_CAP_MAX, DEFAULT_CAP_SHARE * (max(free, 0) + max(used, 0))))


def choose(entries: Sequence[Entry], *, total: int, cap: int | None = None, now: float = 0.0,
           older_than: float | None = None, everything: bool = False) -> list[Entry]:
    """What to remove, in order.

    - `everything`: every removable entry, images before the anchors and bases they are built on;
    - `older_than`: every removable entry not used for that long;
    - else: least recently used first, until the total is at most `cap`.
    """
    removable = [e for e in entries if e.removable]
    if everything:
        return sorted(removable, key=lambda e: (PARTS.index(e.part), e.last_used, e.name))
    # An image that frees nothing only untags (a base others build on); a tree or an unpacked wheel
    # that frees nothing alone shares its files by hard links with the other, which goes with it.
    removable = [e for e in removable if e.size > 0 or e.part in LINKED_PARTS]
    lru = sorted(removable, key=lambda e: (e.last_used, -e.size, e.name))
    if older_than is not None:
        return [e for e in lru if now - e.last_used >= older_than]
    if cap is None or total <= cap:
        return []
    chosen, left = [], total
    for e in lru:
        if left <= cap:
            break
        chosen.append(e)
        left -= e.size
    return chosen
