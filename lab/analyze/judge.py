"""Evidence + scenario.expect -> Verdict.

Infrastructure failures (a build that failed, an emulator that crashed, a
container killed for memory or for filling /out, torch that does not import) are `error`, never
`not_reproduced`: they say nothing about the bug. Otherwise the case is
`reproduced` when every expectation holds, like `check_str` in Dynamo's minifier:
a different crash is not a reproduction. Nor is it an absence of the bug: a run whose
expectations fail while the script itself failed (an exception, a non-zero exit) is
`failed_differently`, with the scenario's signature and the run's side by side.

A failure of the script's own code (a NameError, SyntaxError or ImportError raised in the script:
pasted output run as code, an API an older release lacks) is never `reproduced` through an exit code
alone: it is `failed_differently` unless the scenario names that exception, or another expectation
(printed output, a duplicate runtime, another exception) held apart from it. `expect.signature` (an
exception type and torch frame, or a signal) must match how the run failed (lab.analyze.signature).

A wrong-result scenario written from an issue page checks its result with an oracle (lab.issue.oracle)
that prints one `LAB-ORACLE:` line; the verdict's reason quotes it, so the report names the oracle. A
script that says it has no oracle (`LAB-ORACLE: none: ...`) is `error`: the run cannot tell the bug
from its fix, and a guess would be worse than no answer.
"""

from __future__ import annotations

from lab.analyze.dynamo import plural
from lab.analyze.evidence import Evidence
from lab.analyze.signature import observed as observed_failure
from lab.analyze.signature import own_code_error, script_line
from lab.core.records import STOPPED_OUT_FULL
from lab.core.results import Check, FailureSignatures, Judgement, Verdict
from lab.scenario.model import Expect

__all__ = ["Check", "Judgement", "Verdict", "build_failed", "judge", "normalize_ws"]

_BROKEN_ENV = ("No module named 'torch'", "libtorch", "GLIBC_")
ORACLE_MARK = "LAB-ORACLE:"
NO_ORACLE = f"{ORACLE_MARK} none"


def _judgement(verdict: Verdict, reason: str, checks: tuple[Check, ...] = ()) -> Judgement:
    return Judgement(verdict=verdict, reason=reason, checks=checks)


def _check(key: str, expected: str, observed: str, held: bool) -> Check:
    return Check(key=key, expected=expected, observed=observed, held=held)


def build_failed(message: str) -> Judgement:
    return Judgement(verdict=Verdict.ERROR, reason=f"the image build failed: {message}")


def judge(ev: Evidence, expect: Expect, stdout: str, stderr: str, diagnostics=None,
          script: str | None = None) -> Judgement:
    """`diagnostics` (lab.dynamo.Diagnostics) is needed only for `graph_breaks`; `script` is the
    scenario's script file name, to tell a failure of its own code from a failure in torch."""
    judgement = _judge(ev, expect, stdout, stderr, diagnostics, script)
    said = _oracle_line(stdout)
    if said and said.startswith(NO_ORACLE) and judgement.verdict is not Verdict.TIMEOUT:
        judgement = _judgement(Verdict.ERROR, f"no oracle: the scenario says it cannot tell a wrong result "
                                              f"from a right one ({said[:300]})", judgement.checks)
    elif said and judgement.verdict in (Verdict.REPRODUCED, Verdict.NOT_REPRODUCED):
        judgement = judgement.model_copy(update={"reason": f"{judgement.reason}; oracle: {said[:300]}"})
    return judgement.model_copy(update={"signature": observed_failure(ev)})


def _oracle_line(stdout: str) -> str | None:
    """The last line an issue-page oracle printed (`LAB-ORACLE: ...`), or None."""
    found = [ln.strip() for ln in stdout.splitlines() if ln.startswith(ORACLE_MARK)]
    return found[-1] if found else None


