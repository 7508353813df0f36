"""The long verbs (run, bisect, triage) as `python -m lab ... --json` child processes.

A child process, not a thread, because cancelling must stop the work the way Ctrl-C does: the child
gets SIGTERM, which the CLI turns into an interruption that stops and removes its containers (and
bubblewrap's `--die-with-parent` ends a local-engine run), marks the run folder `interrupted`, and
exits 130. Its stderr lines are the progress; its stdout's last line is the JSON result."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from anyio.abc import Process

from lab.core import exitcodes as codes
from lab.core.errors import LabError

__all__ = ["JobFailed", "JobResult", "run_lab_job"]

STOP_GRACE_S = 60.0      # how long a cancelled child may take to remove its containers before SIGKILL
_STDOUT_CAP = 1 << 20


class JobFailed(LabError):
    """The child `lab` stopped before a verdict: bad input (exit 2), the infrastructure (3), or else."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class JobResult:
    data: dict
    stderr_tail: str


Progress = Callable[[str], Awaitable[None]]


async def run_lab_job(args: list[str], progress: Progress, env: dict[str, str] | None = None) -> JobResult:
    """`python -m lab ARGS` (ARGS must end the command with --json); raises JobFailed on a non-zero
    exit with the child's error paragraph; on cancellation stops the child and waits for it."""
    command = [sys.executable, "-m", "lab", "-v", *args]
    child_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True)
    out = bytearray()
    tail: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_stdout, process, out)
            await _read_stderr(process, tail, progress)
            await process.wait()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _stop(process)
        raise
    text = "\n".join(tail)
    if process.returncode != 0:
        raise JobFailed(_error_paragraph(text) or f"`lab {args[0]}` stopped with exit {process.returncode}",
                        process.returncode or codes.INTERNAL)
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        return JobResult(json.loads(lines[-1]), text)
    except (IndexError, ValueError):
        raise JobFailed(f"`lab {args[0]}` gave no JSON result", codes.INTERNAL) from None


async def _read_stdout(process: Process, out: bytearray) -> None:
    assert process.stdout is not None
    async for chunk in process.stdout:
        if len(out) < _STDOUT_CAP:
            out += chunk[: _STDOUT_CAP - len(out)]


async def _read_stderr(process: Process, tail: list[str], progress: Progress) -> None:
    assert process.stderr is not None
    pending = b""
    async for chunk in process.stderr:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            tail.append(line[:2000])
            del tail[:-40]
            await progress(line[:300])
        pending = pending[-65536:]


async def _stop(process: Process) -> None:
    """SIGTERM (the CLI removes its containers and marks the folder), then SIGKILL after the grace."""
    if process.returncode is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return
    with anyio.move_on_after(STOP_GRACE_S):
        await process.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


def _error_paragraph(stderr: str) -> str:
    """The child's one-paragraph error (`error: ...`), without rich's markup."""
    lines = stderr.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:"):
            return " ".join(ln.strip() for ln in lines[i:])[6:].strip()[:4000]
    return ""
