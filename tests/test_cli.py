"""The CLI as a user meets it: exit codes, one-paragraph errors, no tracebacks, --json shapes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_json, run_lab
from tests.cpu_torch import TORCH


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
    lab/probe/ is the runner baked into images, and lab/image/cacerts.py, nativeunpack.py,
    nativepython.py and nativeperl.py mmdebstrap's hooks: each a program of its own, whose output
    goes to its own log."""
    offenders = []
    for path in sorted((ROOT / "lab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        hooks = ("lab/image/cacerts.py", "lab/image/nativeunpack.py", "lab/image/nativepython.py",
                 "lab/image/nativeperl.py")
        if rel in hooks or rel.startswith(("lab/cli/", "lab/probe/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                text = ast.unparse(node.func)
                if text in ("print", "pprint", "sys.stdout.write", "sys.stderr.write") or text.endswith("Console"):
                    offenders.append(f"{rel}:{node.lineno}: {text}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rich"):
                offenders.append(f"{rel}:{node.lineno}: from {node.module} import")
    assert offenders == []
# ----------------------------------------------------------------------------- conventions

def test_version_prints_the_package_version():
    from lab import __version__
    proc = run_lab("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"torch-repro-lab {__version__}"


@pytest.mark.parametrize("command", ["list", "show", "render", "build", "run", "bisect", "bundle", "replay",
                                     "build-base", "doctor", "clean", "config"])
def test_every_command_takes_verbose_quiet_and_debug(command):
    text = " ".join(run_lab(command, "--help", env={"COLUMNS": "200"}).stdout.split())
    for option in ("--verbose", "-v", "--quiet", "-q", "--debug"):
        assert option in text, (command, option)


def test_flags_work_before_and_after_the_command():
    assert run_lab("-q", "render", "libgomp-amd64").returncode == 0
    assert run_lab("render", "libgomp-amd64", "-v", "--debug").returncode == 0


def test_shell_completion_is_offered():
    assert "--install-completion" in run_lab("--help", env={"COLUMNS": "200"}).stdout
    # typer names the shell from the parent process (shellingham); under `just` that is sh,
    # which it does not support, so the test names bash itself, as `--show-completion bash` does
    # where detection is off.
    proc = run_lab("--show-completion", "bash",
                   env={"SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert proc.returncode == 0 and "_LAB_COMPLETE" in proc.stdout.upper()
    # and the completion itself answers: `lab ru<TAB>` offers run
    proc = run_lab(env={"_LAB_COMPLETE": "complete_bash", "COMP_WORDS": "lab ru", "COMP_CWORD": "1"})
    assert proc.returncode == 0 and "run" in proc.stdout.split(), proc


def test_an_unexpected_error_is_one_paragraph_and_a_traceback_only_with_debug(monkeypatch):
    from typer.testing import CliRunner

    from lab import cli
    from lab.cli import inputs, output

    def boom(ref):
        raise RuntimeError("boom")

    monkeypatch.setattr(inputs, "load", boom)
    monkeypatch.setattr(output, "OUTPUT", output.Output())
    plain = CliRunner().invoke(cli.app, ["show", "x"])
    assert plain.exit_code == 1
    assert "unexpected RuntimeError: boom" in plain.output and "--debug" in plain.output
    assert "Traceback" not in plain.output
    monkeypatch.setattr(output, "OUTPUT", output.Output())
    checked = CliRunner().invoke(cli.app, ["run", "x", "--check"])
    assert checked.exit_code == 128  # git bisect run stops: this would happen on every commit
    monkeypatch.setattr(output, "OUTPUT", output.Output())
    debug = CliRunner().invoke(cli.app, ["show", "x", "--debug"])
    assert debug.exit_code == 1 and "Traceback" in debug.output and "boom" in debug.output


def test_check_bad_input_stops_git_bisect_run():
    proc = run_lab("run", "libgomp-aarch46", "--check")
    assert proc.returncode == 128 and "libgomp-aarch64" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_lab("run", "libgomp-amd64", "--check", "--repeat", "2")
    assert proc.returncode == 128 and "--check judges one run" in " ".join(proc.stderr.split())


@pytest.mark.usefixtures("cpu_torch")  # the release is checked before the engine is asked
def test_check_engine_down_is_a_skip(tmp_path):
    proc = run_lab("run", "libgomp-amd64", *TORCH.args, "--check",
                   env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"})
    assert proc.returncode == 125 and "Docker engine does not answer" in proc.stderr
    plain = run_lab("run", "libgomp-amd64", *TORCH.args, env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"})
    assert plain.returncode == 3


E2E = Path(__file__).parent / "data" / "e2e"


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_check_through_real_runs_reproduced_1_timeout_125(tmp_path):
    """Two cheap amd64 cases that share every layer but the script with libgomp-amd64."""
    (tmp_path / "hello.py").write_text("print('hello from the repro')\n")
    body = (E2E / "sleeper.yaml").read_text().replace("name: sleeper", "name: hello").replace(
        "script: sleeper.py", "script: hello.py").replace("expect:\n  exit_code: 0",
                                                          'expect:\n  stdout_contains: "hello from the repro"')
    (tmp_path / "hello.yaml").write_text(body)
    runs = tmp_path / "runs"
    hello = run_lab("run", str(tmp_path / "hello.yaml"), *TORCH.args, "--no-diagnose", "--check", "--json", "-q",
                    "--out", str(runs))
    assert hello.returncode == 1, hello.stderr[-3000:]
    assert last_json(hello.stdout)["verdict"] == "reproduced"
    assert "build Step" not in hello.stderr and "verdict: reproduced" in hello.stderr  # -q: no progress
    sleeper = run_lab("run", str(E2E / "sleeper.yaml"), *TORCH.args, "--no-diagnose", "--check", "--json",
                      "--out", str(runs))
    assert sleeper.returncode == 125, sleeper.stderr[-3000:]
    assert last_json(sleeper.stdout)["verdict"] == "timeout"
    plain = run_lab("run", str(E2E / "sleeper.yaml"), *TORCH.args, "--no-diagnose", "--json", "--out", str(runs))
    assert plain.returncode == 0 and last_json(plain.stdout)["verdict"] == "timeout"


def test_cache_info_json_lists_every_part_and_the_cap(tmp_path):
    cache = tmp_path / "cache"
    (cache / "index").mkdir(parents=True)
    (cache / "index" / "torch.json").write_bytes(b"x" * 10000)
    proc = run_lab("cache", "info", "--json", env={"LAB_CACHE_DIR": str(cache), "LAB_CACHE_CAP": "2GiB"})
    assert proc.returncode == 0, proc.stderr
    data = last_json(proc.stdout)
    parts = {p["part"]: p for p in data["parts"]}
    assert set(parts) >= {"images", "base_images", "anchors", "site", "uv", "index", "collect_env", "bases", "other"}
    assert parts["index"]["bytes"] >= 10000 and data["cap_bytes"] == 2 * 1024**3
    assert data["cache_dir"] == str(cache) and "cache_cap" in data["cap_source"]


@pytest.mark.parametrize("args, env, needle", [
    (["cache", "prune", "--older-than", "7 parsecs"], {}, "--older-than"),
    (["cache", "info"], {"LAB_CACHE_CAP": "a lot"}, "cache_cap"),
])
def test_cache_bad_input_is_one_paragraph_and_exit_2(tmp_path, args, env, needle):
    proc = run_lab(*args, env={"LAB_CACHE_DIR": str(tmp_path / "cache"), **env})
    assert_one_paragraph_error(proc, needle)


def test_progress_lines_are_cut_visibly_and_the_diagnose_hint_is_whole(caplog):
    """A progress line longer than the screen's share ends in " …" rather than mid-word, and the
    diagnose step's "how to get it" (DIAGNOSE_HOW) reaches the user whole."""
    import logging

    from lab.cli.output import Progress
    from lab.pipeline import DIAGNOSE_HOW
    progress = Progress.__new__(Progress)
    progress._status = None
    hint = ("not run: skipped by default (no Dynamo or Inductor exception, no graph-break expectation); "
            + DIAGNOSE_HOW)
    with caplog.at_level(logging.INFO):
        progress("diagnose", hint)
        progress("build", "Step 18/21 : LABEL " + "org.torch-repro-lab.x=1 " * 20)
    shown = [r.getMessage() for r in caplog.records]
    assert shown[0].endswith("TORCH_TRACE"), shown[0]
    assert shown[1].endswith(" …") and len(shown[1]) < 200, shown[1]


def test_without_a_terminal_a_long_path_stays_on_one_line(tmp_path, caplog):
    """In a log file or a CI log, rich would break lines at 80 columns, in the middle of a path."""
    path = tmp_path / ("a" * 70) / ("b" * 70) / "scenario.yaml"
    proc = run_lab("run", str(path))
    assert_one_paragraph_error(proc, "scenario file does not exist")
    assert len(proc.stderr.strip().splitlines()) == 1 and str(path) in proc.stderr, proc.stderr
    # a build step's lines (docker prints a RUN's continuation lines as they are) come joined
    import logging

    from lab.cli.output import Progress
    progress = Progress.__new__(Progress)
    progress._status = None
    with caplog.at_level(logging.INFO):
        progress("build", "Step 5/12 : ENV LANG=C.UTF-8 \n    PYTHONUNBUFFERED=1")
    assert [r.getMessage() for r in caplog.records] == \
        ["[dim]build[/] Step 5/12 : ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1"]


def test_a_full_disk_is_one_paragraph_with_what_to_free_not_a_bug_report(capsys):
    import errno

    import typer

    from lab.cli.guard import guard
    from lab.core import exitcodes

    def fill():
        raise OSError(errno.ENOSPC, "No space left on device", "/root/.cache/torch-repro-lab/site/x")

    with pytest.raises(typer.Exit) as exit_info:
        guard(fill)
    assert exit_info.value.exit_code == exitcodes.INFRASTRUCTURE
    said = " ".join(capsys.readouterr().err.split())
    assert said.count("error:") == 1 and "bug in the lab" not in said
    assert "the disk is full writing /root/.cache/torch-repro-lab/site/x (No space left on device)" in said
    assert "lab cache prune" in said

    def other():
        raise OSError(errno.EACCES, "Permission denied", "/x")

    with pytest.raises(typer.Exit) as exit_info:
        guard(other)
    assert exit_info.value.exit_code == exitcodes.INTERNAL
    assert "This is a bug in the lab" in " ".join(capsys.readouterr().err.split())
