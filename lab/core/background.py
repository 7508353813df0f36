"""Work started in a thread now and waited for later (a base made while uv works on the host;
collect_env beside an emulated script)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def timed(fn: Callable[..., R], *args) -> tuple[R, float]:
    """fn(*args) and the seconds it took."""
    started = time.monotonic()
    return fn(*args), time.monotonic() - started


def beside(fn: Callable[[], R]) -> Callable[[], R]:
    """Start `fn` in a thread now; the function returned waits for its answer (or raises its error).
    The thread is a daemon: a run stopped by Ctrl-C does not wait for it."""
    done: list = []

    def work() -> None:
        try:
            done.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.append((False, exc))

    thread = threading.Thread(target=work, daemon=True, name="lab-beside")
    thread.start()

    def answer() -> R:
        thread.join()
        ok, value = done[0]
        if not ok:
            raise value
        return value
    return answer
