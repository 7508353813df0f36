"""What changed at the boundary, end to end through the `lab` CLI and the real engine.

- A real bisection (arm64 under QEMU) of tests/data/e2e/vmap-newapi.yaml from 2.2.2 to 2.4.0: torch
  2.2.2 has no `torch.compiler.is_compiling`, so it fails with AttributeError, not with the
  scenario's signature ("torch.func.vmap capture is disabled", 2.3.x); 2.4.0 passes. 2.2.2 must be
  `failed_differently`, skipped, listed in bisect.md, and never the boundary; the boundary is pinned
  to the releases' commits; `lab compare` and `lab comment` read the real folders; the Dynamo
  failure of 2.3.1 is localized (its scenario fixes the backend, and 2.3.1 ships no
  compiler_bisector: both said).
- `lab localize` of an Inductor C++ compile error (tests/data/e2e/relu-inject.yaml, with the amd64
  CPU torch of tests/cpu_torch.py, here 2.13.0+cpu, which ships compiler_bisector with its `run`
  command): the ablation names Inductor, and compiler_bisector, run in the same image, names the
  subsystem.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.docker, pytest.mark.timeout(5400),
              pytest.mark.beside]  # bin/test's second lane of Docker runs

NEWAPI = str(DATA / "e2e" / "vmap-newapi.yaml")
RELU = str(DATA / "e2e" / "relu-inject.yaml")
SHA = re.compile(r"^[0-9a-f]{40}$")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.mark.arm64
def test_a_different_failure_is_kept_apart_and_the_boundary_pinned(runs):
    args = ["bisect", NEWAPI, "--from", "2.2.2", "--to", "2.4.0", "--arch", "arm64", "--out", str(runs), "--json",
            "--no-blame"]  # the blame step has its own e2e test (test_e2e_blame)
    proc = run_lab(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    steps = {s["torch"]: s for s in result["steps"]}
    assert steps["2.2.2"]["verdict"] == "failed_differently" and steps["2.2.2"]["outcome"] == "skip"
    observed = steps["2.2.2"]["different_failure"]["observed"]
    assert "AttributeError" in observed and "is_compiling" in observed
    assert "torch.func.vmap capture is disabled" in steps["2.2.2"]["different_failure"]["expected"]
    assert result["failed_differently_probes"] == ["2.2.2"]
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "2.3.1", "2.4.0")
    # the end that failed differently was replaced inwards (by 2.3.1 when 2.3.0 itself was skipped:
    # an engine on a shared machine once refused its build with a 500)
    assert result["old_end"] in ("2.3.0", "2.3.1")
    # pinned to source: both commits, the compare link, the git bisect line
    source = result["source"]
    assert SHA.match(source["last_old_commit"]) and SHA.match(source["first_new_commit"])
    assert source["compare_url"] == ("https://github.com/pytorch/pytorch/compare/"
                                     f"{source['last_old_commit']}...{source['first_new_commit']}")
    assert source["git_bisect"].endswith(f"{source['first_new_commit']} {source['last_old_commit']}")
    assert all(SHA.match(s["git_version"]) for s in result["steps"])
    assert source["compare_url"] in proc.stderr and "git bisect start" in proc.stderr
    # the compare summary of the boundary pair, printed and in bisect.md
    assert any(line.startswith("verdict: reproduced → not_reproduced") for line in result["compare"])
    assert "what changed at the boundary (lab compare):" in proc.stderr
    folder = Path(result["folder"])
    md = (folder / "bisect.md").read_text()
    assert "## Failed differently" in md and "AttributeError" in md and "skipped: never a boundary" in md
    assert "## What changed at the boundary" in md and source["compare_url"] in md
    assert source["git_bisect"] in md
    # 2.3.1's failure is Dynamo's: localized, and what could not be done is said
    assert "torch 2.3.1" in result["localization"]
    assert "does not ship torch._inductor.compiler_bisector" in result["localization"]
    assert "## Localization" in md
    made = (folder / "localize" / "localize.json").stat().st_mtime_ns
    # the probes' case images are gone, those the next rounds had built ahead included; only the
    # localized release's image may stay (a localization keeps its image, as `lab run` does)
    left = {i.labels.get("org.torch-repro-lab.torch") for i in docker.from_env(timeout=60).images.list(
        filters={"label": ["org.torch-repro-lab.managed=true", "org.torch-repro-lab.scenario=vmap-newapi"]})}
    assert left <= {"2.3.1"}, left

    # lab compare on the bisect folder: its boundary pair
    cmp = run_lab("compare", str(folder), "--json")
    assert cmp.returncode == 0, cmp.stderr
    doc = last_json(cmp.stdout)
    assert doc["kind"] == "compare" and doc["verdict"] == {"field": "verdict", "a": "reproduced",
                                                           "b": "not_reproduced"}
    assert doc["exception_a"]["type"] == "torch._dynamo.exc.Unsupported" and doc["exception_b"] is None
    assert doc["exception_a"]["user_frame"] and "vmap_newapi.py" in doc["exception_a"]["user_frame"]
    assert any(c["field"] == "torch" for c in doc["packages"]["changed"])
    assert doc["libraries"]["available"]

    # lab comment: the one-line result, the link, the details
    comment = run_lab("comment", str(folder))
    assert comment.returncode == 0, comment.stderr
    text = comment.stdout
    assert text.startswith("**Reproduced on torch 2.3.1, arm64 (emulated). Fixed between 2.3.1 and 2.4.0.**")
    assert source["compare_url"] in text and "<details>" in text and "lab run " in text
    assert "docker build --platform linux/arm64" in text

    # the flag counts the different failure on one side; the folders are reused, nothing runs again
    again = run_lab(*args, "--failed-differently", "reproduced")
    assert again.returncode == 0, again.stderr[-3000:]
    counted = last_json(again.stdout)
    assert counted["failed_differently"] == "reproduced" and counted["old_end"] == "2.2.2"
    assert (counted["last_old"], counted["first_new"]) == ("2.3.1", "2.4.0")
    assert again.stderr.count("(from an earlier run)") >= 3
    # the same boundary, the same case: its localization stands, and nothing of it runs again
    assert counted["localization"] == result["localization"]
    assert "from an earlier run of this bisection" in again.stderr
    assert (folder / "localize" / "localize.json").stat().st_mtime_ns == made


@pytest.mark.usefixtures("cpu_torch")
def test_localize_names_inductor_and_the_subsystem(runs):
    proc = run_lab("localize", RELU, *TORCH.args, "--out", str(runs), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["kind"] == "localize" and result["layer"] == "inductor"
    bisector = result["bisector"]
    assert bisector["available"] and bisector["ran"], bisector
    assert bisector["backend"] == "inductor" and bisector["subsystem"], bisector
    ablation = json.loads((Path(result["ablation_dir"]) / "ablation.json").read_text())
    assert [s["verdict"] for s in ablation["ablation"]] == ["not_reproduced", "not_reproduced", "reproduced"]
