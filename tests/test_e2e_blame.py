"""Blame at a real bisection's boundary, arm64 under QEMU, through the `lab` CLI and the real engine.

- A dependency to blame: `torch.from_numpy` fails on torch 2.2.2 with today's NumPy 2 ("Numpy is
  not available": 2.2.2 was built for NumPy 1.x) and passes on 2.3.0. The bisection finds
  (2.2.2, 2.3.0); the blame step rebuilds 2.2.2 with its era's dependencies (NumPy 1.26.4), sees
  it pass, and narrows the differing packages down to numpy.
- Torch alone: a script that calls `torch.library.custom_op` (new in 2.4) fails on 2.3.1 and
  passes on 2.4.0 whatever the packages around it: the blame says torch (the vmap bisection in
  test_e2e_bisect uses the same releases, so the base and wheels are shared).

Each bisection is over two adjacent releases only (`--from/--to`), so the runs stay few. Both
scenarios name the system packages every other arm64 scenario of the suite names, so they share its
Debian base (a bootstrap under QEMU costs 2 to 3 minutes) rather than bootstrapping one of their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_json, run_lab

pytestmark = [pytest.mark.docker, pytest.mark.arm64, pytest.mark.timeout(3600),
              pytest.mark.beside]  # bin/test's second lane of Docker runs

# torch's other dependencies pinned to their versions in 2.2.2's era (as of 2024-04-03), so that
# today's set and the era's differ in three packages (filelock, fsspec, numpy) rather than eight:
# delta debugging still has to pick numpy out of several, in 2 runs instead of 5.
NUMPY = """name: blame-numpy
torch: "2.2.2"
arch: arm64
base: debian:bookworm
system_packages: [g++, python3-dev]
pip: [numpy, jinja2==3.1.3, markupsafe==2.1.5, mpmath==1.3.0, networkx==3.2.1, sympy==1.12,
      typing-extensions==4.10.0]
script: fromnumpy.py
timeout: 600
expect:
  traceback_contains: "Numpy is not available"
"""

CUSTOM_OP = """name: blame-torch
torch: "2.3.1"
arch: arm64
base: debian:bookworm
system_packages: [g++, python3-dev]
pip: [numpy]
script: customop.py
timeout: 600
expect:
  traceback_contains: "custom_op"
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


def _scenario(folder: Path, name: str, body: str, script: str, code: str) -> Path:
    (folder / script).write_text(code)
    path = folder / f"{name}.yaml"
    path.write_text(body)
    return path


def test_the_blame_names_numpy_when_numpy_2_breaks_an_old_torch(runs, tmp_path):
    yaml = _scenario(tmp_path, "blame-numpy", NUMPY, "fromnumpy.py",
                     "import numpy, torch\nprint(torch.from_numpy(numpy.ones(3)).sum())\n")
    proc = run_lab("bisect", str(yaml), "--from", "2.2.2", "--to", "2.3.0", "--arch", "arm64", "--out", str(runs),
                   "--json", "--jobs", "1", "--no-localize")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "2.2.2", "2.3.0"), result
    assert (result["from_verdict"], result["to_verdict"]) == ("reproduced", "not_reproduced")
    assert [b["package"] for b in result["blame"]] == ["numpy"], result["blame_summary"]
    (numpy,) = result["blame"]
    assert numpy["old"].startswith("1.") and numpy["new"].startswith("2."), numpy
    assert "with its era's numpy, torch 2.2.2 does not reproduce" in result["blame_summary"]
    assert result["blame_fix"] == "pin numpy<2 on torch <= 2.2.x"
    assert any(s["flips"] for s in result["blame_steps"])
    assert len(result["blame_steps"]) >= 3  # the era rebuild, then delta debugging over several packages
    folder = Path(result["folder"])
    assert "numpy" in (folder / "bisect.md").read_text()
    era_run = next(Path(s["run_dir"]) for s in result["blame_steps"] if s["flips"])
    assert '"numpy": "1.' in (era_run / "result.json").read_text()  # what it really installed
    comment = run_lab("comment", str(folder))
    assert comment.returncode == 0, comment.stderr[-2000:]
    assert "pin numpy<2 on torch <= 2.2.x" in comment.stdout

    # the same case with --deps era: 2.2.2 runs with NumPy 1.26.x and passes
    proc = run_lab("run", str(yaml), "--deps", "era", "--out", str(runs), "--json", "--no-diagnose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = last_json(proc.stdout)
    assert run["verdict"] == "not_reproduced", run
    assert run["deps"]["setting"] == "era" and run["deps"]["packages"]["numpy"].startswith("1.")
    assert run["deps"]["exclude_newer"].startswith("2024-04")
    lock = (Path(run["run_dir"]) / "deps.lock").read_text()
    assert "numpy==1." in lock and "--exclude-newer 2024-04" in lock


def test_the_blame_says_torch_alone_for_an_api_added_in_a_release(runs, tmp_path):
    yaml = _scenario(tmp_path, "blame-torch", CUSTOM_OP, "customop.py",
                     "import torch\nprint(torch.library.custom_op)\n")
    proc = run_lab("bisect", str(yaml), "--from", "2.3.1", "--to", "2.4.0", "--arch", "arm64", "--out", str(runs),
                   "--json", "--jobs", "1", "--no-localize")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "2.3.1", "2.4.0"), result
    assert result["blame"] == [{"package": "torch", "old": "2.3.1", "new": "2.4.0"}], result["blame_summary"]
    assert result["blame_fix"] == "torch alone"
    assert "torch alone" in result["blame_summary"]
    assert not any(s["flips"] for s in result["blame_steps"])
