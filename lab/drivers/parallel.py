"""Run cases at once across the engines of a Fleet: matrix cells and bisect probes.

- `run_all` runs items on daemon threads (at most `workers` at once) and returns the answers in
  the items' order. Ctrl-C in the main thread removes the containers this process started on every
  engine (the workers are blocked in the engine's API), then goes on as an interrupt.
- `on_engine` runs one case on the best engine with a free slot. If that engine stops answering
  while it runs, the engine is marked down and the case goes to another engine that fits; when
  none is left, NoEngineError says why.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from lab.core.errors import EngineError
from lab.core.records import Events, no_events
from lab.engine.protocol import Engine
from lab.engine.routing import Fleet

T = TypeVar("T")
R = TypeVar("R")


class EngineGone(EngineError):
    """The engine a case ran on stopped answering (raised by the case's function to reschedule it)."""


def run_all(items: Sequence[T], fn: Callable[[T], R], workers: int,
            on_interrupt: Callable[[], None] = lambda: None) -> list[R]:
    """fn(item) for every item, `workers` at once, answers in order. The first exception (after
    the running items end) is raised; items not started by then are not run."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    answers: dict[int, R] = {}
    failures: list[tuple[int, BaseException]] = []
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        todo.put(i)
    finished: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answers[i] = fn(items[i])
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                failures.append((i, exc))
                stop.set()
            finally:
                finished.put(i)

    threads = [threading.Thread(target=worker, daemon=True, name=f"lab-worker-{n}")
               for n in range(min(workers, len(items)))]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            try:
                finished.get(timeout=0.5)
            except queue.Empty:
                continue
    except KeyboardInterrupt:
        stop.set()
        on_interrupt()
        raise
    if failures:
        raise min(failures, key=lambda f: f[0])[1]
    return [answers[i] for i in range(len(items))]


def on_engine(fleet: Fleet, arch: str, gpu: bool, what: str, fn: Callable[[Engine, bool], R],
              events: Events = no_events, gpu_hint: str | None = None) -> R:
    """fn(engine, emulated) on the best engine that fits, again elsewhere if that engine dies."""
    while True:
        with fleet.acquire(arch, gpu, what, gpu_hint) as (engine, emulated):
            try:
                return fn(engine, emulated)
            except Exception as exc:
                if isinstance(exc, EngineGone) or not engine.alive():
                    reason = f"stopped answering during {what} ({str(exc).splitlines()[0][:200]})"
                    fleet.mark_down(engine.name, reason)
                    events("engine", f"engine {engine.name} {reason}; trying another engine")
                    continue
                raise


def remove_containers(engines: Sequence[Engine]) -> None:
    """Ctrl-C: remove the containers this process started, on every engine that still answers."""
    for engine in engines:
        engine.remove_session_containers()
