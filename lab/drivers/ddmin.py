"""Delta debugging (Zeller's ddmin) over a set of changes: pure logic, no I/O.

The blame step of a bisection (lab.drivers.blame) knows that applying every change (each differing
package's other version) flips a run's verdict; ddmin narrows them down to a 1-minimal subset that
still flips it: removing any one change from the answer no longer flips it. `test(subset)` answers
True (flips), False (does not) or None (unresolved: the build failed, no verdict), which ddmin
treats as "does not flip", as Zeller's algorithm treats an unresolved test. Each subset is tested
at most once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class DDResult(Generic[T]):
    minimal: tuple[T, ...]                         # a 1-minimal subset that flips (in the input's order)
    tests: list[tuple[tuple[T, ...], bool | None]] = field(default_factory=list)  # each test made, in order


def _split(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out


def ddmin(items: Sequence[T], test: Callable[[tuple[T, ...]], bool | None], *,
          all_flips_known: bool = True) -> DDResult[T]:
    """A 1-minimal subset of `items` for which `test` is True.

    `all_flips_known`: the caller has seen that the whole set flips (not tested again); otherwise
    it is tested first, and when it does not flip the answer is empty."""
    order = {x: i for i, x in enumerate(items)} if all(_hashable(x) for x in items) else None
    seen: dict[tuple, bool | None] = {}
    result: DDResult[T] = DDResult(())

    def check(subset: list[T]) -> bool:
        key = tuple(sorted(subset, key=lambda x: order[x])) if order is not None else tuple(subset)
        if key not in seen:
            seen[key] = test(tuple(subset))
            result.tests.append((tuple(subset), seen[key]))
        return seen[key] is True

    current = list(items)
    if not current:
        return result
    if not all_flips_known and not check(current):
        return result
    seen.setdefault(tuple(current), True)
    n = 2
    while len(current) >= 2:
        chunks = _split(current, n)
        reduced = False
        for chunk in chunks:
            if check(chunk):
                current, n, reduced = chunk, 2, True
                break
        if not reduced and n > 2:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                if check(rest):
                    current, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    result.minimal = tuple(current)
    return result


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True
