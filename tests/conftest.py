"""Shared fixtures. Docker-marked tests use the real engine: they are skipped only when
no engine answers at all, and CI (`.ci/run`) starts one first, so there they always run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
DATA = Path(__file__).resolve().parent / "data"
LAB = [sys.executable, "-m", "lab"]


def engine_answers() -> bool:
    try:
        import docker
        docker.from_env(timeout=10).ping()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CI") or engine_answers():
        return  # in CI a missing engine must fail the docker tests, not skip them
    skip = pytest.mark.skip(reason="no Docker engine answers (run bin/setup-host)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


def run_lab(*args: str, timeout: float = 3000, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `lab` CLI as a user would from a script: without a terminal on stdin (so
    `lab replay` does not ask), whatever terminal pytest itself was started from."""
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def last_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    assert lines, "no stdout"
    return json.loads(lines[-1])


def tiny_scenario(folder: Path, body: str):
    """Load a throwaway scenario: `name`, `torch`, `arch`, `base` and `expect` come from `body`,
    with `script: s.py` (an empty script) added."""
    from lab.scenario import load_scenario
    (folder / "s.py").write_text("")
    path = folder / "tiny.yaml"
    path.write_text(body + "script: s.py\n")
    return load_scenario(path, SCENARIOS)
