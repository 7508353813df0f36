"""The exit codes of `lab`, and the `git bisect run` contract that `lab run --check` follows.

By default the exit code says whether the lab reached a verdict, whatever the verdict is:

    0    a verdict was reached (reproduced, not_reproduced, failed_differently, error or timeout)
    1    an unexpected error inside the lab (a bug: rerun with --debug for the traceback)
    2    bad input: a scenario, an option, a bundle, a configuration file
    3    the infrastructure failed before a verdict: the engine, a base image, the index
    130  interrupted (Ctrl-C or SIGTERM)

With `--check` the exit code is the verdict, as `git bisect run` reads it:

    0    not_reproduced                      (git bisect: good)
    1    reproduced                          (git bisect: bad)
    125  no verdict about the bug: an error, timeout or failed_differently verdict (another failure
         than the scenario's signature), a failed build, the engine
         down, any infrastructure failure   (git bisect: skip this commit)
    128  bad input or a bug in the lab: the same on every commit, so `git bisect run` stops
    130  interrupted                         (git bisect run stops too: above 127)
"""

from __future__ import annotations

OK = 0
INTERNAL = 1
BAD_INPUT = 2
INFRASTRUCTURE = 3
INTERRUPTED = 130

CHECK_NOT_REPRODUCED = 0
CHECK_REPRODUCED = 1
CHECK_SKIP = 125
CHECK_ABORT = 128


def verdict_exit(verdict: str, check: bool) -> int:
    """The exit code of a run that reached `verdict`."""
    if not check:
        return OK
    if verdict == "reproduced":
        return CHECK_REPRODUCED
    if verdict == "not_reproduced":
        return CHECK_NOT_REPRODUCED
    return CHECK_SKIP  # error, timeout, failed_differently: nothing about this bug


def failure_exit(code: int, check: bool) -> int:
    """The exit code of a command that stopped before a verdict with the default `code`."""
    if not check or code == INTERRUPTED:
        return code
    if code == INFRASTRUCTURE:
        return CHECK_SKIP
    return CHECK_ABORT  # bad input or an internal error: every commit would give the same
