"""Slurm partitions as engines: the lab hands its cases to a cluster's scheduler.

`--engine slurm:PARTITION` (or `slurm:PARTITION` in the `engines` setting) makes a partition an
engine. Its facts come from `scontrol show partition/node` (the nodes' architecture from their
features, `amd64`/`arm64`/`aarch64`/`x86_64`, else from what slurmd reports; CPUs, memory and GPUs
per node from the node records and their GRES).

A case given to a Slurm engine runs as one task of a job array: every case handed to the engine
within a short window (`GATHER_S`) goes into one `sbatch --array`, so a k-ary bisection round, whose
probes start together, is one array, and so is a matrix. Each task runs the case on its node with
the lab's local engine (`python -m lab.drivers.slurm_task FOLDER`, the lab installed once on the
shared filesystem: uv venv and bubblewrap) and writes the run folder on the shared runs folder as
any run does; the case and its options travel as a pickle in `<runs>/.slurm/<array>/`, beside the
tasks' Slurm logs. The host's pip settings are read again on the node (never written down).

The lab waits through `squeue --states=all` (`sacct` where accounting answers), emits each task's
job id, state and node as progress events, and follows a requeued task. A task that ends without
its run's outcome (NODE_FAIL, PREEMPTED, BOOT_FAIL, CANCELLED by someone else, TIMEOUT, OUT_OF_MEMORY)
is `SlurmTaskLost` (a RunLost): an infrastructure error for that case (a bisection's skip, a matrix
cell's `error`), never a verdict. A boundary's localization is one task too (`localize_elsewhere`).
Ctrl-C cancels the lab's own jobs (`scancel`) and waits until squeue no longer lists them.

uv's cache (the lab's cache folder) goes to the tasks as LAB_CACHE_DIR: `LAB_SLURM_CACHE`, else the
host's own cache folder, which must then be on a filesystem the nodes share.
"""

from __future__ import annotations

import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.arch import Arch
from lab.core.errors import EngineError, LabError, RunLost
from lab.engine.local_engine import LocalEngine, LocalOptions

SLURM = "slurm"
PREFIX = "slurm:"
GATHER_S = 0.25     # cases handed over within this window of each other go into one array
POLL_S = 0.5
TIMEOUT_S = 20      # for one scontrol/squeue/sbatch command
NODE_ENGINES = ("auto", "docker", "local")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"}
_ARCHES = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}


class SlurmError(EngineError):
    """Slurm does not answer, or refused a submission (sbatch, squeue, scontrol failed)."""


class SlurmTaskLost(RunLost):
    """A task ended without its run's outcome (node failure, preemption, cancelled by someone else,
    time limit): an infrastructure error for that case, never a verdict (`where`: the task's Slurm log)."""


class SlurmTaskFailed(LabError):
    """The case could not be set up on the node (the node's lab said why): no verdict."""


# ----------------------------------------------------------------------------- facts

