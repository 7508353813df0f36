"""The one interface every engine implements: what the pipeline, the drivers, the cache policy and
the CLI may call on an engine, and nothing else.

An engine is where a case's image is made and where its script runs. Three implement it: Docker
(`lab.engine.docker_engine.DockerEngine`: images and confined containers, native or under QEMU),
the local engine (`lab.engine.local_engine.LocalEngine`: this host, a venv, a bubblewrap sandbox)
and, next, Slurm. The callers never ask which one they hold: what differs lives behind these
methods, and where a caller must know what an engine can do, it reads a capability (`native_arches`,
`emulates`, `confined`, `gpu`, `keeps_images`, `cross_installs`), never `kind`.

The image handle: `prepare` returns a `BuiltImage` (lab.core.records); its `ref` is what the same
engine's `run`, `output_of` and `read_file` take (a Docker tag, a `MountedImage` whose runs get
the cross-installed tree read-only, the local engine's `LocalImage`).
A handle is only ever given back to the engine that made it.

Paths in commands, in `env` and in `read_file` are the image's paths (lab.image.layout: /out,
/lab/repro, /opt/venv, ...); an engine that runs elsewhere translates them.

Later changes to this protocol are additive: a new method gets a default in every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

from lab.core.arch import Arch
from lab.core.records import (
    BuiltImage,
    Events,
    ImageUsage,
    LocalImage,
    MountedImage,
    RawRun,
    RunLimits,
    no_events,
)
from lab.core.results import LocalRef
from lab.image.hostpip import HostPip
from lab.image.render import BuildPlan
from lab.image.resolve import Case

# What `run`, `output_of` and `read_file` take: `BuiltImage.ref` of an image this engine prepared.
# (A Docker tag, a local Docker engine's image with its mounted tree, or the local engine's environment.
# An engine with another kind of handle adds it here.)
ImageRef = str | LocalImage | MountedImage

# Waits for what `Engine.begin` started; gives its seconds (the run's `base` time), or raises its error.
Pending = Callable[[], float]


def nothing_pending() -> float:
    """A Pending for an engine that has nothing to start ahead: done at once, in no time."""
    return 0.0


@runtime_checkable
class Engine(Protocol):
    """A place where a case's image is made and its script is run, confined."""

    kind: str
    """What sort of engine: "docker", "local" or "slurm". Recorded (result.json's `engine.kind`,
    `lab engines`); callers never branch on it: they read the capabilities below."""

    name: str
    """The name the user picks it by (`--engine NAME`): a Docker context, an address, "local"."""

    url: str | None
    """Where it is (unix:///var/run/docker.sock, ssh://host, local://), for messages and records."""

    # --- facts and capabilities ------------------------------------------------
    @property
    def arch(self) -> Arch:
        """The architecture the engine's host runs natively (its first native one)."""
        ...

    @property
    def native_arches(self) -> frozenset[Arch]:
        """Every architecture it runs without emulation. A case of another arch is emulated (when
        `emulates`) or refused by `check`."""
        ...

    @property
    def emulates(self) -> bool:
        """Whether it runs a case of another architecture under emulation (QEMU binfmt) rather than
        refusing it. The run's `emulated` is `case.arch not in native_arches`."""
        ...

    @property
    def confined(self) -> bool:
        """Whether the script runs confined (a container, a sandbox). False only where the user said
        they trust the script (`--trust-script`); the report then says "not confined"."""
        ...

    @property
    def unconfined_reason(self) -> str | None:
        """Why the script would not be confined here (bubblewrap missing, user namespaces off), in
        words; None where it always is. With `confined` False, the CLI warns with it."""
        ...

    @property
    def gpu(self) -> bool:
        """Whether it can give a run the host's NVIDIA GPUs (Docker: the nvidia runtime; the local
        engine: the device nodes). A quick fact; `check` asks harder for a GPU case."""
        ...

    @property
    def keeps_images(self) -> bool:
        """Whether a prepared image stays an image a later command can be started in again (the
        localization's compiler_bisector runs in the case's image). False for the local engine,
        whose environments are cache entries rather than images."""
        ...

    @property
    def cross_installs(self) -> bool:
        """Whether the case's requirements are installed on the host with uv and put into the image
        as one layer (lab.image.crossinstall; plan_build's `installer`). False: the engine's own
        environment maker installs them, and the BuildPlan is only the run folder's record."""
        ...

    @property
    def version(self) -> str:
        """The engine's version in words (Docker's server version, bubblewrap's, ...), for records."""
        ...

    @property
    def engine_id(self) -> str:
        """A stable ID of this engine (across restarts): keys what the lab caches per engine."""
        ...

    def environment_python(self) -> str | None:
        """The Python (X.Y) every environment of this engine is made with, whatever a scenario's base
        image has (the local engine: the host's); None where the base image decides (Docker)."""
        ...

    def resume_args(self) -> tuple[str, ...]:
        """The CLI flags that pick this engine again, as configured, in a command the lab prints
        to resume its work (`--engine local --trust-script`); () for the engine picked by default."""
        ...

    def alive(self) -> bool:
        """Whether it still answers (after a failed run: was it the engine, or the case?). Never raises."""
        ...

    # --- one case, in order ----------------------------------------------------
    def check(self, case: Case, events: Events = no_events) -> str | None:
        """Refuse `case` before anything is made, with the LabError that says why and how to get it
        run: a GPU case where no GPU can be had, an architecture it cannot run, a script it cannot
        confine (without --trust-script), system packages the host lacks. Returns where the case's
        system packages come from, in words, for the record (None where the image brings them)."""
        ...

    def run_elsewhere(self, case: Case, host: HostPip, runs_root: Path, events: Events = no_events,
                      **options: object) -> object | None:
        """A scheduler's engine (Slurm) runs the whole case on one of its nodes, where the node's own
        engine does every step below, and returns its lab.pipeline.RunOutcome (read back from the run folder it
        wrote); an engine that runs the steps here returns None. `options` are run_case's (run_dir,
        diagnose, compile_debug, allow_network, collect_env, plan)."""
        ...

    def begin(self, case: Case, events: Events = no_events) -> Pending:
        """Start, in the background, what making the image needs and the host's planning does not
        (Docker: the base image; a bootstrap under QEMU takes minutes), so it runs while uv works
        on the host. Returns the wait for it; `nothing_pending` where there is nothing to start."""
        ...

    def prepare(self, case: Case, plan: BuildPlan, host: HostPip, run_dir: Path, events: Events = no_events,
                *, ready: Pending = nothing_pending) -> BuiltImage:
        """The image `case` runs in, made from `plan` or reused when its content-addressed tag is
        there (Docker: an image; local: a cached uv venv, or the current Python). `ready` is what
        `begin` returned; its seconds count as the image's `base_seconds`. The build's log goes to
        run_dir/build.log. Raises BuildError when the build itself fails (the run records it as a
        verdict), other LabErrors when the engine does."""
        ...

    def describe(self, image: BuiltImage, limits: RunLimits, system: str | None) -> LocalRef | None:
        """What result.json's `local` says of where the run happened beyond its image (host OS,
        libc, Python, confinement in words), `system` being what `check` returned; None where the
        image says it all (Docker)."""
        ...

    def run(self, image: ImageRef, command: list[str], env: dict[str, str], out_dir: Path, logs_dir: Path,
            arch: Arch, timeout: float, labels: dict[str, str], events: Events,
            limits: RunLimits | None = None, reserved: Collection[str] = ()) -> RawRun:
        """Run `command` (image paths; `python` is the image's venv Python) in `image`, confined by
        `limits`, with exactly `env` on top of the image's own. stdout and stderr go to
        logs_dir/stdout.txt and stderr.txt (capped at limits.stream_bytes each); what the script
        left in /out is copied into `out_dir` through lab.core.safetar once every process has ended
        (capped; names in `reserved` refused). A timeout stops the run (`timed_out`), it is not an
        error. `labels` name the run for housekeeping (Docker labels, job comments)."""
        ...

    def output_of(self, image: ImageRef, command: list[str], arch: Arch, timeout: float,
                  labels: dict[str, str], background: bool = False,
                  env: dict[str, str] | None = None, gpus: bool = False) -> tuple[int | None, str]:
        """Run a short command in `image`, confined like a run; (exit code or None on timeout,
        stdout and stderr together, at most 16 MiB). `background`: at the lowest CPU weight, beside
        a running script. `gpus`: with the host's GPUs (collect_env of a GPU case)."""
        ...

    def read_file(self, image: ImageRef, path: str) -> bytes | None:
        """A file of `image` at the image path `path` (/lab/pip-freeze.txt, a file of the venv's
        site-packages), read without running the script; None when it is absent. At most 64 MiB."""
        ...

    # --- after runs: housekeeping ---------------------------------------------
    def discard(self, tag: str) -> None:
        """A probe's image (`BuiltImage.tag`, as result.json records it) is not needed again
        (bisect without --keep-images): free what only it holds, keeping what the next probe shares
        (Docker: anchor the shared layers, remove the tag). Engines whose environments are cache
        entries leave them to the cache cap."""
        ...

    def managed_images(self) -> list[ImageUsage]:
        """The images the lab made on this engine, with their sizes and users (the cache policy's
        inventory). Empty for an engine that holds no images of its own."""
        ...

    def remove_unused_image(self, image: ImageUsage) -> bool:
        """Remove one of `managed_images`, never by force: False when the engine refused (in use)
        or it was gone."""
        ...

    def remove_session_containers(self) -> int:
        """Ctrl-C: end every run this process started on the engine and start none after; the
        number ended."""
        ...
