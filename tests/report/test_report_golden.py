"""report.md and bisect.md, byte for byte, for realistic records (golden files in tests/data/reports/).

The records are built from real captured logs (tests/data/ld_debug, tracebacks, dynamo, run-folders)
through the real analyze and judge stages. The lab's version is masked, so a release does not break
them. After an intended change of the layout, regenerate with LAB_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from lab import __version__
from lab.analyze.dynamo import load_diagnostics
from lab.analyze.evidence import analyze, read_text
from lab.analyze.judge import build_failed, judge
from lab.core.records import (
    STOPPED_EMULATOR,
    BaseImage,
    BuiltImage,
    OutputCopy,
    RawRun,
    RunLimits,
    Skipped,
    StreamCapture,
)
from lab.drivers.bisect import bisect
from lab.drivers.bisect_report import write_bisect_report
from lab.image.resolve import resolve
from lab.report.run_folder import RunRecord, render_report
from lab.scenario.lookup import load_scenario
from tests.conftest import DATA, SCENARIOS
from tests.drivers.test_bisect_report import RESUME, VERSIONS, fake, regression

GOLDEN = DATA / "reports"
STARTED = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
RUN_FOLDER = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"
DYNAMO = DATA / "dynamo" / "torch2.13.0-x86_64"
BOOTSTRAPPED = BaseImage(requested="debian:bookworm", ref="torch-repro-lab/debian:bookworm-arm64",
                         image_id="sha256:4f1c2e9a7b3d5c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6",
                         origin="bootstrapped", recipe="mmdebstrap --variant=minbase --arch=arm64 bookworm")
LOCAL = BaseImage(requested="debian:bookworm", ref="debian:bookworm",
                  image_id="sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5", origin="local")


def _check(name: str, text: str) -> None:
    text = text.replace(f"torch-repro-lab: {__version__}\n", "torch-repro-lab: <version>\n")
    path = GOLDEN / name
    if os.environ.get("LAB_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    assert text.encode("utf-8") == path.read_bytes(), f"{name} differs from its golden file"


def _image(base: BaseImage) -> BuiltImage:
    return BuiltImage(tag="torch-repro-lab/case:3f9a1c2b7d4e", image_id="sha256:9f8e7d6c5b4a", base=base,
                      cached=False, build_seconds=41.0)


def _run(run: Path, case, *, stderr: Path | str = "", stdout: str = "", ld: Path | None = None,
         diag: Path | None = None, trace: bool = True, collect_env: str | None = None,
         base: BaseImage | None = LOCAL, emulated: bool = False, files: tuple[str, ...] = ("Dockerfile",),
         **raw) -> RunRecord:
    """Lay out a run folder as the pipeline leaves it, then analyze and judge it for real."""
    run.mkdir()
    for name in files:
        shutil.copy(RUN_FOLDER / name, run / name)
    stderr_text = stderr.read_text() if isinstance(stderr, Path) else stderr
    (run / "stderr.txt").write_text(stderr_text)
    (run / "stdout.txt").write_text(stdout)
    values = dict(exit_code=0, timed_out=False, oom_killed=False, duration_s=12.34, stdout_path=run / "stdout.txt",
                  stderr_path=run / "stderr.txt", loader_dir=ld or run / "none", emulated=emulated,
                  command=("python", "/lab/repro/s.py"), env=(), limits=RunLimits())
    ev = analyze(RawRun(**{**values, **raw}))
    diagnostics = None
    if diag is not None:
        shutil.copytree(diag, run / "diagnose", ignore=None if trace else shutil.ignore_patterns("trace"))
        (run / "diagnose" / "trace").mkdir(exist_ok=True)
        diagnostics = load_diagnostics(run / "diagnose", run / "diagnose" / "trace",
                                       read_text(run / "diagnose" / "stderr.txt"))
    j = judge(ev, case.scenario.expect, stdout, stderr_text, diagnostics)
    return RunRecord(case=case, run_dir=run, judgement=j, evidence=ev, image=_image(base) if base else None,
                     base=base, engine_version="20.10.24+dfsg1", host_arch="x86_64", emulated=emulated,
                     started=STARTED, collect_env=collect_env, diagnostics=diagnostics)


def _case(name: str, **kw):
    return resolve(load_scenario(name, SCENARIOS), **kw)


def test_reproduced_with_duplicate_runtimes(tmp_path):
    rec = _run(tmp_path / "run", _case("libgomp-aarch64"), stderr=RUN_FOLDER / "stderr.txt",
               stdout=(RUN_FOLDER / "stdout.txt").read_text(), ld=DATA / "ld_debug" / "arm64-torch2.5.1-libgomp",
               collect_env=(RUN_FOLDER / "collect_env.txt").read_text(), base=BOOTSTRAPPED, emulated=True,
               files=("Dockerfile", "pip-freeze.txt", "build.log"), exit_code=1)
    _check("report-duplicate-runtimes.md", render_report(rec))


def test_exception_with_graph_breaks_and_diagnostics(tmp_path):
    stderr = DATA / "tracebacks" / "graph-break-data-dependent-if-torch2.13.stderr"
    rec = _run(tmp_path / "run", _case("graph-break-explain", arch="amd64", torch="2.13.0"), stderr=stderr,
               ld=DATA / "ld_debug" / "host-x86_64-torch2.13-inductor", diag=DYNAMO / "toy", exit_code=1)
    assert rec.diagnostics is not None and rec.diagnostics.trace_files
    _check("report-graph-break.md", render_report(rec))


def test_timeout(tmp_path):
    rec = _run(tmp_path / "run", _case("libgomp-amd64"), stderr="still working\n", timed_out=True, exit_code=None,
               duration_s=900.4)
    _check("report-timeout.md", render_report(rec))


def test_oom_kill_with_an_empty_trace(tmp_path):
    rec = _run(tmp_path / "run", _case("dlpack-cpu", arch="amd64", torch="2.13.0+cpu", backend="inductor",
                                       mode="max-autotune"),
               ld=DATA / "ld_debug" / "host-x86_64-torch2.13-killed", diag=DYNAMO / "mixed", trace=False,
               oom_killed=True, exit_code=137, limits=RunLimits(memory_bytes=256 * 2**20, cpus=2.0))
    assert rec.diagnostics is not None and not rec.diagnostics.trace_files
    _check("report-oom.md", render_report(rec))


def test_failed_build(tmp_path):
    case = _case("libgomp-amd64", sets={"N": "64"})
    run = tmp_path / "run"
    run.mkdir()
    for name in ("Dockerfile", "build.log"):
        shutil.copy(RUN_FOLDER / name, run / name)
    rec = RunRecord(case=case, run_dir=run, judgement=build_failed("pip install exited 1"), evidence=None,
                    image=None, base=LOCAL, engine_version="20.10.24+dfsg1", host_arch="x86_64", emulated=False,
                    started=STARTED)
    _check("report-build-failed.md", render_report(rec))


def test_capture_cuts_skipped_outputs_and_emulator_crash(tmp_path):
    streams = (StreamCapture(name="stdout", total_bytes=50 * 2**20, kept_bytes=2**20, cap=2**20),
               StreamCapture(name="stderr", total_bytes=100, kept_bytes=100, cap=2**20))
    outputs = OutputCopy(folder="out", files=3, bytes=4096,
                         skipped=(Skipped("link", "symbolic link", "to '/root/.ssh/authorized_keys'"),
                                  Skipped("fifo", "fifo"), Skipped("dev", "device file")),
                         stopped="the file cap (3 files) was reached")
    stderr = "qemu: uncaught target signal 11 (Segmentation fault) - core dumped\n" + "".join(
        f"line {n}\n" for n in range(250))
    rec = _run(tmp_path / "run", _case("libgomp-aarch64"), stderr=stderr, stdout="x" * 100 + "```\n",
               emulated=True, base=BOOTSTRAPPED, exit_code=137, stopped_for=STOPPED_EMULATOR, streams=streams,
               outputs=outputs, collect_env="Python version: 3.11.2\nOS: Could not collect\n")
    _check("report-capture-cuts.md", render_report(rec))


def test_bisect_found_with_skips(tmp_path):
    out = tmp_path / "bisect-run"
    result = bisect(VERSIONS, fake(regression("2.9.0", errors=("2.13.0", "2.14.0", "2.15.0")), out / "runs",
                                       timed=True))
    _check("bisect-skips.md", write_bisect_report(out, "libgomp-aarch64", "arm64", result, VERSIONS,
                                                  RESUME).read_text())


def test_bisect_ambiguous_without_resume(tmp_path):
    out = tmp_path / "bisect-run"
    verdicts = regression("2.9.0", errors=("2.8.0",))
    result = bisect(VERSIONS, fake(verdicts))
    assert result.status == "ambiguous"
    _check("bisect-ambiguous.md", write_bisect_report(out, "libgomp-aarch64 <x|y>", "arm64", result,
                                                      VERSIONS).read_text())