def _judge(ev: Evidence, expect: Expect, stdout: str, stderr: str, diagnostics, script: str | None) -> Judgement:
    checks = tuple(_checks(ev, expect, stdout, stderr, diagnostics))
    if ev.timed_out:
        return _judgement(Verdict.TIMEOUT, f"killed after {ev.duration_s:.0f} s: the run timed out", checks)
    if ev.emulator_crash and not all(c.held for c in checks):
        return _judgement(Verdict.ERROR, "crashed under emulation; confirm on native arm64", checks)
    if ev.oom_killed and not all(c.held for c in checks):
        return _judgement(Verdict.ERROR, ev.oom_words, checks)
    if ev.stopped_for == STOPPED_OUT_FULL and not all(c.held for c in checks):
        return _judgement(Verdict.ERROR, ev.out_full_words, checks)
    broken = _broken_environment(ev)
    if broken and not all(c.held for c in checks):
        return _judgement(Verdict.ERROR, f"the environment is broken: {broken}", checks)
    if expect.needs_graph_breaks and (diagnostics is None or diagnostics.graph_break_count is None):
        return _judgement(Verdict.ERROR, "graph_breaks needs torch._dynamo.explain's count, and the "
                                        "diagnose step gave none (see diagnose/stderr.txt)", checks)
    failed = [c for c in checks if not c.held]
    own = own_code_error(ev, script) if script_failed(ev) else None
    if own is not None and _names(expect, own):
        own = None  # the scenario expects this very exception: it is the bug's
    if not failed and (own is None or any(_independent(c, own, ev, expect) for c in checks)):
        return _judgement(Verdict.REPRODUCED, "every expectation held: " +
                         "; ".join(f"{c.key} ({c.observed})" for c in checks), checks)
    if script_failed(ev):
        pair = FailureSignatures(expected=expected_signature(expect), observed=observed_signature(ev))
        if own is not None:
            why = (f"failed differently: the script's own code failed ({own.headline[:200]}, "
                   f"{script_line(own)}), which is not the scenario's failure")
            why += "; " + ("every expectation held only through that failure" if not failed else
                           "; ".join(f"{c.key}: expected {c.expected}, observed {c.observed}" for c in failed))
        else:
            why = f"failed differently: expected {pair.expected}; observed {pair.observed}"
        return Judgement(verdict=Verdict.FAILED_DIFFERENTLY, checks=checks, different=pair, reason=why)
    return _judgement(Verdict.NOT_REPRODUCED, "; ".join(
        f"{c.key}: expected {c.expected}, observed {c.observed}" for c in failed), checks)


def _names(expect: Expect, exc) -> bool:
    """Whether the scenario's expectation names the exception `exc` (its type, in traceback_contains
    or the signature): then a NameError or ImportError is the bug, not the script's own failure."""
    wanted = [expect.traceback_contains or ""]
    if expect.signature is not None and expect.signature.exception:
        wanted.append(expect.signature.exception)
    return any(exc.name in text for text in wanted)


def _independent(check: Check, own, ev: Evidence, expect: Expect) -> bool:
    """Whether a held check stands apart from the script's own failure (`own`): output, a duplicate
    runtime, a graph-break count, or another exception. An exit code, or text found only in the own
    failure's traceback, does not."""
    if not check.held:
        return False
    if check.key == "exit_code":
        return False
    if check.key == "traceback_contains":
        return any(expect.traceback_contains in f"{e.type}: {e.message}" for e in ev.exceptions if e is not own)
    if check.key == "stderr_contains":
        return expect.stderr_contains not in f"{own.type}: {own.message}"
    return check.key != "signature"


def script_failed(ev: Evidence) -> bool:
    """Whether the script itself failed: it raised, or exited with a non-zero code."""
    return ev.exception is not None or (ev.exit_code is not None and ev.exit_code != 0)


def expected_signature(expect: Expect) -> str:
    """The scenario's signature in words: what its expectations say the bug looks like."""
    parts = []
    if expect.traceback_contains is not None:
        parts.append(f"an exception containing {expect.traceback_contains!r}")
    if expect.duplicate_runtime is not None:
        parts.append(f"two or more {expect.duplicate_runtime} in one process")
    if expect.stdout_contains is not None:
        parts.append(f"stdout containing {expect.stdout_contains!r}")
    if expect.stderr_contains is not None:
        parts.append(f"stderr containing {expect.stderr_contains!r}")
    if expect.graph_breaks is not None:
        parts.append(plural(expect.graph_breaks, "graph break"))
    if expect.signature is not None:
        parts.append(expect.signature.as_failure().words())
    if expect.exit_code is not None:
        parts.append(f"exit code {_codes(expect.exit_codes)}")
    return ", ".join(parts) or "no expectation"


