"""The `lab` command (the console script `lab.cli:app`, and `python -m lab`): a package of small
command modules that parse options, build the typed request of the work, call the one function that
does it (outside the CLI) and print. The CLI is the only code that prints.

    app.py        the typer app: registers every command, adds -v/-q/--debug, --version
    options.py    the options several commands share (one help text each)
    output.py     stdout/stderr consoles, logging, the progress display, --json output
    guard.py      the lab's errors -> one paragraph and an exit code (lab.core.exitcodes)
    inputs.py     settings, runs folder, scenario (with --deps), case, engines (a fleet)
    scenarios.py  list, show, render          build.py     build, build-base
    run.py        run (one case, --ablate, a matrix)   bisect.py   bisect
    compare.py    compare, comment, localize  engines.py   engines
    bundle.py     bundle                      replay.py    replay
    history.py    runs, report                doctor.py    doctor, clean
    cache.py      cache info, cache prune     settings.py  schema, config
    issue.py      new, triage

A command module imports the shared modules above, never another command module
(tests/test_cli_layout.py)."""

from lab.cli.app import app, main

__all__ = ["app", "main"]
