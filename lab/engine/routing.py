"""Which engine runs a case, and how many cases each engine runs at once.

Routing is pure logic over engine facts:
- a GPU case goes only where the NVIDIA runtime is: for a Docker engine, where a test container that
  requests all GPUs (as `--gpus all`) starts and runs (lab.engine.gpu; asked once per process);
- a native engine comes before QEMU (an engine known to emulate the arch, then a remote one whose
  emulation is unknown);
- `--engine NAME` pins the case to one engine, emulated or not.

The Fleet holds the connected engines and their slots for the drivers (matrix cells and bisect
probes run at once, `--jobs` in total): `acquire` waits for a free slot on the best engine that
fits, and an engine that dies is marked down, so what it was running goes elsewhere.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from lab.core.errors import EngineError, LabError
from lab.engine import gpu as gpu_words
from lab.engine.engines import EngineFacts, engine_specs, survey
from lab.engine.protocol import Engine

_ORDER = {"native": 0, "emulated": 1, "maybe": 2}


class NoEngineError(LabError):
    """No known engine can run a case (its arch, its GPU), or the pinned engine is not there."""


@dataclass(frozen=True)
class Route:
    engine: str      # the engine's name
    emulated: bool   # through QEMU


def routes(arch: str, gpu: bool, engines: Sequence[EngineFacts], pinned: str | None = None,
           what: str = "the case", gpu_hint: str | None = None) -> list[Route]:
    """The engines that can run a case of `arch` (needing a GPU or not), best first.
    Raises NoEngineError with each engine's reason when none can."""
    if pinned is not None:
        chosen = [e for e in engines if e.name == pinned]
        if not chosen:
            raise NoEngineError(f"there is no engine named {pinned!r} (known: "
                                f"{', '.join(e.name for e in engines) or 'none'}).",
                                hint="See `lab engines`; name a Docker context or a DOCKER_HOST URL.")
        engines = chosen
    ranked: list[tuple[int, int, Route]] = []
    why_not: list[str] = []
    for position, e in enumerate(engines):
        if not e.reachable:
            why_not.append(f"{e.name}: unreachable ({e.reason})")
            continue
        if gpu and not e.gpu:
            why_not.append(f"{e.name}: no NVIDIA runtime" + (
                f" ({e.url + ' ' if e.url and e.url != e.name else ''}refused a test container with "
                f"{gpu_words.REQUEST_WORDS}: {e.gpu_answer})" if e.gpu_answer else ""))
            continue
        how = e.can_run(arch)
        if how is None:
            why_not.append(f"{e.name}: runs only this host's {e.arch}, without emulation; a Docker engine runs "
                           f"{arch} (with QEMU, or a native one)" if e.kind == "local" else
                           f"{e.name}: {e.arch} without QEMU for {arch}")
            continue
        ranked.append((_ORDER[how], position, Route(e.name, how != "native")))
    if not ranked:
        need = f"{arch}" + (" with a GPU" if gpu else "")
        if gpu and any(e.reachable and not e.gpu for e in engines):
            hint = gpu_words.FIX + (f" {gpu_hint}" if gpu_hint else "")
        elif gpu and gpu_hint:
            hint = gpu_hint
        else:
            hint = ("Add an engine that fits (`docker context create ...`, then `--engine NAME` or `engines` in "
                    "lab.toml; see `lab engines`), or register QEMU for emulation with `bin/setup-host`.")
        raise NoEngineError(f"no engine can run {what} ({need}): {'; '.join(why_not) or 'no engines'}.",
                            hint=hint)
    return [r for _, _, r in sorted(ranked, key=lambda t: (t[0], t[1]))]


def share(slots: Sequence[int], jobs: int | None) -> list[int]:
    """Each engine's share of `jobs` (default: the sum of the engines' own slots), in proportion
    to its slots, at least one each while there are enough jobs (largest remainder)."""
    weights = [max(s, 0) for s in slots]
    live = [i for i, w in enumerate(weights) if w > 0]
    if not live:
        return [0] * len(weights)
    total = sum(weights[i] for i in live) if jobs is None else max(1, jobs)
    if total <= len(live):  # fewer jobs than engines: the biggest engines get one each
        out = [0] * len(weights)
        for i in sorted(live, key=lambda i: (-weights[i], i))[:total]:
            out[i] = 1
        return out
    wsum = sum(weights[i] for i in live)
    exact = {i: total * weights[i] / wsum for i in live}
    out = [0] * len(weights)
    for i in live:
        out[i] = int(exact[i])
    rest = total - sum(out)
    for i in sorted(live, key=lambda i: (-(exact[i] - int(exact[i])), i))[:rest]:
        out[i] += 1
    for i in live:  # every engine gets one, taken from the one with the most
        if out[i] == 0:
            donor = max(live, key=lambda j: (out[j], -j))
            out[donor] -= 1
            out[i] = 1
    return out


