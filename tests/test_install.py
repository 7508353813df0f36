"""The lab installed as a tool: a wheel built from this checkout, installed into a fresh venv
(and with `uv tool install`), used from a folder outside the repository.

The wheel is built with `uv build` (an sdist first, then the wheel from the sdist, so both
must carry the templates, the shipped scenarios and the runner). Dependencies come from the
package index through uv's cache, so after the first time this takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_json, run_lab
from tests.cpu_torch import TORCH

UV = Path(sys.executable).parent / "uv"
pytestmark = pytest.mark.timeout(900)


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The host's environment (its CA bundle, find-links, DOCKER_HOST) without the lab's own
    settings, and with an empty user config folder, so only the installed package speaks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAB_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(XDG_CONFIG_HOME=str(tmp / "xdg-config"), UV_PYTHON_DOWNLOADS="never", **extra)
    return env


def sh(*args, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    proc = sh(UV, "build", "-q", "-o", dist, ROOT, cwd=dist, env=clean_env(dist))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = dist.glob("torch_repro_lab-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its dependencies; returns its `lab`."""
    home = tmp_path_factory.mktemp("venv")
    env = clean_env(home)
    proc = sh(UV, "venv", "-q", "--python", sys.executable, home / "venv", cwd=home, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = sh(UV, "pip", "install", "-q", "--python", home / "venv" / "bin" / "python", wheel, cwd=home, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home / "venv" / "bin" / "lab"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A working folder outside the repository, with no lab.toml or scenarios/ above it."""
    folder = tmp_path / "work"
    folder.mkdir()
    assert not any((p / "lab.toml").exists() or (p / "scenarios").exists() for p in (folder, *folder.parents))
    return folder


def test_the_wheel_carries_templates_scenarios_and_runner_and_no_ca(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"lab/dockerfiles/debian.Dockerfile.j2", "lab/dockerfiles/cuda.Dockerfile.j2",
            "lab/dockerfiles/lab-ca/README", "lab/probe/lab_run.py", "lab/scenarios/libgomp-aarch64.yaml",
            "lab/scenarios/scripts/libgomp_aarch64.py", "lab/report/templates/report.md.j2",
            "lab/report/templates/bisect.md.j2", "lab/report/templates/report.html.j2",
            "lab/report/templates/bisect.html.j2", "lab/report/templates/matrix.html.j2",
            "lab/report/templates/_page.html.j2"} <= names
    shipped = {p.name for p in (ROOT / "scenarios").glob("*.yaml")}
    assert shipped == {n.rsplit("/", 1)[1] for n in names if n.startswith("lab/scenarios/") and n.endswith(".yaml")}
    assert not [n for n in names if n.endswith(".crt")]  # a proxy's CA copied for compose stays home
    # every module of the checkout's package is in the wheel (a new subpackage left out of
    # pyproject's list installs fine and fails only at its first import)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lab").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules - names == set()


def test_installed_wheel_works_from_any_folder(installed, outside):
    env = clean_env(outside)
    version = sh(installed, "--version", cwd=outside, env=env)
    assert version.returncode == 0, version.stderr
    from lab import __version__
    assert version.stdout.strip() == f"torch-repro-lab {__version__}"

    listed = sh(installed, "list", "--json", cwd=outside, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = last_json(listed.stdout)["scenarios"]
    assert {r["name"] for r in rows} == {p.stem for p in (ROOT / "scenarios").glob("*.yaml")}
    site = installed.parent.parent  # the venv: every scenario is the installed copy, none the checkout's
    assert all(r["origin"] == "shipped" and Path(r["file"]).is_relative_to(site) for r in rows), rows

    rendered = sh(installed, "render", "libgomp-aarch64", cwd=outside, env=env)
    assert rendered.returncode == 0, rendered.stderr
    checkout = run_lab("render", "libgomp-aarch64")
    assert checkout.returncode == 0, checkout.stderr
    assert rendered.stdout == checkout.stdout  # byte for byte


_BISECT_MD = """\
import sys
from pathlib import Path
import lab
from lab.drivers.bisect import Probe, bisect
from lab.drivers.bisect_report import render_markdown
result = bisect(["2.8.0", "2.9.0", "2.10.0"],
                lambda v: Probe.judged(v, "not_reproduced" if v == "2.8.0" else "reproduced"))
print(Path(lab.__file__).parent)
sys.stdout.write(render_markdown(Path("."), "s", "amd64", result, ["2.8.0", "2.9.0", "2.10.0"]))
"""


def test_installed_wheel_renders_the_markdown_templates(installed, outside):
    """The Markdown templates are package data: the installed copy renders bisect.md as the checkout does."""
    mine = sh(installed.parent / "python", "-c", _BISECT_MD, cwd=outside, env=clean_env(outside))
    assert mine.returncode == 0, mine.stderr
    where, _, text = mine.stdout.partition("\n")
    assert Path(where).is_relative_to(installed.parent.parent)  # the installed package, not the checkout
    checkout = subprocess.run([sys.executable, "-c", _BISECT_MD], cwd=ROOT, capture_output=True, text=True)
    assert checkout.returncode == 0, checkout.stderr
    assert text.startswith("# Bisect: s (amd64), 2.8.0 to 2.10.0\n")
    assert text == checkout.stdout.partition("\n")[2]  # byte for byte


def test_installed_wheel_writes_report_html(installed, outside):
    """The HTML templates are package data too: the installed `lab report` draws a real run's page."""
    import shutil
    run_dir = outside / "20261122T120958Z-torch2.5.1-arm64"
    shutil.copytree(ROOT / "tests/data/run-folders" / run_dir.name, run_dir)
    done = sh(installed, "report", str(run_dir), cwd=outside, env=clean_env(outside))
    assert done.returncode == 0, done.stderr
    page = (run_dir / "report.html").read_text()
    assert '<span class="verdict v-reproduced">reproduced</span>' in page and "Loader graph" in page


def test_a_project_folder_comes_before_the_shipped_scenarios(installed, outside):
    project = outside / "proj"
    (project / "scenarios").mkdir(parents=True)
    (project / "lab.toml").write_text('runs_dir = "lab-runs"\n')
    (project / "scenarios" / "repro.py").write_text("print('hi')\n")
    own = ('name: libgomp-amd64\ntitle: mine\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
           'script: repro.py\nexpect: {exit_code: 0}\n')
    (project / "scenarios" / "libgomp-amd64.yaml").write_text(own)
    (project / "sub").mkdir()
    env = clean_env(outside)
    listed = sh(installed, "list", "--json", cwd=project / "sub", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in last_json(listed.stdout)["scenarios"] if r["name"] == "libgomp-amd64"]
    assert [(r["origin"], r["shadowed"], r["title"]) for r in rows] == [
        ("project", False, "mine"), ("shipped", True, rows[1]["title"])]
    shown = sh(installed, "show", "libgomp-amd64", cwd=project / "sub", env=env)
    assert "title: mine" in shown.stdout
    config = last_json(sh(installed, "config", "--json", cwd=project / "sub", env=env).stdout)
    runs = next(r for r in config["settings"] if r["key"] == "runs_dir")
    assert runs["value"] == str(project / "lab-runs") and runs["source"] == f"project file {project / 'lab.toml'}"


def test_uv_tool_install_gives_a_working_lab(wheel, tmp_path, outside):
    env = clean_env(tmp_path, UV_TOOL_DIR=str(tmp_path / "tools"), UV_TOOL_BIN_DIR=str(tmp_path / "bin"))
    proc = sh(UV, "tool", "install", "-q", "--python", sys.executable, wheel, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lab = tmp_path / "bin" / "lab"
    assert sh(lab, "--version", cwd=outside, env=env).stdout.strip().startswith("torch-repro-lab ")
    rendered = sh(lab, "render", "libgomp-aarch64", cwd=outside, env=env)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout == run_lab("render", "libgomp-aarch64").stdout


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_installed_wheel_runs_a_case_from_a_temporary_folder(installed, outside):
    """libgomp-amd64 (the amd64 CPU torch of tests/cpu_torch.py) through the installed wheel, with
    the runs folder from a lab.toml there, and --check: not reproduced exits 0."""
    (outside / "lab.toml").write_text('runs_dir = "from-lab-toml"\n')
    proc = sh(installed, "run", "libgomp-amd64", *TORCH.args, "--no-diagnose", "--json", "--check", "-v", cwd=outside,
              env=clean_env(outside), timeout=1700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "not_reproduced", result
    run_dir = Path(result["run_dir"])
    assert run_dir.resolve().is_relative_to((outside / "from-lab-toml").resolve())
    assert (run_dir / "report.md").is_file()
    assert "verdict: not_reproduced" in proc.stderr and "run " in proc.stderr  # progress on stderr
    assert json.loads((run_dir / "result.json").read_text())["verdict"] == "not_reproduced"
