"""The `lab` command: parse arguments, show progress, print results. No logic lives here.

Every command takes -v/-q/--debug (also before the command name): messages go through `logging`
with rich's handler on stderr, so stdout holds only results and, with --json, ends with one JSON
object. Exit codes are in lab.exitcodes.
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml
from rich.console import Console, Group
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from lab import __version__
from lab.core import exitcodes as codes
from lab.core.errors import ConfigError, EngineError, LabError, ScenarioError
from lab.core.scrub import redact_urls

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A containerized reproduction lab for PyTorch bugs.")
# Lines are wrapped at the terminal's width on a terminal only: in a log file or a CI log, a path or
# a message stays on one line (rich would break it at 80 columns), so it can be searched and copied.
err = Console(stderr=True, highlight=False, soft_wrap=not (sys.stderr is not None and sys.stderr.isatty()))
out = Console(highlight=False, soft_wrap=True)
log = logging.getLogger("lab")

ScenarioArg = Annotated[str, typer.Argument(help="A name from the project's scenarios/ or the shipped ones, "
                                            "or a path to a YAML file.", show_default=False)]
TorchOpt = Annotated[str | None, typer.Option("--torch", help="torch version (default: the scenario's).")]
ArchOpt = Annotated[str | None, typer.Option("--arch", help="amd64 or arm64 (default: the scenario's, or the "
                                             "default_arch setting where it lists several).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="End stdout with one JSON object.")]
DepsOpt = Annotated[str | None, typer.Option(
    "--deps", help="How everything but torch resolves: latest (today's index), era (as of the torch release's "
    "upload date plus a week) or a date such as 2024-04-01 (default: the scenario's `deps`, else latest).",
    show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Runs folder (default: the runs_dir setting, ./runs).")]
EngineOpt = Annotated[list[str] | None, typer.Option(
    "--engine", help="Run on this engine only: a Docker context name, a DOCKER_HOST URL (unix://, tcp://, "
    "ssh://), or `local` (this host, no container); repeat it for several. Default: the current engine and "
    "the `engines` setting.", show_default=False)]
PythonEnvOpt = Annotated[str, typer.Option(
    "--python-env", help="The local engine's Python: `venv` (a venv per case made with uv, cached) or `current` "
    "(the interpreter already there, LAB_LOCAL_PYTHON or the lab's own, when its torch is the case's).")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-script", help="Let the local engine run the script where bubblewrap cannot confine it (the report "
    "says \"not confined\").")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", help="How many cases run at once across the engines (default: each engine's slots, "
    "one per 2 CPUs and 4 GiB of memory; see `lab engines`).", show_default=False)]


# ----------------------------------------------------------------------------- output and logging

@dataclass
class _Output:
    verbose: int = 0
    quiet: bool = False
    debug: bool = False


_OUTPUT = _Output()


class _Handler(RichHandler):
    """rich's handler; without --debug a message is printed as it is, like the rest of stderr (the
    stock layout is a grid that pads every line to the terminal's width)."""

    def render(self, *, record, traceback, message_renderable):
        if not _OUTPUT.debug:
            return message_renderable if traceback is None else Group(message_renderable, traceback)
        return super().render(record=record, traceback=traceback, message_renderable=message_renderable)


def _set_output(verbose: int = 0, quiet: bool = False, debug: bool = False) -> None:
    """Flags given before and after the command name add up; the last call configures logging."""
    _OUTPUT.verbose = max(_OUTPUT.verbose, verbose)
    _OUTPUT.quiet = _OUTPUT.quiet or quiet
    _OUTPUT.debug = _OUTPUT.debug or debug
    level = (logging.DEBUG if _OUTPUT.debug or _OUTPUT.verbose else
             logging.WARNING if _OUTPUT.quiet else logging.INFO)
    handler = _Handler(console=err, show_time=_OUTPUT.debug, show_level=_OUTPUT.debug,
                       show_path=_OUTPUT.debug, highlighter=NullHighlighter(), markup=False,
                       rich_tracebacks=True, keywords=[])
    lab_log = logging.getLogger("lab")
    lab_log.handlers[:] = [handler]
    lab_log.setLevel(level)
    lab_log.propagate = False
    root = logging.getLogger()
    if _OUTPUT.debug or _OUTPUT.verbose > 1:  # -vv / --debug: the libraries' debug messages too
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG)


def _say(message: str, level: int = logging.INFO) -> None:
    """A line of progress in rich markup (the caller escapes what it did not write)."""
    log.log(level, message, extra={"markup": True})


VerboseOpt = Annotated[int, typer.Option("-v", "--verbose", count=True, show_default=False,
                                         help="More detail on stderr: every progress message (-vv: the "
                                              "libraries' debug messages too).")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="No progress on stderr: results, warnings and "
                                        "errors only.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Debug messages, and the traceback of an unexpected "
                                        "error.")]
_COMMON = [inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=0, annotation=VerboseOpt),
           inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=QuietOpt),
           inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOpt)]


def command(*args, group: typer.Typer | None = None, **kwargs) -> Callable[[Callable], Callable]:
    """`app.command` (or `group.command`), with -v/-q/--debug added to the command's own options."""
    def register(fn: Callable) -> Callable:
        signature = inspect.signature(fn, eval_str=True)

        @functools.wraps(fn)
        def wrapper(*a, verbose: int = 0, quiet: bool = False, debug: bool = False, **kw):
            _set_output(verbose, quiet, debug)
            return fn(*a, **kw)

        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), *_COMMON])
        return (group or app).command(*args, **kwargs)(wrapper)
    return register


def _show_version(value: bool) -> None:
    if value:
        out.print(f"torch-repro-lab {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: VerboseOpt = 0, quiet: QuietOpt = False, debug: DebugOpt = False,
) -> None:
    """A containerized reproduction lab for PyTorch bugs."""
    _set_output(verbose, quiet, debug)


# ----------------------------------------------------------------------------- errors and exit codes

def _fail(error: LabError | str, code: int) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(redact_urls(str(error)))}")  # an index's URL is a secret
    raise typer.Exit(code)


