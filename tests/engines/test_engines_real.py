"""Many engines, for real on one machine: the first engine (the machine's own dockerd, also reached
through an ssh:// context), a second dockerd the fixture starts, and an address nothing answers.

Cheapest cases: libgomp-amd64 and the sleeper (amd64, the CPU torch of tests/cpu_torch.py);
vmap-inside-compile on arm64 for the bisections (three ~100 MB CPU wheels, its script stops in
Dynamo before any C++ compile). The serial bisection keeps its images on the first engine, which
tests/test_e2e_bisect.py then reuses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, LAB, ROOT, last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600),
              pytest.mark.beside]  # bin/test's second lane of Docker runs

NOWHERE = "unix:///run/lab-test-nothing-here.sock"
BISECT = ["bisect", "vmap-inside-compile", "--from", "2.3.1", "--to", "2.4.1", "--arch", "arm64", "--json",
          "--keep-images", "--no-blame",  # the blame step has its own e2e test (test_e2e_blame),
          "--no-localize"]  # and the localization at the boundary test_e2e_bisect's


def lab(engines, *args, timeout=3000):
    return run_lab(*args, env=engines.env, timeout=timeout)


def result_json(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def test_lab_engines_lists_every_engine_with_its_facts_and_skips_the_dead_one(engines):
    proc = lab(engines, "engines", "--json", "--engine", "second", "--engine", "over-ssh", "--engine", NOWHERE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {e["name"]: e for e in last_json(proc.stdout)["engines"]}
    # and every partition of a Slurm that answers here (issue 31: bin/setup-slurm's cluster on this host)
    partitions = {n for n in found if n.startswith("slurm:")}
    assert set(found) - partitions == {"default", "second", "over-ssh", "local", NOWHERE}
    assert all(found[n]["kind"] == "slurm" and found[n]["reachable"] for n in partitions), partitions
    # the built-in local engine (this host, no containers) is listed too, and never a Docker engine
    assert found["local"]["kind"] == "local" and found["local"]["url"] == "local://", found["local"]
    assert all(found[n]["kind"] == "docker" for n in ("default", "second", "over-ssh"))
    for name in ("default", "second", "over-ssh"):
        e = found[name]
        assert e["reachable"] and e["arch"] == "amd64" and e["cpus"] >= 1 and e["memory"] > 0, e
        assert e["gpu"] is False and e["version"] and e["slots"] >= 1, e
    assert found["second"]["url"] == engines.second.url and found["second"]["free_disk"] > 0
    assert found["over-ssh"]["url"] == engines.sshd.url and found["over-ssh"]["free_disk"] is None
    assert not found[NOWHERE]["reachable"] and "does not answer" in found[NOWHERE]["reason"]
    text = lab(engines, "engines", "--engine", NOWHERE)
    assert text.returncode == 0 and "unreachable, skipped" in text.stdout and "Traceback" not in text.stderr


@pytest.mark.usefixtures("cpu_torch")
def test_a_pinned_run_goes_to_that_engine_and_names_it(engines, tmp_path):
    for name in ("second", "over-ssh"):
        proc = lab(engines, "run", "libgomp-amd64", *TORCH.args, "--no-diagnose", "--json", "--engine", name,
                   "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        data = last_json(proc.stdout)
        assert data["verdict"] == "not_reproduced", data["reason"]
        assert data["engine"]["name"] == name and data["emulated"] is False
        assert f"engine {name}" in (Path(data["run_dir"]) / "report.md").read_text()
    # the image was built on the second engine, from the host's cache: no registry
    managed = {"label": "org.torch-repro-lab.managed=true"}
    images = docker.DockerClient(base_url=engines.second.url).images.list(filters=managed)
    assert any(t.startswith("torch-repro-lab/case:libgomp-amd64-") for i in images for t in i.tags)


@pytest.mark.usefixtures("cpu_torch")
def test_an_unreachable_engine_is_skipped_with_a_warning_and_never_fatal(engines, tmp_path):
    proc = lab(engines, "run", "libgomp-amd64", *TORCH.args, "--no-diagnose", "--json", "--engine", "first",
               "--engine", NOWHERE, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"engine {NOWHERE} skipped" in proc.stderr
    assert last_json(proc.stdout)["engine"]["name"] == "first"
    alone = lab(engines, "run", "libgomp-amd64", *TORCH.args, "--engine", NOWHERE, "--out", str(tmp_path))
    assert alone.returncode != 0 and "does not answer" in alone.stderr and "Traceback" not in alone.stderr


@pytest.mark.usefixtures("cpu_torch")
def test_a_matrix_spreads_across_two_engines(engines, tmp_path):
    proc = lab(engines, "run", "libgomp-amd64", *TORCH.args, "--repeat", "2", "--no-diagnose", "--json",
               "--engine", "first", "--engine", "second", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cell,) = last_json(proc.stdout)["cells"]
    assert cell["verdict"] == "not_reproduced" and cell["repeat"] == 2
    used = {result_json(r["run_dir"])["engine"]["name"] for r in cell["runs"]}
    assert used == {"first", "second"}  # one slot each: the two runs ran at once, one on each
    assert "2 at once on 2 engine(s)" in proc.stderr


@pytest.mark.usefixtures("cpu_torch")
def test_ctrl_c_during_a_parallel_matrix_leaves_no_container_on_either_engine(engines, tmp_path):
    first, second = docker.from_env(), docker.DockerClient(base_url=engines.second.url)
    # the sleeper with a long timeout: Ctrl-C ends the runs, not their timeout, however slowly the
    # second engine starts its container on a loaded machine
    folder = tmp_path / "scenario"
    folder.mkdir()
    shutil.copy(DATA / "e2e" / "sleeper.py", folder)
    # named apart from the sleeper, whose containers tests/test_e2e.py looks for while this lane runs beside it
    scenario = folder / "two-engine-nap.yaml"
    scenario.write_text((DATA / "e2e" / "sleeper.yaml").read_text().replace("timeout: 15", "timeout: 900")
                        .replace("name: sleeper\n", "name: two-engine-nap\n", 1))
    for name in ("first", "second"):  # built beforehand, so the two runs start together
        built = lab(engines, "build", str(scenario), *TORCH.args, "--engine", name)
        assert built.returncode == 0, built.stderr[-3000:]
    proc = subprocess.Popen([*LAB, "run", str(scenario), *TORCH.args, "--repeat", "2", "--no-diagnose",
                             "--engine", "first", "--engine", "second", "--out", str(tmp_path / "runs")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **engines.env})
    label = {"label": "org.torch-repro-lab.session"}

    def ours(client, **filters) -> list[str]:  # the containers this lab process started (session "<pid>-<uuid>"),
        return [c.name for c in client.containers.list(all=True, filters={**label, **filters})  # not another
                if c.labels["org.torch-repro-lab.session"].startswith(f"{proc.pid}-")]        # lab's on the engine
    deadline = time.monotonic() + 600
    while not (ours(first, status="running") and ours(second, status="running")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the two runs never ran at once"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert ours(first) == [] and ours(second) == []


def test_a_parallel_bisection_across_two_engines_finds_the_serial_boundary(engines, tmp_path):
    """The serial bisection of the same case and range is tests/test_e2e_bisect.py's (one slot on this
    2-CPU machine): (2.3.1, 2.4.0) in 3 probes, one per round. Run again here it would only cost time."""
    parallel = lab(engines, *BISECT, "--engine", "first", "--engine", "second", "--out", str(tmp_path / "parallel"))
    assert parallel.returncode == 0, parallel.stderr[-3000:]
    two = last_json(parallel.stdout)
    assert (two["status"], two["last_old"], two["first_new"]) == ("found", "2.3.1", "2.4.0")
    assert two["width"] == 2
    assert len(two["steps"]) == 3 and two["rounds"] < len(two["steps"])  # the two ends in one round
    assert {s["engine"] for s in two["steps"]} == {"first", "second"}
    assert all(s["emulated"] for s in two["steps"])  # arm64 on amd64 engines: QEMU
    assert "up to 2 at once" in parallel.stderr


def test_an_engine_that_dies_mid_bisection_hands_its_probe_to_the_other(engines, tmp_path):
    """Over the two releases of the boundary only (--to 2.4.0): both ends go out in the first round,
    one to each engine, so the second engine has a probe to lose and no third probe is needed."""
    second = docker.DockerClient(base_url=engines.second.url)
    ends = [a if a != "2.4.1" else "2.4.0" for a in BISECT]
    proc = subprocess.Popen([*LAB, *ends, "--engine", "first", "--engine", "second", "--out", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **engines.env})
    deadline = time.monotonic() + 1800  # the second engine builds the probe image first (its own store)
    while not second.containers.list(filters={"label": "org.torch-repro-lab.session", "status": "running"}):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no probe ever ran on the second engine"
        time.sleep(0.5)
    engines.second.stop()  # the engine goes away while its probe runs
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    result = last_json(out)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "2.3.1", "2.4.0")
    assert all(s["engine"] == "first" for s in result["steps"])  # the lost probe ran again there
    assert any("second stopped answering" in n for n in result["notes"]), result["notes"]
    assert "second stopped answering" in (Path(result["folder"]) / "bisect.md").read_text()
