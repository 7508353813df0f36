"""The lab's own errors become one paragraph on stderr and an exit code (lab.core.exitcodes); Ctrl-C
becomes 130; anything else is a bug in the lab, with its traceback only under --debug."""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable
from typing import NoReturn

import typer

from lab.cache_policy.policy import CacheInputError
from lab.cli import output
from lab.cli.output import err, fail
from lab.core import exitcodes as codes
from lab.core.errors import ConfigError, LabError, ResultError, ScenarioError
from lab.core.safetar import BundleError
from lab.drivers.bisect import BisectError
from lab.history.index import HistoryError
from lab.image.releases import ReleaseError
from lab.issue.fetch import IssueError, IssueFetchError

# Errors about what the user gave (a bundle, a release range), not about the infrastructure.
_BAD_INPUT = (BundleError, ReleaseError, BisectError, ResultError, HistoryError, CacheInputError)


def guard(fn: Callable[[], None], check: bool = False) -> None:
    """Turn the lab's own errors into one paragraph and an exit code; Ctrl-C into 130. With `check`
    (lab run --check), the codes follow `git bisect run` (lab.exitcodes). An issue page that cannot
    be read is bad input (2); GitHub not answering, infrastructure (3)."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        fn()
    except IssueError as e:
        fail(e, codes.BAD_INPUT)
    except IssueFetchError as e:
        fail(e, codes.INFRASTRUCTURE)
    except (ScenarioError, ConfigError) as e:
        fail(e, codes.failure_exit(codes.BAD_INPUT, check))
    except LabError as e:
        fail(e, codes.failure_exit(codes.BAD_INPUT if isinstance(e, _BAD_INPUT) else codes.INFRASTRUCTURE, check))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: containers removed; the run folder is marked `interrupted`.")
        raise typer.Exit(codes.INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            unexpected(e, check)
        where = f" writing {e.filename}" if e.filename else ""
        fail(f"the disk is full{where} ({e.strerror}); the command stopped there. Free space with "
             "`lab cache prune` (the lab's images, bases, site trees and wheels, least recently used "
             "first; `lab cache info` shows them and the cap) or in the engine (`docker system df`), "
             "then run the command again.", codes.failure_exit(codes.INFRASTRUCTURE, check))
    except Exception as e:
        unexpected(e, check)


def unexpected(e: Exception, check: bool) -> NoReturn:
    """A bug in the lab: one paragraph, the traceback only with --debug."""
    if output.OUTPUT.debug:
        err.print_exception()
    where = "the traceback is above" if output.OUTPUT.debug else "rerun with --debug for the traceback"
    fail(f"unexpected {type(e).__name__}: {e}. This is a bug in the lab: {where}, and please report it.",
         codes.failure_exit(codes.INTERNAL, check))
