"""The eviction rule on made-up entries: least recently used first, never what is in use."""

from __future__ import annotations

import pytest

from lab.cache_policy.policy import CacheInputError, Entry, GiB, choose, default_cap, parse_duration

DAY = 86400.0
NOW = 100 * DAY


def entry(name, size_gib, days_ago, part="site", in_use=None):
    return Entry(part, name, int(size_gib * GiB), NOW - days_ago * DAY, in_use)


ENTRIES = [entry("a", 3, 10), entry("b", 2, 30), entry("c", 4, 1), entry("busy", 5, 60, in_use="a container"),
           entry("img", 6, 20, part="images"), entry("notes", 1, 90, part="other")]
TOTAL = 21 * GiB


def names(chosen):
    return [e.name for e in chosen]


def test_lru_first_until_under_the_cap():
    # 21 GiB held, cap 14: the oldest removable go first (b, 30 d; img, 20 d) -> 13 GiB
    assert names(choose(ENTRIES, total=TOTAL, cap=14 * GiB, now=NOW)) == ["b", "img"]


def test_in_use_and_other_entries_are_never_chosen_even_when_the_cap_is_unreachable():
    chosen = choose(ENTRIES, total=TOTAL, cap=0, now=NOW)
    assert names(chosen) == ["b", "img", "a", "c"]
    assert "busy" not in names(chosen) and "notes" not in names(chosen)


def test_under_the_cap_nothing_is_removed():
    assert choose(ENTRIES, total=TOTAL, cap=TOTAL, now=NOW) == []
    assert choose(ENTRIES, total=TOTAL, cap=None, now=NOW) == []


def test_older_than_takes_every_entry_unused_that_long():
    assert names(choose(ENTRIES, total=TOTAL, now=NOW, older_than=15 * DAY)) == ["b", "img"]


def test_an_entry_that_frees_nothing_is_left_except_with_all():
    base = entry("torch-repro-lab/debian:bookworm-amd64", 0, 50, part="base_images")
    assert base not in choose([*ENTRIES, base], total=TOTAL, cap=0, now=NOW)
    # --all: images before what they are built on, so the base then frees its layers
    everything = names(choose([*ENTRIES, base], total=TOTAL, everything=True, now=NOW))
    assert everything.index("img") < everything.index(base.name)
    assert "busy" not in everything and "notes" not in everything


def test_default_cap_is_30_gib_or_a_quarter_of_what_the_cache_could_use():
    assert default_cap(free=400 * GiB, used=10 * GiB) == 30 * GiB
    assert default_cap(free=30 * GiB, used=10 * GiB) == 10 * GiB


@pytest.mark.parametrize("text, seconds", [("45s", 45), ("90m", 5400), ("12h", 43200), ("7d", 604800),
                                           ("2W", 1209600), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-1d", "seven days"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(CacheInputError, match="--older-than"):
        parse_duration(text)
