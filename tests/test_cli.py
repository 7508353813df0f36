"""The CLI as a user meets it: exit codes, one-paragraph errors, no tracebacks, --json shapes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from .conftest import ROOT, last_json, run_lab


def assert_one_paragraph_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    text = proc.stderr.strip()
    assert text.startswith("error:")
    assert "\n\n" not in text
    flat = " ".join(text.split())
    for needle in needles:
        assert needle in flat, (needle, flat)


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "s.py").write_text("print('hi')\n")
    path = tmp_path / "broken.yaml"
    path.write_text(body)
    return path


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, 'name: x\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\nscript: s.py\n'
                           'expect: {exit_code: 0\n')
    assert_one_paragraph_error(run_lab("render", str(path)), "broken.yaml", "line 6")


def test_wrong_field_names_file_line_and_field(tmp_path):
    path = write(tmp_path, 'name: x\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\nscript: s.py\n'
                           'timeout: soon\nexpect: {exit_code: 0}\n')
    assert_one_paragraph_error(run_lab("run", str(path)), "broken.yaml", "line 6", "timeout")


def test_unknown_key_suggests_the_right_one(tmp_path):
    path = write(tmp_path, 'name: x\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\nscript: s.py\n'
                           'expect: {exit_code: 0}\nsystem_package: [g++]\n')
    assert_one_paragraph_error(run_lab("show", str(path)), "line 7", "system_package", "system_packages")


def test_unknown_scenario_lists_the_known_ones():
    assert_one_paragraph_error(run_lab("render", "libgomp-aarch46"), "libgomp-aarch64")


@pytest.mark.parametrize("args, needle", [
    (["--arch", "sparc"], "--arch"),
    (["--set", "NOPE=1"], "NOPE"),
    (["--set", "N"], "NAME=VALUE"),
])
def test_bad_options_are_clear(args, needle):
    assert_one_paragraph_error(run_lab("run", "libgomp-aarch64", *args), needle)


def test_render_prints_identical_bytes():
    a, b = run_lab("render", "libgomp-aarch64"), run_lab("render", "libgomp-aarch64")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("# torch-repro-lab")


def test_list_json():
    proc = run_lab("list", "--json")
    assert proc.returncode == 0
    names = {s["name"] for s in last_json(proc.stdout)["scenarios"]}
    assert {"libgomp-aarch64", "dlpack-cpu", "dlpack-cuda", "libgomp-amd64"} <= names


def test_show_prints_the_resolved_scenario():
    proc = run_lab("show", "libgomp-aarch64")
    assert proc.returncode == 0
    assert "duplicate_runtime: libgomp" in proc.stdout and "N: '512'" in proc.stdout


def test_engine_unreachable_is_a_clear_message(tmp_path):
    proc = run_lab("run", "libgomp-aarch64", env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"})
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "Docker engine does not answer" in proc.stderr and "lab doctor" in proc.stderr


def test_doctor_json_reports_each_check():
    proc = run_lab("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout.strip().splitlines()[-1])["checks"]}
    assert {"Docker engine", "arm64 emulation", "GPU runtime", "disk space", "CA bundle"} <= set(checks)
    for c in checks.values():
        assert c["status"] in ("ok", "warn", "fail")
        if c["status"] == "fail":
            assert c["fix"]


def test_only_the_cli_prints():
    """Everything else reports through return values, exceptions and the `events` callback.
    lab/probe/ is the runner baked into images: a program of its own, with its own stderr."""
    offenders = []
    for path in sorted((ROOT / "lab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "lab/cli.py" or rel.startswith("lab/probe/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                text = ast.unparse(node.func)
                if text in ("print", "pprint", "sys.stdout.write", "sys.stderr.write") or text.endswith("Console"):
                    offenders.append(f"{rel}:{node.lineno}: {text}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rich"):
                offenders.append(f"{rel}:{node.lineno}: from {node.module} import")
    assert offenders == []