def _guard(fn: Callable[[], None], check: bool = False) -> None:
    """Turn the lab's own errors into one paragraph and an exit code; Ctrl-C into 130. With `check`
    (lab run --check), the codes follow `git bisect run` (lab.exitcodes)."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        fn()
    except (ScenarioError, ConfigError) as e:
        _fail(e, codes.failure_exit(codes.BAD_INPUT, check))
    except LabError as e:
        _fail(e, codes.failure_exit(codes.BAD_INPUT if _bad_input(e) else codes.INFRASTRUCTURE, check))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: containers removed; the run folder is marked `interrupted`.")
        raise typer.Exit(codes.INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            _unexpected(e, check)
        where = f" writing {e.filename}" if e.filename else ""
        _fail(f"the disk is full{where} ({e.strerror}); the command stopped there. Free space with "
              "`lab cache prune` (the lab's images, bases, site trees and wheels, least recently used "
              "first; `lab cache info` shows them and the cap) or in the engine (`docker system df`), "
              "then run the command again.", codes.failure_exit(codes.INFRASTRUCTURE, check))
    except Exception as e:
        _unexpected(e, check)


def _unexpected(e: Exception, check: bool) -> NoReturn:
    """A bug in the lab: one paragraph, the traceback only with --debug."""
    if _OUTPUT.debug:
        err.print_exception()
    where = "the traceback is above" if _OUTPUT.debug else "rerun with --debug for the traceback"
    _fail(f"unexpected {type(e).__name__}: {e}. This is a bug in the lab: {where}, and please report it.",
          codes.failure_exit(codes.INTERNAL, check))


def _bad_input(error: LabError) -> bool:
    """Errors about what the user gave (a bundle, a release range), not about the infrastructure."""
    from lab.build.releases import ReleaseError
    from lab.cache_policy.policy import CacheInputError
    from lab.core.errors import ResultError
    from lab.core.safetar import BundleError
    from lab.drivers.bisect import BisectError
    from lab.history.index import HistoryError
    return isinstance(error, (BundleError, ReleaseError, BisectError, ResultError, HistoryError, CacheInputError))


# ----------------------------------------------------------------------------- settings and scenarios

def _settings():
    from lab.core.config import current
    return current()


def _runs_root(out_dir: Path | None) -> Path:
    return _settings().with_flag("runs_dir", out_dir, "--out").runs_dir


def _scenario_dirs() -> list[Path]:
    return [d.path for d in _settings().scenario_dirs()]


def _load(ref: str, deps: str | None = None):
    from lab.scenario.schema import load_scenario
    return with_deps(load_scenario(ref, _scenario_dirs()), deps)


def with_deps(scenario, deps: str | None):
    """The scenario with `--deps` in place of its own `deps` (checked: a clear error names --deps)."""
    if deps is None:
        return scenario
    from lab.build.resolve import check_deps
    return scenario.model_copy(update={"deps": check_deps(deps)})


def _arch_for(scenario, arch: str | None) -> str | None:
    """--arch, else the default_arch setting where the scenario lists several arches and that one."""
    if arch is not None or len(scenario.arch) < 2:
        return arch
    default = _settings().default_arch
    return default.value if default is not None and default in scenario.arch else None


def _case(ref: str, torch: str | None, arch: str | None, backend: str | None = None,
          sets: list[str] | None = None, mode: str | None = None):
    from lab.build.resolve import resolve
    scenario = _load(ref)
    return resolve(scenario, torch=torch, arch=_arch_for(scenario, arch), backend=backend,
                   sets=_parse_sets(sets or []), mode=mode)


def _fleet(engines: list[str] | None, jobs: int | None, python_env: str = "venv", trust_script: bool = False):
    """The engines this command may use (see lab.engine.routing.open_fleet), the local engine with
    its options."""
    from lab.engine.routing import open_fleet
    if python_env not in ("venv", "current"):
        raise ScenarioError(f"--python-env {python_env!r}: choose venv or current.", field="--python-env")
    return open_fleet(engines or (), _settings()["engines"], jobs, warn=log.warning,
                      local=_local_options(python_env, trust_script))


def _local_options(python_env: str = "venv", trust_script: bool = False):
    from lab.engine.local_engine import LocalOptions
    settings = _settings()
    python = settings["local.python"]
    return LocalOptions(python_env=python_env, python=str(python) if python else None,
                        bwrap=settings["local.bwrap"], trust_script=trust_script)


def _engine_for(fleet, case):
    """The best engine for one case: native before QEMU, a GPU case only where the NVIDIA runtime is."""
    from lab.engine.routing import NoEngineError
    from lab.pipeline import check_gpu
    try:
        route = fleet.routes(case.arch.value, case.scenario.gpu, case.name, _gpu_hint(case.scenario))[0]
    except NoEngineError:
        live = fleet.live_engines()
        if case.scenario.gpu and len(live) == 1:  # one engine: its own answer, its fix, the CPU variant
            check_gpu(case, live[0])
        raise
    return fleet.engine(route.engine)


def _gpu_hint(scenario) -> str | None:
    """A GPU scenario's way out where no engine gives containers GPUs: its CPU variant."""
    from lab.engine.gpu import cpu_variant_hint
    return cpu_variant_hint(scenario.cpu_variant).strip() or None


def _parse_sets(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"--set expects NAME=VALUE, got {item!r}.", field="--set")
        pairs[key] = value
    return pairs


class Progress:
    """Progress of long work on stderr: build steps stay on screen, the rest updates one status line
    (no status line with -q; with -v every message stays on screen)."""

    SHOWN = ("base", "run", "diagnose", "ablate", "bisect", "replay", "site", "cache", "deps", "blame", "slurm")

    def __init__(self) -> None:
        self._status = None if _OUTPUT.quiet else err.status("starting", spinner="dots")

    def __enter__(self) -> Progress:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def __call__(self, stage: str, message: str) -> None:
        message = redact_urls(message.strip())  # pip and apt name the indexes and mirrors they read
        if not message:
            return
        if stage == "build" and message.startswith("Step "):
            _say(f"[dim]build[/] {escape(_clip(' '.join(message.split()), 160))}")  # a step's lines, joined
        elif stage in self.SHOWN and not message[0].isdigit():
            _say(f"[dim]{stage}[/] {escape(_clip(message, 400))}")
        else:
            _say(f"[dim]{stage}[/] {escape(message)}", logging.DEBUG)
        if self._status is not None:
            self._status.update(f"[bold]{stage}[/] {escape(message[:120])}")


def _clip(message: str, limit: int) -> str:
    """`message` cut to `limit` characters, and said to be cut (the full text is in the log with -v)."""
    return message if len(message) <= limit else message[: limit - 2].rstrip() + " …"


@command("list")
def list_cmd(as_json: JsonOpt = False) -> None:
    """List the scenarios: the project's (scenarios/ found upward, or scenarios_dir), then the shipped ones."""
    def body() -> None:
        from lab.scenario.schema import list_scenarios
        rows, seen = [], set()
        for folder in _settings().scenario_dirs():
            for item in list_scenarios(folder.path):
                if isinstance(item, ScenarioError):
                    row = {"name": Path(item.file or "?").stem, "error": str(item)}
                else:
                    row = {"name": item.source.stem, "title": item.title, "torch": list(item.torch),
                           "arch": [a.value for a in item.arch], "gpu": item.gpu, "base": item.base,
                           "file": str(item.source)}
                row.update(origin=folder.origin, shadowed=row["name"] in seen)
                seen.add(row["name"])
                rows.append(row)
        if as_json:
            out.print(json.dumps({"scenarios": rows}), markup=False)
            return
        table = Table("name", "torch", "arch", "gpu", "from", "title")
        for r in rows:
            origin = r["origin"] + (" (shadowed)" if r["shadowed"] else "")
            if "error" in r:
                table.add_row(r["name"], "", "", "", origin, f"[red]{escape(r['error'])}[/]")
            else:
                table.add_row(r["name"], ", ".join(r["torch"]), ", ".join(r["arch"]),
                              "yes" if r["gpu"] else "", origin, escape(r["title"] or ""))
        out.print(table)
        for folder in _settings().scenario_dirs():
            err.print(f"{folder.origin}: {escape(str(folder.path))}")
    _guard(body)


@command()
def show(scenario: ScenarioArg) -> None:
    """Show a scenario as the lab understands it."""
    def body() -> None:
        s = _load(scenario)
        data = s.model_dump(mode="json")
        data["source"] = str(s.source)
        out.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip(), markup=False)
    _guard(body)


@command()
def render(scenario: ScenarioArg, torch: TorchOpt = None, arch: ArchOpt = None) -> None:
    """Print the Dockerfile for a scenario (the build's dry run; the same bytes every time)."""
    def body() -> None:
        from lab.build.render import render_dockerfile
        sys.stdout.write(render_dockerfile(_case(scenario, torch, arch)))
    _guard(body)


