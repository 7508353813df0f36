"""Shared fixtures. Docker-marked tests use the real engine: they are skipped only when
no engine answers at all, and CI (`.ci/run`) starts one first, so there they always run."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
DATA = Path(__file__).resolve().parent / "data"
LAB = [sys.executable, "-m", "lab"]


@pytest.fixture(autouse=True)
def _no_cache_eviction(monkeypatch):
    """Runs in tests enforce the cache cap like any run; a cap no test reaches keeps them from evicting
    what others on a shared engine or cache folder use. Tests of eviction set their own cap."""
    monkeypatch.setenv("LAB_CACHE_CAP", "1000TB")


SWEEP_LOCK = Path(tempfile.gettempdir()) / f"torch-repro-lab-tests-{os.getuid()}.lock"
# Below this much free disk where the lab's cache lies, a test of PyPI's x86-64 CUDA build removes what
# it made (frees_its_cuda_build); above it, the build stays for the next such test (one build: 4-7 GB
# of site tree, its wheels in uv's cache) and bin/test's sweep removes it when the suite ends.
SWEEP_BELOW_GIB = 30
_SWEEPS = pytest.StashKey[bool]()


def disk_is_tight(below_gib: float = SWEEP_BELOW_GIB) -> bool:
    """Whether the disk of the lab's cache folder has less than `below_gib` free (as the cache cap
    counts it: lab.cache_policy.inventory)."""
    from lab.cache_policy import inventory
    from lab.core.config import current
    return inventory._free(current().cache_dir) < below_gib * 2**30


@pytest.fixture(autouse=True)
def _sweeps_run_alone(request):
    """bin/test runs real tests in two processes side by side (two lanes of Docker runs, the local
    engine's runs beside the first). A test that sweeps away what was made while it ran
    (`frees_its_cuda_build`: the lab's new images, site trees and venvs, uv's cache)
    would take the other process's too, and a test marked `alone` looks at what is on the engine as a
    whole (every container, every sleeper): either holds this lock exclusively, and every other real
    run holds it shared, so it starts when the other process's current test ends and runs alone.
    Tests that run nothing real take no lock."""
    # markers, not keywords: a parameter id such as `[docker]` is a keyword too, and made a test that
    # only reads the engine classes wait on the other lane's sweep (89 s of the fast lane)
    if not any(request.node.get_closest_marker(mark) for mark in ("docker", "local", "slurm")):
        yield
        return
    from tests.cpu_torch import TORCH
    # a test that asks for the fixture itself makes several builds (a bisection): it always sweeps
    sweeps = "frees_its_cuda_build" in request.fixturenames or (
        "cpu_torch" in request.fixturenames and TORCH.cuda_build and disk_is_tight())
    request.node.stash[_SWEEPS] = sweeps
    alone = sweeps or request.node.get_closest_marker("alone") is not None
    with SWEEP_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


@pytest.fixture
def frees_its_cuda_build(request):
    """For a test whose torch is an x86-64 build from PyPI (a CUDA build: 3 to 6 GB unpacked, then again
    as an image): afterwards, what it made goes, so that the suite's peak disk is about one such build
    rather than the sum of them (CI's disk is shared with other machines, and a full disk failed a run).
    A test that asks for it by name (one that makes several builds) always sweeps; through `cpu_torch`
    (one build, the same 2.13.0 in every such test) only on a tight disk (under SWEEP_BELOW_GIB free
    when the test started): on a roomy one the build stays for the next test that needs it, and
    bin/test's sweep removes it when the suite ends.

    Removed: the lab's images made during the test (not the Debian bases), the site trees and venvs
    made during the test, uv's cached CUDA libraries (nvidia-*, triton) and torch wheels (a site tree
    made before keeps its hard links; a later install of an arm64 release downloads about 100 MB
    again), and then whatever in uv's cache no install refers to any more (`uv cache prune`)."""
    if not request.node.stash.get(_SWEEPS, False):
        yield
        return
    from lab.core.config import current

    cache = current().cache_dir
    dirs = ("site", "venv")

    def folder_entries():
        return {p for d in dirs for p in (cache / d).glob("*")} if cache.is_dir() else set()

    def managed_images():
        try:
            import docker
            client = docker.from_env(timeout=60)
            return client, {i.id: i for i in client.images.list(filters={"label": "org.torch-repro-lab.managed=true"})}
        except Exception:
            return None, {}

    entries_before = folder_entries()
    _, images_before = managed_images()
    yield
    client, images_after = managed_images()
    for image_id, image in images_after.items():
        if image_id in images_before or any(t.startswith("torch-repro-lab/debian") for t in image.tags):
            continue
        with contextlib.suppress(Exception):     # in use by a container another test keeps, or gone
            client.images.remove(image_id, force=True)
    for path in folder_entries() - entries_before:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.suffix == ".json":
            path.unlink(missing_ok=True)
    uv_cache = cache / "uv"
    if uv_cache.is_dir():
        from lab.image.crossinstall import uv_binary
        uv = uv_binary()
        cuda = sorted({p.name for p in uv_cache.glob("wheels-*/pypi/*")
                       if p.name.startswith(("nvidia-", "triton")) or p.name == "torch"})
        if cuda:
            subprocess.run([uv, "cache", "clean", "--cache-dir", str(uv_cache), *cuda],
                           capture_output=True, timeout=600)
        subprocess.run([uv, "cache", "prune", "--cache-dir", str(uv_cache)], capture_output=True, timeout=600)


def require_cpu_torch(torch, environ=os.environ):
    """`torch` (tests/cpu_torch.py) when one was found; else a skip, or in CI (CI set) a failure,
    saying what was looked for."""
    if torch.missing:
        if environ.get("CI"):
            pytest.fail(f"{torch.missing} (in CI this test must run: give the machine one)")
        pytest.skip(torch.missing)
    return torch


@pytest.fixture
def cpu_torch(request):
    """The amd64 CPU torch this machine offers (tests/cpu_torch.py). Where it offers none, PyPI's
    CUDA build is the last resort, and then `frees_its_cuda_build` removes what the test made when the
    disk is tight."""
    from tests.cpu_torch import TORCH
    torch = require_cpu_torch(TORCH)
    if torch.cuda_build:
        request.getfixturevalue("frees_its_cuda_build")
    return torch


def pytest_configure(config):
    """The settings the lab needs to find the CPU torch (an extra index, a find-links folder),
    for the lab's processes and in-process calls alike; none where the host's pip settings name it."""
    from tests.cpu_torch import TORCH
    os.environ.update(TORCH.env)


def engine_answers() -> bool:
    try:
        import docker
        docker.from_env(timeout=10).ping()
        return True
    except Exception:
        return False


def slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:  # bin/test keeps them out of the local runs it starts beside the Docker runs
        if "frees_its_cuda_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sweeps)
    # The tests that run alone go first. bin/test starts the Docker runs beside the fast tests, which
    # take no lock (8 to 12 min), so a test that runs alone then waits for no one and holds up no one;
    # in its place in the file order, the local engine's bisection waited 74 s for the other lane's
    # test to end, and then held that lane 122 s.
    alone = [item for item in items if item.get_closest_marker("sweeps") or item.get_closest_marker("alone")]
    if alone:
        first = {id(item) for item in alone}
        items[:] = alone + [item for item in items if id(item) not in first]
    if os.environ.get("CI"):
        return  # in CI a missing engine or browser must fail their tests, not skip them
    if any("docker" in item.keywords for item in items) and not engine_answers():
        skip = pytest.mark.skip(reason="no Docker engine answers (run bin/setup-host)")
        for item in items:
            if "docker" in item.keywords:
                item.add_marker(skip)
    if any("slurm" in item.keywords for item in items) and not slurm_answers():
        skip = pytest.mark.skip(reason="no Slurm answers (run bin/setup-slurm as root)")
        for item in items:
            if "slurm" in item.keywords:
                item.add_marker(skip)
    from tests.browser import find_chromium
    if find_chromium() is None:
        skip = pytest.mark.skip(reason="no chromium (run bin/setup-host)")
        for item in items:
            if "browser" in item.keywords:
                item.add_marker(skip)


def run_lab(*args: str, timeout: float = 3000, env: dict | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the real `lab` CLI as a user would from a script (from the repository's root unless
    `cwd`): without a terminal on stdin (so `lab replay` does not ask), whatever terminal pytest
    itself was started from."""
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


class SharedRuns:
    """`lab run` of a scenario that several tests assert on (test_e2e's checks of the run itself,
    test_e2e_bundle's round trip of its folder): made once per session, in one folder, rather than
    once per test (an emulated arm64 run costs a minute or more)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._made: dict[tuple[str, ...], dict] = {}

    def run(self, *args: str) -> dict:
        """The `--json` answer of `lab run ARGS --out <the session's folder>`, run now if this session has not."""
        if args not in self._made:
            proc = run_lab("run", *args, "--out", str(self.folder), "--json")
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._made[args] = last_json(proc.stdout)
        return self._made[args]


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("shared-runs"))


def last_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    assert lines, "no stdout"
    return json.loads(lines[-1])


def tiny_scenario(folder: Path, body: str):
    """Load a throwaway scenario: `name`, `torch`, `arch`, `base` and `expect` come from `body`,
    with `script: s.py` (an empty script) added."""
    from lab.scenario.lookup import load_scenario
    (folder / "s.py").write_text("")
    path = folder / "tiny.yaml"
    path.write_text(body + "script: s.py\n")
    return load_scenario(path, SCENARIOS)


def fake_result(case, verdict, run_dir, *, reason: str = "", summary=(), image=None, **fields):
    """A RunResult as lab.pipeline.run_case returns it, for the unit tests' fake runners."""
    from lab.core.results import EngineRef, RunEvidence, RunResult, Verdict
    values = dict(scenario=case.scenario.name, case=case.name, torch=case.torch, arch=case.arch.value,
                  backend=case.backend, mode=case.mode, emulated=case.arch.value != "amd64",
                  verdict=Verdict(verdict), reason=reason or f"{verdict} at {case.torch}", summary=tuple(summary),
                  run_dir=str(run_dir), evidence=RunEvidence(), graph_breaks=None,
                  exit_code=1 if verdict == "reproduced" else 0, duration_s=1.5, killed=None,
                  limits="memory 8 GiB, pids 4096, all cpus, no network", checks=(), image=image, base=None,
                  engine=EngineRef(version="20.10.24+dfsg1", host_arch="x86_64"), lab_version="0.1.0",
                  started="2026-11-22T12:00:00+00:00")
    return RunResult(**{**values, **fields})