@dataclass(frozen=True)
class Node:
    name: str
    arch: str | None          # amd64 | arm64 (from the features, else slurmd's own report)
    cpus: int
    memory: int               # bytes
    gpus: int
    features: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[Node, ...]
    state: str
    default: bool = False

    @property
    def arches(self) -> tuple[str, ...]:
        return tuple(sorted({n.arch for n in self.nodes if n.arch}))

    @property
    def arch(self) -> str | None:
        """The nodes' architecture (the most common one where they differ)."""
        found = [n.arch for n in self.nodes if n.arch]
        return max(sorted(set(found)), key=found.count) if found else None

    @property
    def cpus(self) -> int:
        return max((n.cpus for n in self.nodes), default=0)

    @property
    def memory(self) -> int:
        return max((n.memory for n in self.nodes), default=0)

    @property
    def gpus(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    @property
    def up(self) -> bool:
        return self.state == "UP" and any(_usable(n.state) for n in self.nodes)


def _usable(state: str) -> bool:
    bad = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "POWERED_DOWN", "UNKNOWN")
    return not any(b in state.upper() for b in bad)


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ... -o` (one record a line, `Key=Value` words; a value may hold spaces)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line or "=" not in line:
            continue
        marks = list(_FIELD.finditer(line))
        record = {}
        for m, after in zip(marks, [*marks[1:], None], strict=True):
            end = after.start() if after is not None else len(line)
            record[m.group(1)] = line[m.end():end].strip()
        records.append(record)
    return records


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list: `a,b[1-3,5],c-[01-02]`."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text or ""):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            if part and part != "(null)":
                out.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                out.append(f"{head}{lo}{tail}")
                continue
            for i in range(int(lo), int(hi) + 1):
                out.append(f"{head}{str(i).zfill(len(lo))}{tail}")
    return out


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: `gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:h100:8,shard:2`, `(null)`."""
    total = 0
    for item in (gres or "").split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu":
            try:
                total += int(parts[-1]) if len(parts) > 1 else 1
            except ValueError:
                total += 1
    return total


def node_from(record: dict[str, str]) -> Node:
    features = tuple(f for f in re.split(r"[,&|]", record.get("AvailableFeatures") or record.get("Features") or "")
                     if f and f != "(null)")
    arch = next((_ARCHES[f.lower()] for f in features if f.lower() in _ARCHES), None)
    arch = arch or _ARCHES.get((record.get("Arch") or "").lower())
    mem = int(re.sub(r"\D", "", record.get("RealMemory") or "0") or 0) * 1024 * 1024
    return Node(name=record.get("NodeName", "?"), arch=arch, cpus=int(record.get("CPUTot") or 0),
                memory=mem, gpus=gpu_count(record.get("Gres", "")), features=features,
                state=record.get("State", "UNKNOWN"))


def partitions_from(partition_text: str, node_text: str) -> list[Partition]:
    nodes = {n.name: n for n in map(node_from, parse_records(node_text))}
    found = []
    for p in parse_records(partition_text):
        names = expand_hostlist(p.get("Nodes", ""))
        found.append(Partition(name=p.get("PartitionName", "?"),
                               nodes=tuple(nodes[n] for n in names if n in nodes),
                               state=p.get("State", "UNKNOWN"), default=p.get("Default") == "YES"))
    return found


def _command(args: list[str], what: str, timeout: float = TIMEOUT_S) -> str:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} is not installed here, so Slurm cannot be reached.",
                         hint="Install Slurm's client commands (Debian: slurm-client), or run `bin/setup-slurm` "
                              "as root for a one-node cluster on this host.") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: `{shlex.join(args)}` did not answer within {timeout:.0f} s.") from None
    if proc.returncode != 0:
        raise SlurmError(f"{what}: `{shlex.join(args)}` failed: {(proc.stderr or proc.stdout).strip()[:400]}.",
                         hint="Check that slurmctld answers (`sinfo`); on this host, `bin/setup-slurm` starts it.")
    return proc.stdout


command = _command  # Slurm's client commands, for the stages after the engine (issue.triage_batch)


def partitions() -> list[Partition]:
    """This cluster's partitions, with their nodes."""
    return partitions_from(_command(["scontrol", "show", "partition", "-o"], "Slurm's partitions"),
                           _command(["scontrol", "show", "node", "-o"], "Slurm's nodes"))


def answers() -> bool:
    try:
        _command(["sinfo", "-h", "-o", "%P"], "sinfo", timeout=10)
        return True
    except SlurmError:
        return False


def partition_names() -> list[str]:
    """The partitions of a Slurm that answers here, for `lab engines` (none where Slurm is absent)."""
    if shutil.which("scontrol") is None or not answers():
        return []
    try:
        return [p.name for p in partitions()]
    except SlurmError:
        return []


# ----------------------------------------------------------------------------- jobs

@dataclass
class TaskState:
    state: str = "PENDING"
    node: str = ""
    reason: str = ""
    restarts: int = 0


@dataclass
class _Array:
    folder: Path
    tasks: list[dict] = field(default_factory=list)
    last: float = field(default_factory=time.monotonic)
    job: str | None = None
    error: BaseException | None = None
    states: dict[int, TaskState] = field(default_factory=dict)
    submitted: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    done: bool = False


def parse_squeue(text: str) -> dict[int, TaskState]:
    """`squeue -h -r --states=all -o '%i|%T|%N|%r'` of one array: task index -> state."""
    found: dict[int, TaskState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or "_" not in parts[0]:
            continue
        index = parts[0].rsplit("_", 1)[1]
        if not index.isdigit():
            continue  # a pending range not yet split, `12_[0-3]`
        found[int(index)] = TaskState(state=parts[1].split()[0].rstrip("+"), node=parts[2], reason=parts[3])
    return found


class SlurmEngine(LocalEngine):
    """One Slurm partition as an engine. Cases run there as array tasks, each with the local engine
    on its node; the Docker-only calls are the local engine's stand-ins."""

    kind = SLURM
    # cases handed over together go into one job array: a bisection keeps its k-ary rounds here
    # (lab.drivers.bisect_run), one array per round, instead of starting each probe on its own
    gathers = True

    def __init__(self, partition: str, options: LocalOptions | None = None, *,
                 cpus_per_task: int | None = None, cache: str | None = None, python: str | None = None,
                 node_engine: str | None = None) -> None:
        super().__init__(options)
        self.partition = partition
        self.name = PREFIX + partition
        self.url = PREFIX + partition
        self.cpus_per_task = cpus_per_task or int(os.environ.get("LAB_SLURM_CPUS", "2"))
        self.cache = cache or os.environ.get("LAB_SLURM_CACHE")
        self.python = python or sys.executable
        # What runs a task on its node (LAB_SLURM_NODE_ENGINE): `auto`, the node's Docker engine where
        # one answers there and else the local engine; `docker`, the node's Docker engine (with QEMU,
        # so the partition also takes the arch it emulates); `local`, the local engine only.
        self.node_engine = node_engine or os.environ.get("LAB_SLURM_NODE_ENGINE", "auto")
        if self.node_engine not in NODE_ENGINES:
            raise SlurmError(f"LAB_SLURM_NODE_ENGINE={self.node_engine!r}: choose one of {', '.join(NODE_ENGINES)}.")
        self._facts: Partition | None = None
        self._jobs: list[str] = []
        self._open: _Array | None = None
        self._gather = threading.Lock()
        self.arrays: list[str] = []          # the array job ids this engine submitted, in order

    # --- facts ---------------------------------------------------------------
    def facts(self, refresh: bool = False) -> Partition:
        if self._facts is None or refresh:
            found = {p.name: p for p in partitions()}
            if self.partition not in found:
                raise SlurmError(f"Slurm has no partition named {self.partition!r} "
                                 f"(it has: {', '.join(found) or 'none'}).", hint="See `sinfo` or `lab engines`.")
            self._facts = found[self.partition]
        return self._facts

    @property
    def arch(self) -> Arch:
        arch = self.facts().arch
        if arch is None:
            raise SlurmError(f"the nodes of partition {self.partition} declare no architecture.",
                             hint="Give them a feature amd64 or arm64 in slurm.conf (Features=...).")
        return Arch(arch)

    @property
    def version(self) -> str:
        out = _command(["sinfo", "--version"], "sinfo")
        return out.strip()

    @property
    def engine_id(self) -> str:
        return self.name

    @property
    def is_local(self) -> bool:
        return False

    def has_gpu_runtime(self) -> bool:
        return self.facts().gpus > 0

    def info(self) -> dict:
        return {"Runtimes": {"nvidia": {}} if self.has_gpu_runtime() else {}}

    def alive(self) -> bool:
        return answers()

    def check_native(self, arch: Arch, what: str) -> None:
        if arch not in self.native_arches and not self.emulates:
            raise SlurmError(f"partition {self.partition} has no {arch.value} nodes ({what} is {arch.value}).",
                             hint="Name a partition whose nodes declare that arch as a feature (see `lab engines`).")

    # --- the engine protocol's capabilities (lab/engine/protocol.py, issue 30) ------------------
    # The case runs whole on a node (run_elsewhere), where the local engine checks, prepares and runs
    # it; these say what the partition offers, for routing, records and the resume command.
    @property
    def native_arches(self) -> frozenset[Arch]:
        return frozenset(Arch(a) for a in self.facts().arches)

    @property
    def gpu(self) -> bool:
        return self.has_gpu_runtime()

    @property
    def emulates(self) -> bool:
        # the local engine runs its node's own arch only; a node's Docker engine, declared with
        # LAB_SLURM_NODE_ENGINE=docker, runs the other arch under QEMU (marked emulated as anywhere)
        return self.node_engine == "docker"


    @property
    def keeps_images(self) -> bool:
        return False

    @property
    def cross_installs(self) -> bool:
        return False

    def resume_args(self) -> tuple[str, ...]:
        return ("--engine", self.name) + (("--trust-script",) if self.options.trust_script else ())

    def check(self, case, events=None) -> str | None:
        """What the partition refuses before anything is submitted (the node's local engine checks the
        rest: bubblewrap, system packages): an arch none of its nodes has, a GPU case without GPUs."""
        self.check_native(case.arch, case.name)
        if case.scenario.gpu and not self.gpu:
            raise SlurmError(f"partition {self.partition} has no GPUs (no gpu GRES on its nodes), and "
                             f"{case.scenario.name} needs one.", hint="Name a GPU partition (see `lab engines`).")
        return None

    # --- running cases ---------------------------------------------------------
    def run_elsewhere(self, case, host, runs_root: Path, events: Callable[[str, str], None], **options):
        """Run one case as a task of an array (lab.pipeline.run_case hands it here) and return its
        RunOutcome, read back from what the task wrote. SlurmTaskLost when the task ended without one."""
        del host  # the node reads its own pip settings: nothing of the host's credentials is written down
        return self._hand_over({"case": case, "runs_root": str(runs_root), "options": options}, case, runs_root,
                               events)

    def localize_elsewhere(self, case, host, runs_root: Path, folder: Path, events: Callable[[str, str], None]):
        """Localize `case` (lab.drivers.localize: the backend ablation, then compiler_bisector) as one Slurm
        job on this partition, as a probe runs: the node's engine runs every step (its Docker engine runs
        the bisector in the case's image; its local engine has no image, and the result says so), writes
        localize.json and localize.md into `folder` on the shared runs folder, and its LocalizeResult
        comes back. SlurmTaskLost when the task ended without one."""
        del host
        return self._hand_over({"job": "localize", "case": case, "runs_root": str(runs_root), "folder": str(folder),
                                "options": {}}, case, runs_root, events)

    def _hand_over(self, task: dict, case, runs_root: Path, events: Callable[[str, str], None]):
        """`task` as one task of the array now gathering (a new one if none is), then its answer."""
        task = {**task, "local": self.options, "node_engine": self.node_engine, "cache": self.cache}
        with self._gather:
            if self._open is None:
                folder = Path(runs_root) / ".slurm" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
                self._open = _Array(folder)
                threading.Thread(target=self._submit_when_gathered, args=(self._open,), daemon=True,
                                 name="lab-slurm-submit").start()
            array = self._open
            index = len(array.tasks)
            array.tasks.append(task)
            array.last = time.monotonic()
        try:
            return self._wait_task(array, index, case, events)
        except KeyboardInterrupt:
            self.remove_session_containers()
            raise

    def _submit_when_gathered(self, array: _Array) -> None:
        while True:
            time.sleep(0.05)
            with self._gather:
                if time.monotonic() - array.last >= GATHER_S:
                    self._open = None
                    break
        try:
            array.job = self.submit(array.folder, array.tasks)
            array.states = {i: TaskState() for i in range(len(array.tasks))}
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting case
            array.error = exc
        array.submitted.set()
        if array.job is not None:
            self._poll(array)

    def submit(self, folder: Path, tasks: list[dict]) -> str:
        """One `sbatch --array` of these tasks; their pickles and Slurm logs in `folder`. The job id."""
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)  # the tasks' pickles are code to the node's lab: the user's alone
        for i, task in enumerate(tasks):
            with open(folder / f"task-{i}.pkl", "wb") as fh:
                pickle.dump(task, fh)
        gpus = max((1 for t in tasks if t["case"].scenario.gpu), default=0)
        arches = {t["case"].arch.value for t in tasks}
        args = ["sbatch", "--parsable", f"--array=0-{len(tasks) - 1}", f"--partition={self.partition}",
                f"--job-name=lab-{tasks[0]['case'].scenario.name}"[:60], f"--chdir={folder}",
                f"--output={folder}/slurm-%A_%a.out", f"--cpus-per-task={self.cpus_per_task}",
                "--requeue", "--export=ALL"]
        if gpus:
            args.append(f"--gres=gpu:{self.facts().gpus}")
        if len(arches) == 1 and len(self.facts().arches) > 1:  # a mixed partition: the nodes that fit
            args.append(f"--constraint={next(iter(arches))}")
        args += ["--wrap", f"exec {shlex.quote(self.python)} -m lab.drivers.slurm_task {shlex.quote(str(folder))}"]
        job = _command(args, "sbatch").strip().split(";")[0]
        if not job.isdigit():
            raise SlurmError(f"sbatch answered {job!r}, not a job id.")
        with self._lock:
            self._jobs.append(job)
            self.arrays.append(job)
        return job

    def _poll(self, array: _Array) -> None:
        gone_since: float | None = None
        while True:
            try:
                seen = parse_squeue(_command(["squeue", "-h", "-r", "-j", array.job or "", "--states=all",
                                              "-o", "%i|%T|%N|%r"], "squeue"))
            except SlurmError:
                seen = {}
            with array.changed:
                for i, st in seen.items():
                    old = array.states.get(i)
                    if old is not None and old.state in ("RUNNING", "COMPLETING") and st.state in ("PENDING",
                                                                                                "REQUEUED"):
                        st.restarts = old.restarts + 1
                    elif old is not None:
                        st.restarts = old.restarts
                    array.states[i] = st
                if not seen and all((array.folder / f"task-{i}.out.pkl").exists() for i in array.states):
                    array.done = True  # squeue forgot them (MinJobAge), every outcome is there
                elif not seen:
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > 10:  # forgotten without an outcome: sacct, else lost
                        for i, st in sacct_states(array.job or "").items():
                            array.states[i] = st
                        for st in array.states.values():
                            if st.state not in TERMINAL:
                                st.state, st.reason = "LOST", "squeue and sacct no longer know the task"
                        array.done = True
                else:
                    gone_since = None
                    array.done = all(s.state in TERMINAL for s in array.states.values())
                array.changed.notify_all()
                if array.done:
                    return
            time.sleep(POLL_S)

    def _wait_task(self, array: _Array, index: int, case, events):
        while not array.submitted.wait(0.5):
            pass
        if array.error is not None:
            raise array.error
        task_id = f"{array.job}_{index}"
        events("slurm", f"Slurm job {task_id} submitted to partition {self.partition} ({case.name})")
        shown = None
        while True:
            with array.changed:
                st = array.states.get(index, TaskState())
                finished = st.state in TERMINAL or st.state == "LOST" or array.done
                if not finished:
                    array.changed.wait(0.5)
            now = (st.state, st.node, st.restarts)
            if now != shown:
                shown = now
                where = f" on {st.node}" if st.node and st.node != "(null)" else ""
                again = f" (requeued {st.restarts}x)" if st.restarts else ""
                events("slurm", f"Slurm job {task_id}: {st.state}{where}{again}")
            if finished:
                break
        return self._outcome(array, index, task_id, st)

    def _outcome(self, array: _Array, index: int, task_id: str, st: TaskState):
        path = array.folder / f"task-{index}.out.pkl"
        for _ in range(20):  # the shared filesystem may show the file a moment after the job ends
            if path.exists() or st.state != "COMPLETED":
                break
            time.sleep(0.25)
        if path.exists() and st.state in ("COMPLETED", "FAILED", "LOST"):
            with open(path, "rb") as fh:
                answer = pickle.load(fh)
            (array.folder / f"task-{index}.pkl").unlink(missing_ok=True)
            if "outcome" in answer:
                return answer["outcome"]
            raise SlurmTaskFailed(f"on Slurm job {task_id}: {answer['error']}", hint=answer.get("hint"))
        where = f" on node {st.node}" if st.node and st.node != "(null)" else ""
        log = array.folder / f"slurm-{array.job}_{index}.out"
        raise SlurmTaskLost(f"Slurm job {task_id} ended {st.state}{where}"
                            + (f" ({st.reason})" if st.reason and st.reason != "None" else "")
                            + f" before its run finished: an infrastructure error, not a verdict (log: {log})",
                            where=str(log))

    def remove_session_containers(self) -> int:
        """Ctrl-C: cancel every job this engine submitted, and wait until squeue lists none of them."""
        self._stopping.set()
        with self._lock:
            jobs = list(self._jobs)
        if not jobs:
            return 0
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=TIMEOUT_S)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proc = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], capture_output=True,
                                  text=True, timeout=TIMEOUT_S)
            if proc.returncode != 0 or not proc.stdout.strip():
                break
            time.sleep(0.5)
        return len(jobs)


def sacct_states(job: str) -> dict[int, TaskState]:
    """The tasks' final states from accounting, where slurmdbd answers (else nothing)."""
    try:
        out = _command(["sacct", "-n", "-P", "-X", "-j", job, "--format=JobID,State,NodeList"], "sacct")
    except SlurmError:
        return {}
    found = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and "_" in parts[0] and parts[0].rsplit("_", 1)[1].isdigit():
            found[int(parts[0].rsplit("_", 1)[1])] = TaskState(state=parts[1].split()[0], node=parts[2])
    return found