@command()
def build(scenario: ScenarioArg, torch: TorchOpt = None, arch: ArchOpt = None, engines: EngineOpt = None) -> None:
    """Build the image for a scenario (bootstrapping its base if no registry answers)."""
    def body() -> None:
        from lab.build.hostpip import discover
        from lab.build.image import build_image, check_release
        from lab.build.render import plan_build
        case = _case(scenario, torch, arch)
        host = discover()
        check_release(case, host)  # before anything is built
        engine = _engine_for(_fleet(engines, None), case)
        with Progress() as progress:
            from lab.build import era
            case = era.apply(case, host, progress)[0]  # `deps: era` or a date: pinned as a run pins them
            image = build_image(plan_build(case, host, progress), engine, host, progress)
        err.print(f"{'cached' if image.cached else 'built'} {image.tag} "
                  f"({image.base.origin} base {image.base.ref})")
        out.print(image.tag, markup=False)
    _guard(body)


@command()
def run(
    scenario: ScenarioArg,
    torch: Annotated[str | None, typer.Option("--torch", help="torch version, or a comma-separated list for "
                                              "a matrix (default: the scenario's).")] = None,
    arch: Annotated[str | None, typer.Option("--arch", help="amd64, arm64, or both: amd64,arm64 "
                                             "(default: the scenario's).")] = None,
    backend: Annotated[str | None, typer.Option(help="eager, aot_eager or inductor (sets LAB_BACKEND).")] = None,
    out_dir: OutOpt = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Scenario variable NAME=VALUE.")] = None,
    mode: Annotated[str | None, typer.Option(help="inductor mode, e.g. max-autotune (sets LAB_MODE).")] = None,
    ablate: Annotated[bool, typer.Option("--ablate", help="Run eager, aot_eager, inductor (and max-autotune "
                                         "where allowed) on one image and name the failing layer.")] = False,
    diagnose: Annotated[bool | None, typer.Option(
        "--diagnose/--no-diagnose", help="Collect explain, recompiles, compile times and TORCH_TRACE in a "
        "second run: always, or never. Default: only when the run raised a Dynamo or Inductor exception "
        "or the scenario expects a graph-break count.", show_default=False)] = None,
    compile_debug: Annotated[bool, typer.Option("--compile-debug", help="Also run the diagnose step with "
                                                "TORCH_COMPILE_DEBUG=1 (output in diagnose/compile_debug/).")] = False,
    select_k: Annotated[str | None, typer.Option("-k", help="Run only the matrix cells whose name matches, "
                                                 'e.g. -k "arch=arm64 and not 2.5.1".')] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Run each case N times and report a reproduction "
                                        "rate (for flaky bugs).")] = 1,
    allow_network: Annotated[bool, typer.Option("--allow-network", help="Let the script use the network, "
                                                "for scenarios that ask for it (network: true).")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit with the verdict, as `git bisect run` reads it: "
                                        "0 not reproduced, 1 reproduced, 125 no verdict (infrastructure).")] = False,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    python_env: PythonEnvOpt = "venv",
    trust_script: TrustOpt = False,
    deps: DepsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build and run a scenario (or a matrix of versions x arches), analyse what happened and write a report."""
    verdict: list[str] = []

    def body() -> None:
        from lab.build.hostpip import discover
        from lab.build.image import check_release
        from lab.build.resolve import parse_arch
        from lab.drivers.matrix import expand, select, split_list
        from lab.pipeline import run_case, run_limits
        if ablate and (backend or mode):
            raise ScenarioError("--ablate runs every backend; leave out --backend and --mode.", field="--ablate")
        versions = split_list(torch, "--torch")
        arches = [parse_arch(a) for a in split_list(arch, "--arch") or []] or None
        loaded = _load(scenario, deps)
        cases = select(expand(loaded, versions, arches, backend, _parse_sets(sets or []), mode), select_k)
        if not cases:
            raise ScenarioError(f"-k {select_k!r} matches no cell.", field="-k")
        if repeat < 1:
            raise ScenarioError(f"--repeat must be 1 or more, not {repeat}.", field="--repeat")
        if ablate and (len(cases) > 1 or repeat > 1):
            raise ScenarioError("--ablate runs one case: choose one torch version and one arch.", field="--ablate")
        if check and (len(cases) > 1 or repeat > 1 or ablate):
            raise ScenarioError("--check judges one run: choose one torch version and one arch, without "
                                "--repeat or --ablate.", field="--check")
        host = discover()
        only_local = bool(engines) and {e.strip() for e in engines} <= {"local", "local://"}
        for c in cases:  # refuse before anything is built, or any engine is asked
            run_limits(c, allow_network)
            if not only_local:  # the local engine's Python is the host's, not the base image's: uv says
                check_release(c, host)
        runs_root = _runs_root(out_dir)
        fleet = _fleet(engines, jobs, python_env, trust_script)
        if len(cases) == 1 and repeat == 1:
            case = cases[0]
            engine = _engine_for(fleet, case)
            _check_local(case, engine)
            on = f" on engine {engine.name}" if len(fleet.engines) > 1 or engines else ""
            _say(f"[bold]{escape(case.name)}[/]" + (" (emulated with QEMU)" if case.arch != engine.arch else "") + on)
            if ablate:
                _ablate(case, engine, host, runs_root, as_json)
                return
            with Progress() as progress:
                outcome = run_case(case, engine, host, runs_root, progress, diagnose=diagnose,
                                   compile_debug=compile_debug, allow_network=allow_network)
            _print_outcome(outcome)
            if as_json:
                out.print(json.dumps(outcome.result.to_json()), markup=False)
            verdict.append(outcome.result.verdict.value)
            return
        _matrix(cases, fleet, host, runs_root, repeat, as_json,
                dict(diagnose=diagnose, compile_debug=compile_debug, allow_network=allow_network))
    _guard(body, check)
    if check and verdict and (code := codes.verdict_exit(verdict[0], check)):
        raise typer.Exit(code)


def _check_local(case, engine) -> None:
    """The local engine's refusals (another arch, no sandbox without --trust-script, missing system
    packages), before anything is made."""
    from lab.pipeline import check_local, is_local
    if is_local(engine):
        check_local(case, engine)
        if not engine.confinement.confined:
            log.warning("the local engine runs the script NOT CONFINED (--trust-script): "
                        f"{engine.confinement.problem}")


def _matrix(cases, fleet, host, runs_root: Path, repeat: int, as_json: bool, options: dict) -> None:
    from lab.core.results import MatrixResult, read_document
    from lab.drivers.matrix import matrix_result, run_matrix, write_matrix_folder
    from lab.drivers.parallel import EngineGone, on_engine, remove_containers
    from lab.pipeline import run_case

    workers = max(1, min(fleet.slots, len(cases) * repeat))
    if all(fleet.queues(name) for name in fleet.engines):  # Slurm queues the cells itself: one array
        workers = len(cases) * repeat
    err.print(f"[bold]{len(cases)} cell(s)[/]" + (f" x {repeat} runs" if repeat > 1 else "")
              + (f", {workers} at once on {len(fleet.live_engines())} engine(s)" if workers > 1 else "") + ":")
    for c in cases:
        first = fleet.routes(c.arch.value, c.scenario.gpu, c.name, _gpu_hint(c.scenario))[0]
        err.print(f"  {escape(c.name)}" + (" (emulated)" if first.emulated else ""))

    def run_one(case, i: int):
        label = escape(case.name) + (f" run {i + 1}/{repeat}" if repeat > 1 else "")
        opts = dict(options)
        if i > 0:  # the diagnose step says the same thing every time
            opts["diagnose"] = opts["compile_debug"] = False

        def on(engine, emulated: bool):
            err.print(f"[bold]{label}[/]" + (f" on engine {escape(engine.name)}" if len(fleet.engines) > 1 else ""))
            if workers > 1:  # one status line cannot show several runs: their steps go to -v
                def quiet(stage: str, message: str) -> None:
                    _say(f"[dim]{label}[/] {escape(message[:160])}", logging.DEBUG)
                outcome = run_case(case, engine, host, runs_root, quiet, **opts)
            else:
                with Progress() as progress:
                    outcome = run_case(case, engine, host, runs_root, progress, **opts)
            if outcome.result.verdict.value in ("error", "timeout") and not engine.alive():
                raise EngineGone(f"the engine {engine.name} stopped answering")
            _print_outcome(outcome)
            return outcome.result

        return on_engine(fleet, case.arch.value, case.scenario.gpu, f"cell {case.name}", on,
                         lambda st, m: log.warning(m) if st == "engine" else None)

    cells = run_matrix(cases, run_one, repeat, workers=workers,
                       on_interrupt=lambda: remove_containers(fleet.live_engines()))
    table = Table("cell", "verdict", *(["rate"] if repeat > 1 else []), "run folder")
    for cell in cells:
        colour = _COLOURS.get(cell.verdict, "bold")
        last = cell.results[-1].run_dir if cell.results else ""
        table.add_row(escape(cell.name), f"[{colour}]{cell.verdict}[/]",
                      *([cell.rate_words()] if repeat > 1 else []), escape(str(last)))
    err.print(table)
    if repeat > 1:  # the rates on lines of their own, whatever the terminal's width
        for cell in cells:
            err.print(f"{escape(cell.name)}: {cell.rate_words()}", soft_wrap=True)
    folder = write_matrix_folder(runs_root, matrix_result(cases[0].scenario, cells))
    err.print(f"matrix: {escape(str(folder / 'report.html'))}", soft_wrap=True)
    if as_json:
        out.print(json.dumps(read_document(folder / "matrix.json", MatrixResult).to_json()), markup=False)


def _ablate(case, engine, host, runs_root: Path, as_json: bool) -> None:
    from lab.drivers.ablate import run_ablation
    with Progress() as progress:
        ablation = run_ablation(case, engine, host, runs_root, progress)
    folder, steps, conclusion = ablation.folder, ablation.steps, ablation.conclusion
    table = Table("backend", "mode", "verdict", "run folder")
    for s in steps:
        colour = _COLOURS.get(s.verdict.value, "bold")
        table.add_row(s.rung.backend, s.rung.mode or "", f"[{colour}]{s.verdict.value}[/]",
                      s.run_dir.name if s.run_dir else "")
    err.print(table)
    err.print(f"ablation: [bold]{escape(conclusion.words)}[/]")
    err.print(f"report:   {folder / 'ablation.md'}")
    if as_json:
        out.print(json.dumps(ablation.result.to_json()), markup=False)


_COLOURS = {"reproduced": "bold red", "not_reproduced": "bold green", "error": "bold yellow",
            "timeout": "bold yellow", "flaky": "bold magenta", "mixed": "bold magenta",
            "failed_differently": "bold dark_orange"}


def _print_outcome(outcome) -> None:
    r = outcome.result
    colour = _COLOURS.get(r.verdict.value, "bold")
    err.print(f"verdict: [{colour}]{r.verdict.value}[/] ({escape(r.reason)})")
    for sentence in r.summary:
        err.print(f"  - {escape(sentence)}")
    report = Path(r.run_dir) / "report.md"
    err.print(f"report:  {report}")
    if report.with_name("report.html").exists():
        err.print(f"         {report.with_name('report.html')} (open it in a browser)")


@command("bisect")
def bisect_cmd(
    scenario: ScenarioArg,
    old: Annotated[str, typer.Option("--from", help="The older torch release (one end).", show_default=False)],
    new: Annotated[str, typer.Option("--to", help="The newer torch release (the other end).", show_default=False)],
    arch: ArchOpt = None,
    out_dir: OutOpt = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="Scenario variable NAME=VALUE.")] = None,
    pre: Annotated[bool, typer.Option("--pre", help="Include pre-releases among the candidates.")] = False,
    keep_images: Annotated[bool, typer.Option("--keep-images", help="Keep the images the probes build "
                                              "(by default each is removed after its probe).")] = False,
    engines: EngineOpt = None,
    jobs: JobsOpt = None,
    failed_differently: Annotated[str, typer.Option(
        "--failed-differently", help="How a probe that fails, but not with the scenario's signature, counts: "
        "skip (never a boundary), reproduced or not-reproduced.")] = "skip",
    localize: Annotated[bool, typer.Option("--localize/--no-localize", help="Localize a compile failure at the "
                                           "boundary (ablation, then compiler_bisector where torch ships it).")] = True,
    blame: Annotated[bool, typer.Option("--blame/--no-blame", help="At the boundary, rebuild each side with the "
                                        "other side's and its own era's dependencies and name the package that "
                                        "flips the verdict, or torch alone (default: when they differ).")] = True,
    trust_script: TrustOpt = False,
    deps: DepsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the torch release where a scenario's verdict changes (a regression or a fix). With several
    slots (--jobs, or engines), each round probes that many releases at once (k-ary bisection)."""
    def body() -> None:
        from lab.build.hostpip import discover
        from lab.compare.diff import boundary_lines, counting
        from lab.drivers.bisect_run import run_bisect
        from lab.scenario.schema import check_version
        old_v, new_v = check_version(old, "--from"), check_version(new, "--to")
        counted = counting(failed_differently)
        loaded = _load(scenario, deps)
        runs_root = _runs_root(out_dir)
        fleet = _fleet(engines, jobs, "venv", trust_script)
        if "local" in fleet.engines and len(fleet.engines) == 1:  # refuse before the first probe
            from lab.build.resolve import resolve
            from lab.drivers.bisect_run import choose_arch
            _check_local(resolve(loaded, torch=old_v, arch=choose_arch(loaded, _arch_for(loaded, arch)),
                                 sets=_parse_sets(sets or [])), fleet.engine("local"))
        resume: list[str] = []

        def on_start(candidates: list[str], folder: Path, command: str) -> None:
            resume.append(command)
            err.print(f"[bold]bisect {escape(loaded.name)}[/]: {len(candidates)} candidate releases "
                      f"({escape(', '.join(candidates))})")
            err.print(f"folder: {folder}")
            err.print(f"resume after an interruption with: [bold]{escape(command)}[/]")

        def on_probe(probe, reused: bool) -> None:
            colour = _COLOURS.get(probe.verdict, "bold")
            note = " (from an earlier run)" if reused else ""
            why = probe.evidence or probe.reason
            took = (f" ({probe.total_s:.0f} s: build {probe.build_s or 0:.0f} s, run {probe.run_s or 0:.0f} s)"
                    if probe.total_s is not None and not reused else "")
            where = f" on {escape(probe.engine)}" if probe.engine and len(fleet.engines) > 1 and not reused else ""
            err.print(f"  torch {escape(probe.version)}: [{colour}]{probe.verdict}[/]{note}{where}{took}"
                      + (f" - {escape(why[:140])}" if why else ""))

        try:
            with Progress() as progress:
                run = run_bisect(loaded, scenario, old_v, new_v, _arch_for(loaded, arch), None, discover(),
                                 runs_root, progress, pre=pre, sets=_parse_sets(sets or []), on_probe=on_probe,
                                 on_start=on_start, keep_images=keep_images, fleet=fleet,
                                 failed_differently=counted, localize=localize, blame=blame)
        except KeyboardInterrupt:
            if resume:
                err.print(f"resume with: [bold]{escape(resume[0])}[/]")
            raise
        result = run.result
        if result.width > 1:
            err.print(f"{len(result.steps)} probes in {result.rounds} rounds, up to {result.width} at once")
        colour = "bold" if result.status == "found" else "bold yellow"
        err.print(f"[{colour}]{result.status}[/]: {escape(result.summary)}")
        for line in boundary_lines(result):
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        if result.signature is not None:  # an exit-code-only scenario: every failure held to the first one's
            err.print(f"failures held to the signature torch {result.signature_from} recorded first: "
                      f"{result.signature.words()} ({run.folder / 'signature.json'})", markup=False, soft_wrap=True)
        err.print(f"report: {run.folder / 'bisect.md'}")
        if as_json:
            out.print(json.dumps(result.to_json()), markup=False)
    _guard(body)