class Fleet:
    """The connected engines, their facts and their slots (thread-safe)."""

    def __init__(self, members: Sequence[tuple[EngineFacts, Engine | None]], jobs: int | None = None,
                 pinned: str | None = None) -> None:
        self.facts = [f for f, _ in members]
        self.engines = {f.name: e for f, e in members if e is not None}
        reachable = [f for f in self.facts if f.name in self.engines]
        if pinned is not None:
            reachable = [f for f in reachable if f.name == pinned]
        counts = share([f.slots for f in reachable], jobs)
        self.capacity = {f.name: n for f, n in zip(reachable, counts, strict=True)}
        self.busy = dict.fromkeys(self.capacity, 0)
        self.down: dict[str, str] = {}
        self.pinned = pinned
        self._cond = threading.Condition()

    @classmethod
    def single(cls, facts: EngineFacts, engine: Engine) -> Fleet:
        return cls([(facts, engine)], jobs=1)

    @property
    def slots(self) -> int:
        return sum(n for name, n in self.capacity.items() if name not in self.down)

    def engine(self, name: str) -> Engine:
        return self.engines[name]

    def widen(self, name: str, slots: int) -> None:
        """Let engine `name` run `slots` cases at once, when that is more than its share (a bisection
        of emulated probes, each one core: lab.drivers.bisect_ahead)."""
        with self._cond:
            if name in self.capacity and slots > self.capacity[name]:
                self.capacity[name] = slots
                self._cond.notify_all()

    def routes(self, arch: str, gpu: bool, what: str = "the case", gpu_hint: str | None = None) -> list[Route]:
        usable = [f if f.name not in self.down else
                  EngineFacts(f.name, f.url, f.source, reachable=False, reason=self.down[f.name])
                  for f in self.facts if f.name in self.capacity or f.name == self.pinned]
        if gpu:
            usable = [self._gpu_checked(f) for f in usable]
        return routes(arch, gpu, usable, self.pinned, what, gpu_hint)

    def _gpu_checked(self, facts: EngineFacts) -> EngineFacts:
        """A Docker engine's facts with `gpu` from its answer to a test container that requests all
        GPUs (the same check that stops a run before its build); the local engine's stay."""
        engine = self.engines.get(facts.name)
        if facts.kind != "docker" or not facts.reachable or engine is None:
            return facts
        answer = gpu_words.check(engine, make_image=True)
        if answer.ok is None:
            return facts
        return replace(facts, gpu=answer.ok, gpu_answer=None if answer.ok else answer.answer)

    @contextlib.contextmanager
    def acquire(self, arch: str, gpu: bool, what: str = "the case",
                gpu_hint: str | None = None) -> Iterator[tuple[Engine, bool]]:
        """Wait for a slot on the best engine that fits; yield (engine, emulated). NoEngineError when
        none fits (or every one that did has gone down)."""
        with self._cond:
            while True:
                candidates = self.routes(arch, gpu, what, gpu_hint)
                # engines left without a share of --jobs serve only cases no other engine fits
                served = [r for r in candidates if self.capacity[r.engine] > 0] or candidates[:1]
                free = [r for r in served if self.busy[r.engine] < max(self.capacity[r.engine], 1)
                        or self.queues(r.engine)]
                if free:
                    chosen = free[0]
                    self.busy[chosen.engine] += 1
                    break
                self._cond.wait(timeout=1.0)
        try:
            yield self.engines[chosen.engine], chosen.emulated
        finally:
            with self._cond:
                self.busy[chosen.engine] -= 1
                self._cond.notify_all()

    def queues(self, name: str) -> bool:
        """Whether the engine queues cases itself (a Slurm partition): never waited for, every case at once."""
        return any(f.name == name and f.kind == "slurm" for f in self.facts)

    def mark_down(self, name: str, reason: str) -> None:
        with self._cond:
            self.down.setdefault(name, reason)
            self._cond.notify_all()

    def live_engines(self) -> list[Engine]:
        return [e for n, e in self.engines.items() if n not in self.down]


ENGINE_HINT = ("Start it (as root: `bin/setup-host`, or `systemctl start docker`), check DOCKER_HOST or the "
               "Docker context, then see `lab doctor` and `lab engines`.")


def open_fleet(flags: Sequence[str] = (), configured: Sequence[str] = (), jobs: int | None = None,
               warn=lambda message: None, local=None) -> Fleet:
    """The engines a run may use: those named with `--engine` only, else the current engine and the
    configured ones. Unreachable engines are skipped with a warning; none reachable is an EngineError."""

    specs = engine_specs(flags, (), include_current=False) if flags else engine_specs((), configured)
    specs = [replace(s, options=local) if s.kind in ("local", "slurm") else s for s in specs]
    members = survey(specs)
    reachable = [(f, e) for f, e in members if f.reachable and e is not None]
    for facts, _ in members:
        if not facts.reachable and reachable:
            warn(f"engine {facts.name} skipped: {facts.reason}")
    if not reachable:
        if len(members) == 1:
            raise EngineError(f"{members[0][0].reason}.", hint=ENGINE_HINT)
        raise EngineError("no Docker engine answers: " + "; ".join(f"{f.name}: {f.reason}" for f, _ in members)
                          + ".", hint=ENGINE_HINT)
    if jobs is not None and jobs < 1:
        raise LabError(f"--jobs must be 1 or more, not {jobs}.")
    return Fleet(members, jobs=jobs)
