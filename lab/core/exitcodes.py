"""The exit codes of `lab`, and the `git bisect run` contract that `lab run --check` follows.

By default the exit code says whether the lab reached a verdict, whatever the verdict is:

    0    a verdict was reached (reproduced, not_reproduced, failed_differently, error or timeout)
    1    an unexpected error inside the lab (a bug: rerun with --debug for the traceback)
    2    bad input: a scenario, an option, a bundle, a configuration file, an issue page
    3    the infrastructure failed before a verdict: the engine, a base image, the index, GitHub
    4    declined: `lab replay` was answered no (or had no terminal and no --yes); nothing was built
    130  interrupted (Ctrl-C or SIGTERM)

`lab triage` over several pages exits 0 when every issue reached a verdict; else 130 if it was
interrupted, 3 if any issue met an infrastructure failure (or a bug), else 2 (summary.json's
`exit_code`, and each issue's own). `TABLE` below is the table the documentation shows.

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
DECLINED = 4
INTERRUPTED = 130

CHECK_NOT_REPRODUCED = 0
CHECK_REPRODUCED = 1
CHECK_SKIP = 125
CHECK_ABORT = 128


# (code, name, meaning, what a CI job does with it): the one table of the docs (issue 32)
TABLE: tuple[tuple[int, str, str, str], ...] = (
    (OK, "verdict reached", "a verdict was reached, whatever it is (reproduced, not_reproduced, "
     "failed_differently, error, timeout); the JSON on stdout's last line says which",
     "read the JSON (`verdict`; a batch: summary.json)"),
    (INTERNAL, "bug in the lab", "an unexpected error inside the lab", "report it; rerun with --debug"),
    (BAD_INPUT, "bad input", "a scenario, an option, a bundle, a configuration file or an issue page is wrong "
     "(one paragraph names the file, line and field)", "fix the input; retrying gives the same"),
    (INFRASTRUCTURE, "infrastructure failure", "the engine, a base image, the package index or GitHub failed "
     "before a verdict", "retry later, or on another runner"),
    (DECLINED, "declined", "`lab replay` was answered no, or had no terminal and no --yes: nothing was built "
     "or run", "pass --yes where a person reviewed the bundle"),
    (INTERRUPTED, "interrupted", "Ctrl-C or SIGTERM (a cancelled CI job): containers removed, the folder "
     "marked interrupted", "rerun the same command: it resumes"),
)


def table_markdown() -> str:
    """TABLE as the Markdown table of the docs."""
    rows = ["| exit | meaning | details | in CI |", "|---|---|---|---|"]
    rows += [f"| {code} | {name} | {meaning} | {ci} |" for code, name, meaning, ci in TABLE]
    return "\n".join(rows) + "\n"


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
