"""A real page, through `lab new --from-issue` and `lab run` with no edit, on the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "issues"
pytestmark = pytest.mark.docker


def lab(*args):
    return subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=3600)


def test_page_147282_reproduces_with_no_edit(tmp_path, frees_its_cuda_build):
    made = lab("new", "--from-issue", str(CORPUS / "147282.md"), "-o", str(tmp_path / "sc"), "--json")
    assert made.returncode == 0, made.stderr
    yaml_path = json.loads(made.stdout.strip().splitlines()[-1])["yaml"]
    ran = lab("run", yaml_path, "--out", str(tmp_path / "runs"), "--json", "--no-diagnose")
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["torch"] == "2.5.1" and result["verdict"] == "reproduced", result
