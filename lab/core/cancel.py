"""Stopping one run from another thread, when its answer is no longer needed.

An eager bisection (lab.drivers.bisect_eager) starts a probe on each free slot before it knows
whether the probes still running will make that one useless; when they do, the search asks the
probe to stop instead of waiting for it. The probe's thread runs inside `scope(event)`; the engines'
wait loops (Docker, local) look at `requested()` between polls and, once the event is set, kill the
run and raise `Cancelled`. `Cancelled` is a BaseException, like KeyboardInterrupt, so no `except
Exception` on the way turns it into a verdict: a stopped run has no verdict and leaves none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CURRENT: ContextVar[threading.Event | None] = ContextVar("lab_cancel", default=None)


class Cancelled(BaseException):  # noqa: N818 - like KeyboardInterrupt: a request, not an error
    """The run was stopped because its answer is no longer needed."""


@contextmanager
def scope(event: threading.Event) -> Iterator[None]:
    """Runs in this thread (and this context) stop once `event` is set."""
    token = _CURRENT.set(event)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def requested() -> bool:
    """Whether the run in this thread was asked to stop."""
    event = _CURRENT.get()
    return event is not None and event.is_set()