def observed_signature(ev: Evidence) -> str:
    """How the run failed, in the same words: its exception, duplicate runtimes and exit code."""
    exc = ev.exception
    parts = [exc.headline[:300] if exc is not None else "no exception"]
    parts += [f"two or more {d.family} in one process" for d in ev.duplicate_runtimes]
    parts.append("no exit code (killed)" if ev.exit_code is None else f"exit code {ev.exit_code}")
    return ", ".join(parts)


def _broken_environment(ev: Evidence) -> str | None:
    exc = ev.exception
    if exc and exc.type in ("ModuleNotFoundError", "ImportError") and \
            any(marker in exc.message for marker in _BROKEN_ENV):
        return exc.headline
    return None


def normalize_ws(text: str) -> str:
    """Every run of whitespace as one space: output pasted into a page rarely keeps torch's padding."""
    return " ".join(text.split())


def _checks(ev: Evidence, expect: Expect, stdout: str, stderr: str, diagnostics):
    if expect.duplicate_runtime is not None:
        dups = [d for d in ev.duplicate_runtimes if d.family == expect.duplicate_runtime]
        observed = (f"{len(dups[0].paths)} files in pid {dups[0].pid}" if dups
                    else f"one or no {expect.duplicate_runtime} per process "
                         f"({ev.processes} processes logged)")
        yield _check("duplicate_runtime", f"two or more {expect.duplicate_runtime}", observed, bool(dups))
    if expect.traceback_contains is not None:
        texts = [f"{e.type}: {e.message}" for e in ev.exceptions]
        held = any(expect.traceback_contains in t for t in texts)
        last = ev.exception
        observed = "no exception" if last is None else last.headline[:200]
        yield _check("traceback_contains", repr(expect.traceback_contains), observed, held)
    if expect.stdout_contains is not None:
        held = expect.stdout_contains in stdout
        yield _check("stdout_contains", repr(expect.stdout_contains),
                    "found" if held else "not found", held)
    if expect.stdout_contains_normalized is not None:
        wanted = normalize_ws(expect.stdout_contains_normalized)
        held = wanted in normalize_ws(stdout)
        yield _check("stdout_contains_normalized", repr(wanted), "found" if held else "not found", held)
    if expect.stderr_contains is not None:
        held = expect.stderr_contains in stderr
        yield _check("stderr_contains", repr(expect.stderr_contains),
                    "found" if held else "not found", held)
    if expect.graph_breaks is not None:
        count = diagnostics.graph_break_count if diagnostics is not None else None
        observed = "unknown: explain gave no result" if count is None else plural(count, "graph break")
        yield _check("graph_breaks", str(expect.graph_breaks), observed, count == expect.graph_breaks)
    if expect.graph_breaks_min is not None:
        count = diagnostics.graph_break_count if diagnostics is not None else None
        observed = "unknown: explain gave no result" if count is None else plural(count, "graph break")
        yield _check("graph_breaks_min", f"at least {expect.graph_breaks_min}", observed,
                     count is not None and count >= expect.graph_breaks_min)
    if expect.signature is not None:
        wanted = expect.signature.as_failure()
        seen = observed_failure(ev)
        yield _check("signature", wanted.words(), "no failure" if seen is None else seen.words(),
                     wanted.matches(seen))
    if expect.exit_code is not None:
        observed_code = "none (killed)" if ev.exit_code is None else str(ev.exit_code)
        yield _check("exit_code", _codes(expect.exit_codes), observed_code, ev.exit_code in expect.exit_codes)


def _codes(codes: tuple[int, ...]) -> str:
    return " or ".join(map(str, codes))
