"""Bundles and replays through the `lab` CLI and the real engine: the round trip of the two
main scenarios, a hostile bundle refused, and secrets kept out of a real run's bundle."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


def _round_trip(original: dict, runs: Path, tmp_path: Path) -> tuple[dict, dict, str]:
    """Bundle a real run's folder (the session's run of the scenario, which tests/test_e2e.py asserts
    on too: one emulated run for both), inspect the bundle, and replay it."""
    scenario = original["scenario"]
    assert original["verdict"] == "reproduced", original

    bundle = tmp_path / f"{scenario}.tar.gz"
    made = run_lab("bundle", original["run_dir"], "-o", str(bundle), "--json")
    assert made.returncode == 0, made.stderr
    info = last_json(made.stdout)
    assert info["size"] == bundle.stat().st_size and info["size"] < 2 * 2**20
    assert "lab replay" in made.stderr

    inspected = run_lab("bundle", "--inspect", str(bundle), "--json")
    assert inspected.returncode == 0, inspected.stderr
    manifest = last_json(inspected.stdout)
    assert manifest["format_version"] == 1 and manifest["verdict"] == "reproduced"
    paths = {f["path"] for f in manifest["files"]}
    assert {"result.json", "report.md", "scenario.yaml", "Dockerfile"} <= paths
    assert any(p.startswith("repro/") for p in paths) and any(p.startswith("out/ld/") for p in paths)

    with tarfile.open(bundle) as tar:  # the bundled report ends with how to replay it
        root = tar.getnames()[0].split("/")[0]
        report = tar.extractfile(f"{root}/report.md").read().decode()
    tail = report[report.rindex("## How to replay"):]
    assert f"lab replay {bundle.name}" in tail and "docker build --platform" in tail and "docker run" in tail

    replayed = run_lab("replay", str(bundle), "--out", str(runs), "--json", "--yes")
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    result = last_json(replayed.stdout)
    assert "same verdict, same signature" in replayed.stderr
    # with --yes it does not ask, but first shows what it builds and runs
    summary = replayed.stderr[:replayed.stderr.index("--yes: building and running without asking.")]
    assert f"replay of {bundle}" in summary
    for row in ("base", "system packages", "pip", "build", "network", "GPU", "memory", "pids", "CPUs", "timeout",
                "/out copied", "stdout, stderr", "environment", "script"):
        assert f"\n  {row} " in summary, row
    assert f"torch=={original['torch']}" in summary and "     1 | " in summary
    assert "this lab's re-render of the scenario, identical to the bundled one" in summary
    assert result["replay"]["dockerfile_built"] == "rendered"
    # exactly the versions the original run had, whatever today's index serves (deps: latest)
    assert original["deps"]["packages"] and result["deps"]["packages"] == original["deps"]["packages"]
    record = json.loads((Path(result["run_dir"]) / "replay.json").read_text())
    assert record["packages_differ"] == [] and len(record["constrained_to"]) == len(original["deps"]["packages"])
    assert "\n  versions " in summary and "exactly the original run's" in summary
    return original, result, replayed.stderr


def test_libgomp_aarch64_bundle_replays_with_the_same_signature(shared_runs, runs, tmp_path):
    # no compiler exception: the diagnose step does not run (as with --no-diagnose)
    original, result, _ = _round_trip(shared_runs.run("libgomp-aarch64"), runs, tmp_path)
    assert original["diagnose"].startswith("not run"), original["diagnose"]
    assert result["verdict"] == "reproduced" and result["replay"]["same"] is True
    assert result["replay"]["dockerfile_same_as_this_lab"] is True
    assert result["image"]["tag"] == original["image"]["tag"]  # the same Dockerfile and context
    run_dir = Path(result["run_dir"])
    assert run_dir.name.endswith("-replay") and run_dir != Path(original["run_dir"])
    assert (run_dir / "replayed" / "result.json").is_file()
    assert json.loads((run_dir / "replay.json").read_text())["same"] is True
    assert "## Replay" in (run_dir / "report.md").read_text()
    (dup,) = result["evidence"]["duplicate_runtimes"]
    assert dup["family"] == "libgomp" and len(dup["paths"]) == 2


def test_dlpack_cpu_bundle_replays_with_the_same_signature(shared_runs, runs, tmp_path):
    _, result, _ = _round_trip(shared_runs.run("dlpack-cpu", "--no-diagnose"), runs, tmp_path)
    assert result["replay"]["same"] is True
    assert "dlpack" in result["evidence"]["exception"]["message"].lower()


def _hostile(path: Path) -> None:
    """A bundle whose manifest is fine but which carries a member that climbs out of its folder."""
    body = b"pwned\n"
    import hashlib
    manifest = {"format": "torch-repro-lab-bundle", "format_version": 1, "created": "2026-11-22T12:00:00+00:00",
                "lab_version": "0.1.0", "scenario": "x", "case": "x", "torch": "2.5.1", "arch": "arm64",
                "verdict": "reproduced", "reason": "r", "summary": [], "slim": False,
                "files": [{"path": "result.json", "size": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                           "kind": "meta"}], "left_out": []}
    data = json.dumps(manifest).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in (("run/bundle.json", data), ("run/result.json", body), ("run/../../escaped.txt", body)):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def test_a_hostile_bundle_is_refused_and_nothing_is_written_outside(tmp_path):
    bundle = tmp_path / "inner" / "evil.tar.gz"
    bundle.parent.mkdir()
    _hostile(bundle)
    before = sorted(p for p in tmp_path.rglob("*"))
    proc = run_lab("replay", str(bundle), "--out", str(tmp_path / "inner" / "runs"), "--yes")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "evil.tar.gz" in proc.stderr and ".." in proc.stderr
    after = sorted(p for p in tmp_path.rglob("*") if not str(p).startswith(str(tmp_path / "inner" / "runs")))
    assert after == before
    assert not (tmp_path / "escaped.txt").exists()
    leftovers = [p for p in (tmp_path / "inner" / "runs").rglob("*") if p.is_file()]
    assert not leftovers, leftovers


def test_garbage_is_not_a_bundle(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8b not really gzip")
    proc = run_lab("bundle", "--inspect", str(junk))
    assert proc.returncode == 2 and "junk.tar.gz" in proc.stderr and "Traceback" not in proc.stderr


SECRET = "s3cr3t-Value-4242"
CREDS = "alice:hunter22@"


@pytest.mark.usefixtures("cpu_torch")
def test_a_real_runs_bundle_keeps_no_secret(tmp_path):
    (tmp_path / "leaky.py").write_text(
        "import os\nprint('token is', os.environ['MY_API_TOKEN'])\nprint('index', os.environ['INDEX'])\n"
        "print('home', os.environ['HOST_HOME'])\n")
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    (tmp_path / "leaky.yaml").write_text(
        f"name: leaky\n{TORCH.header}base: debian:bookworm\n"
        "system_packages: [g++, python3-dev]\npip: [numpy]\nscript: leaky.py\ntimeout: 300\n"
        f"env:\n  MY_API_TOKEN: {SECRET}\n  INDEX: https://{CREDS}example.invalid/simple\n"
        f"  HOST_HOME: {home}/project\n"
        "expect:\n  stdout_contains: 'token is'\n")
    proc = run_lab("run", str(tmp_path / "leaky.yaml"), "--no-diagnose", "--out", str(tmp_path / "runs"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    assert SECRET in (run_dir / "stdout.txt").read_text()  # the run itself saw it

    bundle = tmp_path / "leaky.tar.gz"
    made = run_lab("bundle", str(run_dir), "-o", str(bundle), env={"HOME": str(home),
                                                                    "GITHUB_TOKEN": "ghp_hostsecret99"})
    assert made.returncode == 0, made.stderr
    with tarfile.open(bundle) as tar:
        texts = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    for name, data in texts.items():
        assert SECRET.encode() not in data, name
        assert CREDS.encode() not in data, name
        assert str(home).encode() not in data, name
        assert b"ghp_hostsecret99" not in data, name
    stdout = next(v for k, v in texts.items() if k.endswith("/stdout.txt")).decode()
    assert "token is ***" in stdout and "https://example.invalid/simple" in stdout and "~/project" in stdout
    assert not any(k.endswith("lab/ca.crt") for k in texts)
