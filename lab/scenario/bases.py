"""The base images the lab knows, in one table: the default base, and what each distribution ships
(its python3, what `apt-get install python3` gives, and its glibc: wheels tagged up to
manylinux_2_<N> load there)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_BASE = "debian:bookworm"   # a scenario's base when nothing says otherwise (new scenarios, issues)
OLD_BASE = "debian:bullseye"       # Python 3.9: for torch.compile before 2.1.0, which refuses Python 3.11
DEFAULT_GLIBC = (2, 28)            # a distribution the lab does not know: manylinux_2_28


@dataclass(frozen=True)
class KnownBase:
    name: str                      # how a scenario names it
    pattern: re.Pattern[str]
    python: str                    # X.Y of its python3
    glibc: tuple[int, int]

    @property
    def bootstrappable(self) -> bool:
        """Whether the lab can make it with no registry: a Debian suite from Debian's archive."""
        return self.name.startswith("debian:")


BASES = (
    KnownBase("debian:bookworm", re.compile(r"debian:(bookworm|12)"), "3.11", (2, 36)),
    KnownBase("debian:trixie", re.compile(r"debian:(trixie|13)"), "3.13", (2, 41)),
    KnownBase("debian:bullseye", re.compile(r"debian:(bullseye|11)"), "3.9", (2, 31)),
    KnownBase("ubuntu:22.04", re.compile(r"ubuntu:?(22\.04|jammy)"), "3.10", (2, 35)),
    KnownBase("ubuntu:24.04", re.compile(r"ubuntu:?(24\.04|noble)"), "3.12", (2, 39)),
    KnownBase("ubuntu:20.04", re.compile(r"ubuntu:?(20\.04|focal)"), "3.8", (2, 31)),
)


def known_base(base: str) -> KnownBase | None:
    return next((b for b in BASES if b.pattern.search(base)), None)


def base_python(base: str) -> str | None:
    """The Python version of a base image's `python3` package, when the base is a known distribution."""
    known = known_base(base)
    return known.python if known else None


def base_glibc(base: str) -> tuple[int, int]:
    """The glibc of a base image; manylinux_2_28 for a distribution the lab does not know."""
    known = known_base(base)
    return known.glibc if known else DEFAULT_GLIBC