@command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="A run folder, or a bisect folder (its boundary pair).")],
    b: Annotated[Path | None, typer.Argument(help="The other run folder.", show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """What changed between two runs of one scenario, most telling first: verdict and exception, graph
    breaks, loaded libraries, pip packages, environment, Dockerfile."""
    def body() -> None:
        from lab.compare.diff import compare_runs, resolve_pair
        c = compare_runs(*resolve_pair(a, b))
        first: list[str] = []
        if b is None and (a / "bisect.json").is_file():  # dependencies first when they are the cause
            from lab.core.results import BisectResult, read_document
            first = read_document(a / "bisect.json", BisectResult).blame_lines()
        for line in [*first, *c.summary]:
            (err if as_json else out).print(line, markup=False, highlight=False, soft_wrap=True)
        if as_json:
            out.print(json.dumps(c.to_json()), markup=False)
    _guard(body)


@command("comment")
def comment_cmd(
    folder: Annotated[Path, typer.Argument(help="A run folder or a bisect folder.")],
) -> None:
    """Print a Markdown comment ready to paste into a GitHub issue (secrets scrubbed as in bundles)."""
    def body() -> None:
        from lab.compare.comment import render_comment
        out.print(render_comment(folder).rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    _guard(body)


@command("localize")
def localize_cmd(
    scenario: ScenarioArg,
    torch: TorchOpt = None,
    arch: ArchOpt = None,
    out_dir: OutOpt = None,
    engines: EngineOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Localize a compile bug on one release: the backend ablation names the layer, then
    torch._inductor.compiler_bisector (where the release ships it) names the subsystem or pass."""
    def body() -> None:
        from lab.build.hostpip import discover
        from lab.drivers.localize import localize
        from lab.report.run_folder import new_run_dir
        case = _case(scenario, torch, arch)
        host = discover()
        engine = _engine_for(_fleet(engines, None), case)
        runs_root = _runs_root(out_dir)
        with Progress() as progress:
            result = localize(case, engine, host, runs_root, new_run_dir(runs_root, case, suffix="localize"),
                              progress)
        err.print(f"localize: [bold]{escape(result.conclusion)}[/]")
        if as_json:
            out.print(json.dumps(result.to_json()), markup=False)
    _guard(body)


@command("engines")
def engines_cmd(
    engines: Annotated[list[str] | None, typer.Option(
        "--engine", help="Also list this engine: a Docker context name or a DOCKER_HOST URL; repeatable.",
        show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the Docker engines the lab can use (the current one, the `engines` setting and --engine), with
    their architecture, CPUs, memory, GPU runtime, version, free disk and slots. Unreachable ones are shown
    with the reason."""
    def body() -> None:
        from lab.core.records import format_bytes
        from lab.engine.engines import engine_specs, parse_spec, slurm_specs, survey
        specs = engine_specs(engines or (), _settings()["engines"])
        if not any(s.kind == "local" for s in specs):
            specs.append(parse_spec("local", "built-in"))
        specs += [s for s in slurm_specs() if s.name not in {t.name for t in specs}]  # a Slurm that answers here
        facts = [f for f, _ in survey(specs)]
        if as_json:
            out.print(json.dumps({"engines": [f.as_json() for f in facts]}), markup=False)
            return
        for f in facts:  # a paragraph per engine: readable in any terminal width
            head = f"[bold]{escape(f.name)}[/] ({escape(f.source)}, {escape(f.url or 'no address')})"
            if not f.reachable:
                out.print(f"{head}: [red]unreachable[/], skipped: {escape(f.reason or '')}", soft_wrap=True)
                continue
            disk = format_bytes(f.free_disk) if f.free_disk is not None else f"unknown ({f.free_disk_note})"
            if f.kind == "local":
                out.print(f"{head}: [green]available[/] (this host, no container; `--engine local`)\n"
                          f"  arch {f.arch} only (no emulation), {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                          f"NVIDIA devices {'yes' if f.gpu else 'no'}\n"
                          f"  confinement {escape(f.confinement or '?')}; free disk {escape(disk)} (cache); "
                          f"{f.slots} slot(s)", soft_wrap=True)
                continue
            if f.kind == "slurm":
                out.print(f"{head}: [green]available[/] (Slurm partition; `--engine {escape(f.name)}`)\n"
                          f"  {f.nodes} node(s): arch {f.arch}, {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                          f"{f.gpus or 0} GPU(s) per node; {escape(f.version or '?')}; {f.slots} slot(s)",
                          soft_wrap=True)
                continue
            emulates = ", ".join(f.emulates) or "nothing" if f.emulates is not None else "unknown (remote)"
            out.print(f"{head}: [green]reachable[/]\n"
                      f"  arch {f.arch}, {f.cpus} CPUs, {format_bytes(f.memory or 0)} memory, "
                      f"GPU runtime {'yes' if f.gpu else 'no'}, Docker {escape(f.version or '?')}\n"
                      f"  free disk {escape(disk)}; emulates {escape(emulates)}; {f.slots} slot(s)",
                      soft_wrap=True)
    _guard(body)


@command("bundle")
def bundle_cmd(
    path: Annotated[Path, typer.Argument(help="A run folder (or, with --inspect, a bundle).", show_default=False)],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The .tar.gz to write "
                                                "(default: <run folder name>.tar.gz here).")] = None,
    slim: Annotated[bool, typer.Option("--slim", help="Leave out the raw loader logs (out/ld/).")] = False,
    inspect: Annotated[bool, typer.Option("--inspect", help="Show a bundle's manifest without unpacking it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace the -o file if it exists.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Pack a run folder into one .tar.gz to attach to an upstream issue (secrets scrubbed), or --inspect one."""
    def body() -> None:
        from lab.bundle.archive import inspect_bundle, write_bundle
        from lab.core.records import format_bytes
        from lab.history.index import note_bundle
        if inspect:
            manifest = inspect_bundle(path)
            if as_json:
                out.print(json.dumps(manifest.model_dump(mode="json")), markup=False)
                return
            total = sum(f.size for f in manifest.files)
            out.print(f"{path}: {manifest.format} v{manifest.format_version}, made "
                      f"{manifest.created} by lab {manifest.lab_version}", markup=False)
            out.print(f"case:    {manifest.case}", markup=False)
            out.print(f"verdict: {manifest.verdict} ({manifest.reason})", markup=False)
            for sentence in manifest.summary:
                out.print(f"  - {sentence}", markup=False)
            kinds = {k: sum(1 for f in manifest.files if f.kind == k) for k in ("meta", "data")}
            out.print(f"files:   {len(manifest.files)} ({kinds['meta']} metadata, {kinds['data']} data), "
                      f"{format_bytes(total)} unpacked" + (", slim" if manifest.slim else ""), markup=False)
            for item in manifest.left_out:
                out.print(f"left out: {item.path} ({item.why})", markup=False)
            return
        info = write_bundle(path, output, slim=slim, force=force)
        if (note := note_bundle(path, info.path)) is not None:
            log.warning(note)
        err.print(f"bundle: {info.path} ({format_bytes(info.size)}, {info.file_count} files"
                  + (", slim" if slim else "") + ")")
        for item in info.left_out:
            err.print(f"  left out: {escape(item.path)} ({escape(item.why)})")
        err.print(f"replay it with: [bold]lab replay {escape(str(info.path))}[/]")
        if as_json:
            out.print(json.dumps({"bundle": str(info.path), "size": info.size, "files": info.file_count,
                                  "left_out": [e.model_dump(mode="json") for e in info.left_out]}), markup=False)
        else:
            out.print(str(info.path), markup=False)
    _guard(body)


DECLINED = 4  # exit code of `lab replay` when the user answers no: nothing was built or run


@command("replay")
def replay_cmd(
    bundle: Annotated[Path, typer.Argument(help="A bundle made by `lab bundle`.", show_default=False)],
    out_dir: OutOpt = None,
    allow_network: Annotated[bool, typer.Option("--allow-network", help="Let the script use the network, "
                                                "if the bundled scenario asks for it.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Build and run without asking (the summary is "
                                      "still printed). Without a terminal and without --yes, replay refuses "
                                      "(exit 4).")] = False,
    bundled_dockerfile: Annotated[bool, typer.Option(
        "--bundled-dockerfile", help="UNSAFE: build the bundle's own Dockerfile instead of this lab's "
        "re-render of its scenario. Its RUN steps run at build time, as root, without network.")] = False,
    allow_source_builds: Annotated[bool, typer.Option(
        "--allow-source-builds", help="UNSAFE: let pip inside the build install what is not a wheel resolved "
        "on this host (a direct URL, a VCS or path reference, an sdist), with the engine's default network "
        "and no credentials. Their build code runs at build time.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a bundle, show what it would build and run, ask, then rebuild it with this lab's templates,
    rerun it and compare the verdict and evidence with the bundled ones. Exit 4 when you decline, or when
    there is no terminal to ask on and no --yes."""
    def body() -> None:
        from lab.build.hostpip import discover
        from lab.bundle.replay import discard_replay, execute_replay, prepare_replay
        from lab.engine.docker_engine import Engine
        runs_root = _runs_root(out_dir)
        engine = Engine.connect()
        plan = prepare_replay(bundle, runs_root, engine.arch, allow_network=allow_network,
                              bundled_dockerfile=bundled_dockerfile, allow_source_builds=allow_source_builds)
        try:
            _show_replay_plan(plan)
            if not _confirm_replay(yes):
                raise typer.Exit(DECLINED)
            with Progress() as progress:
                outcome = execute_replay(plan, engine, discover(), progress)
        finally:
            discard_replay(plan)
        original, result = outcome.original, outcome.result
        err.print(f"original: {original.verdict.value} ({escape(original.reason)})")
        colour = _COLOURS.get(result.verdict.value, "bold")
        err.print(f"replay:   [{colour}]{result.verdict.value}[/] ({escape(result.reason)})")
        if outcome.comparison.same:
            err.print("[bold green]same verdict, same signature[/]")
        else:
            err.print("[bold yellow]different:[/]")
            for line in outcome.comparison.lines:
                err.print(f"  - {escape(line)}")
        err.print(f"report:   {outcome.run_dir / 'report.md'}")
        if as_json:
            out.print(json.dumps({**result.to_json(), "replay": {
                "same": outcome.comparison.same, "differences": [] if outcome.comparison.same else
                list(outcome.comparison.lines), "original_verdict": original.verdict.value,
                "dockerfile_same_as_this_lab": outcome.dockerfile_same_as_this_lab,
                "dockerfile_built": outcome.built.value}}), markup=False)
    _guard(body)


def _show_replay_plan(plan) -> None:
    """What a replay will build and run, on stderr, before anything happens."""
    from lab.bundle.replay import Built, limit_lines
    from lab.core.records import format_bytes
    m, case, script = plan.manifest, plan.case, plan.script

    def row(name: str, value: str) -> None:
        err.print(f"  {name:<16} ", end="")
        err.print(value, markup=False, emoji=False, highlight=False, soft_wrap=True)

    err.print(f"[bold]replay of {escape(str(plan.bundle))}[/]", soft_wrap=True)
    row("bundle", f"made {m.created} by torch-repro-lab {m.lab_version}, {len(m.files)} files")
    row("original", f"{case.name}: {plan.original.verdict.value}")
    row("base", f"{case.scenario.base} ({case.arch.platform}"
        + (", emulated with QEMU)" if plan.emulated else ", native)"))
    row("torch", case.torch + (f", backend {case.backend}" if case.backend else "")
        + (f", mode {case.mode}" if case.mode else ""))
    row("system packages", (", ".join(plan.system_packages) or "none")
        + (f" (and the lab's {', '.join(plan.lab_packages)})" if plan.lab_packages else ""))
    row("pip", ", ".join(plan.requirements))
    if plan.allow_source_builds:
        named = "; ".join(f"{r.requirement} ({r.kind})" for r in plan.source_requirements)
        err.print(f"  {'source builds':<16} [bold red]ALLOWED (--allow-source-builds): pip inside the build may "
                  f"fetch and build what is not a wheel resolved on this host{': ' + escape(named) if named else ''}"
                  "; that step gets the engine's default network, never this host's credentials[/]",
                  soft_wrap=True)
    else:
        row("build", "wheels resolved on this host from your indexes only; no network, no credentials"
            + (" (the system packages step gets the default network when the base lacks them)"
               if plan.built is Built.RENDERED else ""))
    row("GPU", "yes (all GPUs of the engine)" if plan.gpu else "no")
    for limit in limit_lines(plan):
        _limit_row(limit)
    row("environment", ", ".join(f"{k}={v}" for k, v in plan.env) or "none")
    row("script", f"{script.name} ({format_bytes(script.size)}, sha256 {script.sha256[:16]}...)"
        + (f", args: {' '.join(plan.args)}" if plan.args else ""))
    for note in script.notes:
        row("", f"note: {note}")
    width = len(str(len(script.lines)))
    for number, line in enumerate(script.lines, 1):
        err.print(f"    {number:>{width}} | {line}", markup=False, emoji=False, highlight=False, soft_wrap=True)
    if script.more_lines:
        err.print(f"    ... and {script.more_lines} more line{'s' if script.more_lines != 1 else ''} "
                  f"(all of it: tar xzf {plan.bundle} {plan.script_in_bundle})",
                  markup=False, emoji=False, soft_wrap=True)
    if plan.masked:
        row("secrets", f"{', '.join(plan.masked)} were scrubbed by the bundle's author and are '***' here")
    if plan.bundled is None:
        row("Dockerfile", "the bundle has none; this lab's re-render of the scenario is built")
    elif plan.dockerfile_same:
        row("Dockerfile", "this lab's re-render of the scenario, identical to the bundled one")
    else:
        err.print("  [bold yellow]the bundled Dockerfile differs from this lab's re-render of its scenario:[/]")
        for line in plan.diff:
            err.print(f"    {line}", markup=False, emoji=False, highlight=False, soft_wrap=True)
        if plan.diff_cut:
            err.print(f"    ... and {plan.diff_cut} more diff lines", markup=False, soft_wrap=True)
        row("Dockerfile", "the bundle's own (--bundled-dockerfile)" if plan.built is Built.BUNDLED
            else "this lab's re-render is built, not the bundled one")
    if plan.built is Built.BUNDLED:
        err.print("[bold red]WARNING:[/] --bundled-dockerfile builds the bundle's own Dockerfile. Whoever made or "
                  "edited the bundle wrote its RUN steps, and they run NOW, at build time, as root in a build "
                  "container (without network and without this host's credentials, but with its CA bundle in "
                  "the build context), before any of the lab's confinement applies. Read the Dockerfile above "
                  "before you go on.", soft_wrap=True)


def _limit_row(limit) -> None:
    """One limit of the summary; a value above this lab's default in bold red, saying so."""
    err.print(f"  {limit.name:<16} ", end="")
    if limit.above is None:
        err.print(limit.value, markup=False, emoji=False, highlight=False, soft_wrap=True)
    else:
        err.print(f"[bold red]{escape(limit.value)} (above this lab's default {escape(limit.above)})[/]",
                  emoji=False, highlight=False, soft_wrap=True)


def _confirm_replay(yes: bool) -> bool:
    """Whether to go on: --yes, or the user's answer on a terminal (no by default). Without a
    terminal and without --yes, no: a stranger's bundle is built only when someone said so."""
    if yes:
        err.print("--yes: building and running without asking.")
        return True
    if not sys.stdin.isatty():
        err.print(f"no terminal to ask on (stdin is not a TTY) and no --yes, so nothing was built or run, and "
                  f"nothing was kept (exit {DECLINED}): a replay builds and runs a stranger's bundle only when you "
                  "say so. Read the summary above, then run the same command again with --yes to build and run "
                  "it.", soft_wrap=True)
        return False
    try:
        agreed = typer.confirm("Build this image and run the script?", default=False, err=True)
    except typer.Abort:
        agreed = False
    if not agreed:
        err.print(f"declined: nothing was built or run, and nothing was kept (exit {DECLINED}).")
    return agreed


@command("runs")
def runs_cmd(
    scenario: Annotated[str | None, typer.Argument(help="Only this scenario's runs (its name).")] = None,
    torch: TorchOpt = None,
    arch: ArchOpt = None,
    verdict: Annotated[str | None, typer.Option("--verdict", help="Only runs with this verdict.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only runs started on or after this date "
                                              "(YYYY-MM-DD, UTC).")] = None,
    flaky: Annotated[bool, typer.Option("--flaky", help="Cases whose runs reached different verdicts, "
                                        "with their reproduction rate.")] = False,
    gc: Annotated[bool, typer.Option("--gc", help="Remove old run folders the lab made for your runs (never the "
                                     "newest of a case, nor what a bisection or a bundle refers to).")] = False,
    older_than: Annotated[str | None, typer.Option("--older-than", help="With --gc: folders older than this "
                                                   "(30d, 12h, 2w).")] = None,
    keep: Annotated[int | None, typer.Option("--keep", min=0, help="With --gc: keep the newest N runs of "
                                             "each case.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --gc: say what would go, remove nothing.")]
    = False,
    out_dir: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The run history: every run, probe, matrix cell and replay under the runs folder, newest first."""
    from lab.history.index import RunIndex, parse_age, parse_since

    def body() -> None:
        index = RunIndex(_runs_root(out_dir))
        if gc:
            done = index.gc(parse_age(older_than) if older_than else None, keep, dry_run=dry_run)
            _notes(index)
            verb = "would remove" if dry_run else "removed"
            for path in done.removed:
                err.print(f"{verb} {escape(str(path))}", soft_wrap=True)
            for path in done.kept_referenced:
                err.print(f"kept {escape(str(path))} (a bisection or a bundle refers to it)", soft_wrap=True)
            err.print(f"{verb} {len(done.removed)} run folder(s), kept {len(done.kept_referenced)} referenced")
            if done.not_marked:
                err.print(f"left alone {len(done.not_marked)} folder(s) the lab did not mark as made for your runs "
                          "(made by an older lab, or unpacked from a bundle): remove those by hand")
            if as_json:
                out.print(json.dumps({"removed": [str(p) for p in done.removed], "dry_run": dry_run,
                                      "kept": [str(p) for p in done.kept_referenced],
                                      "not_marked": [str(p) for p in done.not_marked]}), markup=False)
            return
        if flaky:
            cases = index.flaky(scenario)
            _notes(index)
            table = Table("case", "runs", "reproduced", "rate")
            for c in cases:
                table.add_row(escape(c.case), str(c.runs), f"{c.reproduced}/{c.runnable}", f"{c.rate:.0%}")
            err.print(table if cases else "no flaky case: every case's runs agree")
            if as_json:
                out.print(json.dumps({"flaky": [c.to_json() for c in cases]}), markup=False)
            return
        entries = index.query(scenario, torch, arch, verdict, parse_since(since) if since else None)
        _notes(index)
        table = Table("started", "case", "kind", "verdict", "run folder")
        for e in entries:
            colour = _COLOURS.get(e.verdict, "bold")
            table.add_row(e.started, escape(e.case), e.kind, f"[{colour}]{e.verdict}[/]", escape(str(e.path)))
        if as_json:
            err.print(table if entries else "no run matches")
            out.print(json.dumps({"runs": [e.to_json() for e in entries]}), markup=False)
        else:
            out.print(table if entries else "no run matches")
    _guard(body)


def _notes(index) -> None:
    for note in index.notes:
        log.warning(note)


@command("report")
def report_cmd(
    folders: Annotated[list[Path], typer.Argument(help="Run, bisect or matrix folders.", exists=True,
                                                  file_okay=False, resolve_path=True)],
) -> None:
    """(Re)write report.html in run, bisect and matrix folders (a self-contained page: open it in any browser)."""
    from lab.report.html import write_folder_html

    def body() -> None:
        for folder in folders:
            out.print(str(write_folder_html(folder)), markup=False, soft_wrap=True)
    _guard(body)


@command("build-base")
def build_base(
    image: Annotated[str, typer.Argument(help="Base image, e.g. debian:bookworm.")] = "debian:bookworm",
    arch: Annotated[str | None, typer.Option("--arch", help="amd64 or arm64 (default: the default_arch "
                                             "setting, else amd64).", show_default=False)] = None,
    packages: Annotated[str | None, typer.Option(
        "--packages", help="A scenario's system_packages, comma-separated (e.g. g++,python3-dev): a "
        "bootstrapped base then includes them with the lab's own, as that scenario's runs get it.",
        show_default=False)] = None,
) -> None:
    """Make sure a base image is on the engine (present, pulled, or bootstrapped); print its tag."""
    def body() -> None:
        from lab.build.base import ensure_base
        from lab.build.render import BASE_PACKAGES
        from lab.build.resolve import parse_arch
        from lab.core.errors import ScenarioError
        from lab.engine.docker_engine import Engine
        from lab.scenario.schema import Arch, is_debian_package
        default = _settings().default_arch
        chosen = Arch(parse_arch(arch) or (default.value if default else "amd64"))
        wanted = tuple(p.strip() for p in (packages or "").split(",") if p.strip())
        for name in wanted:
            if not is_debian_package(name):
                raise ScenarioError(f"{name!r} is not a Debian package name.", field="--packages",
                                    hint="Give names such as g++,python3-dev, separated by commas.")
        include = tuple(sorted(set(BASE_PACKAGES) | set(wanted))) if wanted else ()
        with Progress() as progress:
            base = ensure_base(Engine.connect(), image, chosen, progress, include)
        err.print(f"{base.origin}: {base.ref} ({base.image_id[:19]})")
        out.print(base.ref, markup=False)
    _guard(body)


@command()
def doctor(as_json: JsonOpt = False) -> None:
    """Check the engine, arm64 emulation, the GPU runtime, disk space and the CA bundle."""
    def body() -> None:
        from lab.doctor import run_checks
        checks = run_checks(_settings().runs_dir)
        if as_json:
            out.print(json.dumps({"checks": [asdict(c) for c in checks]}), markup=False)
        else:
            marks = {"ok": "[green]ok[/]  ", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
            for c in checks:
                out.print(f"{marks[c.status]} {c.name}: {escape(c.detail)}")
                if c.fix and c.status != "ok":
                    out.print(f"      fix: {escape(c.fix)}")
        if any(c.status == "fail" for c in checks):
            raise typer.Exit(1)
    _guard(body)


@command()
def clean() -> None:
    """Remove every container and image the lab created (and only those)."""
    def body() -> None:
        from lab.engine.docker_engine import Engine
        containers, images = Engine.connect().remove_managed()
        err.print(f"removed {containers} containers and {images} images labelled by the lab")
    _guard(body)


cache_app = typer.Typer(no_args_is_help=True, help="The lab's cache: what it holds, its cap, and pruning it.")
app.add_typer(cache_app, name="cache")


def _cache_engine():
    """The engine, or None (and a warning) when it does not answer: disk parts are still shown."""
    from lab.engine.docker_engine import Engine
    try:
        return Engine.connect()
    except EngineError as e:
        err.print(f"[yellow]warning:[/] images left out: {escape(str(e))}")
        return None


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


@command("info", group=cache_app)
def cache_info(as_json: JsonOpt = False) -> None:
    """Show each part of the cache (images, bases, site trees, uv's wheels, release index), its size, and the cap."""
    def body() -> None:
        from lab.cache_policy.inventory import take_inventory
        from lab.cache_policy.policy import PART_TITLES
        inv = take_inventory(_cache_engine())
        if as_json:
            out.print(json.dumps(inv.as_json()), markup=False)
            return
        table = Table("part", "size", "entries", "in use")
        sizes = inv.part_sizes()
        for part, size in sizes.items():
            entries = [e for e in inv.entries if e.part == part]
            table.add_row(PART_TITLES[part], _gib(size), str(len(entries)), str(sum(bool(e.in_use) for e in entries)))
        out.print(table)
        state = "[red]over the cap[/]" if inv.total > inv.cap else "under the cap"
        out.print(f"total {_gib(inv.total)} of a cap of {_gib(inv.cap)} ({escape(inv.cap_source)}): {state}; "
                  f"{_gib(inv.free)} free at {escape(str(inv.root))}")
        out.print("sizes: files once per inode (hard links counted once); images by what removing each frees, "
                  f"plus {_gib(inv.shared_image_bytes)} of layers they share, counted once", markup=False)
        for note in inv.notes:
            out.print(f"note: {escape(note)}")
    _guard(body)


@command("prune", group=cache_app)
def cache_prune(
    everything: Annotated[bool, typer.Option("--all", help="Remove everything of the lab's that is not in "
                                             "use, not only what exceeds the cap.")] = False,
    older_than: Annotated[str | None, typer.Option("--older-than", help="Remove what was not used for this "
                                                   "long (such as 7d, 12h, 90m).", show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Free space, least recently used first (never what is in use or what the lab did not make)."""
    def body() -> None:
        from lab.cache_policy.inventory import prune
        from lab.cache_policy.policy import parse_duration
        age = parse_duration(older_than) if older_than is not None else None
        engine = _cache_engine()
        with Progress() as progress:
            pruned = prune(engine, everything=everything, older_than=age, events=progress)
        for e in pruned.removed:
            err.print(f"removed {e.part} {escape(e.name)} ({_gib(e.size)})")
        for note in pruned.notes:
            err.print(f"note: {escape(note)}")
        left = pruned.before.total - pruned.freed
        err.print(f"freed {_gib(pruned.freed)}; the cache holds about {_gib(left)} of a cap of "
                  f"{_gib(pruned.before.cap)}")
        if as_json:
            out.print(json.dumps({"removed": [{"part": e.part, "name": e.name, "bytes": e.size}
                                              for e in pruned.removed],
                                  "freed_bytes": pruned.freed, "total_bytes": left,
                                  "cap_bytes": pruned.before.cap, "notes": list(pruned.notes)}), markup=False)
    _guard(body)


@command("schema")
def schema_cmd(
    name: Annotated[str | None, typer.Argument(help="run, evidence, bisect, matrix, ablation or bundle-manifest "
                                               "(default: all of them).", show_default=False)] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write <name>.schema.json files into this "
                                                 "folder instead of printing.")] = None,
) -> None:
    """Print (or write) the JSON Schemas of result.json, the --json outputs and the bundle manifest."""
    def body() -> None:
        from lab.schemas import json_schema, names, render, write_schemas
        if out_dir is not None:
            for path in write_schemas(out_dir, [name] if name else None):
                out.print(str(path), markup=False)
        elif name:
            sys.stdout.write(render(name))
        else:
            sys.stdout.write(json.dumps({n: json_schema(n) for n in names()}, indent=2) + "\n")
    _guard(body)


@command("config")
def config_cmd(as_json: JsonOpt = False) -> None:
    """Print the effective settings and where each came from (environment, project file, user file, default)."""
    def body() -> None:
        settings = _settings()
        rows = settings.describe()
        dirs = [{"origin": d.origin, "path": str(d.path)} for d in settings.scenario_dirs()]
        files = {"user": str(settings.user_file), "user_exists": settings.user_file.is_file(),
                 "project": str(settings.project_file) if settings.project_file else None}
        if as_json:
            out.print(json.dumps({"settings": rows, "files": files, "scenario_dirs": dirs}), markup=False)
            return
        table = Table("key", "value", "from", "variable")
        for r in rows:
            table.add_row(r["key"], escape(r["display"]), escape(r["source"]), r["env"])
        out.print(table)
        out.print(f"user file:    {settings.user_file}" + ("" if files["user_exists"] else " (absent)"), markup=False)
        out.print(f"project file: {settings.project_file or '(none: no lab.toml from here up)'}", markup=False)
        for d in dirs:
            out.print(f"scenarios ({d['origin']}): {d['path']}", markup=False)
        for r in rows:
            if not r["used"]:
                out.print(f"note: {r['key']} is accepted and validated, for {r['later']}", markup=False)
    _guard(body)


from lab import cli_issue as _cli_issue  # noqa: E402,F401,I001  (lab new, lab triage)


def main() -> None:  # pragma: no cover
    try:
        app(prog_name="lab")
    except EngineError as e:
        _fail(e, codes.INFRASTRUCTURE)

