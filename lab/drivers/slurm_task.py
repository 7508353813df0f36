"""One task of a Slurm array (lab.engine.slurm): runs one case on this node with the node's engine.

`python -m lab.drivers.slurm_task FOLDER` reads `FOLDER/task-<SLURM_ARRAY_TASK_ID>.pkl` (the case, its
runs folder and run options, written by the lab that submitted the array, on the shared filesystem),
runs it with lab.pipeline.run_case as `--engine local` would (uv venv, bubblewrap), and writes
`task-<i>.out.pkl`: the RunOutcome, or the error that stopped the case before a verdict. A task
whose `job` is `localize` localizes its case instead (lab.drivers.localize, into the task's `folder`)
and writes the LocalizeResult. Its progress
goes to the task's Slurm log. The host's pip settings are read here, from this node's environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from lab.core.errors import EngineError, LabError
from lab.drivers.localize import localize
from lab.engine.engines import connect, current_spec, parse_spec
from lab.engine.protocol import Engine
from lab.image.hostpip import discover
from lab.pipeline import run_case

log = logging.getLogger("lab.slurm_task")


def node_engine(choice: str, local_options) -> Engine:
    """The engine that runs the case on this node: its Docker engine (`docker`; `auto` where one
    answers here), else its local engine (uv venv, bubblewrap)."""
    if choice in ("docker", "auto"):
        try:
            return connect(current_spec())  # the Docker engine the docker CLI would use on this node
        except EngineError as exc:
            if choice == "docker":
                raise
            log.info("no Docker engine answers on this node (%s): the local engine runs the case", exc.message)
    return connect(replace(parse_spec("local", "slurm"), options=local_options))


def run_task(folder: Path, index: int) -> int:
    with open(folder / f"task-{index}.pkl", "rb") as fh:
        task = pickle.load(fh)
    if task.get("cache"):
        os.environ["LAB_CACHE_DIR"] = task["cache"]
    options = dict(task["options"])
    run_dir = options.get("run_dir")
    if run_dir is not None and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
        shutil.rmtree(run_dir, ignore_errors=True)  # a requeued task starts its run again
        Path(run_dir).mkdir(parents=True, exist_ok=True)

    def events(stage: str, message: str) -> None:
        log.info("[%s] %s", stage, message)

    engine = node_engine(task.get("node_engine", "local"), task["local"])

    def stop(signum, frame) -> None:  # scancel, preemption, the time limit: end the sandboxed run too
        log.error("signal %d: ending the run", signum)
        for proc in list(getattr(engine, "_running", ())):  # the sandbox's pid 1 ignores the SIGTERM Slurm sends, and
            child = getattr(proc, "lab_child", None)  # outlives bwrap when Slurm's TERM has ended bwrap first
            if child:
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
        engine.remove_session_containers()
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    out = folder / f"task-{index}.out.pkl"
    try:
        if task.get("job") == "localize":  # a boundary's localization (lab.drivers.localize), as one task
            outcome = localize(task["case"], engine, discover(), Path(task["runs_root"]), Path(task["folder"]),
                               events, run_case=run_case)
        else:
            outcome = run_case(task["case"], engine, discover(), Path(task["runs_root"]), events, **options)
        answer: dict = {"outcome": outcome}
    except LabError as exc:
        log.error("no verdict: %s", exc)
        answer = {"error": exc.message.split("\n")[0][:400], "hint": getattr(exc, "hint", None),
                  "engine": isinstance(exc, EngineError)}
    except Exception as exc:  # noqa: BLE001 - a bug in the lab: said as such, with its traceback in the log
        log.error("unexpected error:\n%s", traceback.format_exc())
        answer = {"error": f"unexpected {type(exc).__name__} in the lab on the node: {str(exc)[:300]} (a bug in "
                           "the lab; its traceback is in the task's log)", "hint": None, "engine": False}
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(answer, fh)
    tmp.replace(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    index = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    return run_task(Path(argv[0]), index)


if __name__ == "__main__":
    sys.exit(main())
