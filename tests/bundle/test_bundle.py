"""Tests for lab.bundle: writing, inspecting and opening bundles, replay instructions, signatures."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from lab.bundle.archive import (
    WHY_BINARY_SECRET,
    WHY_CA,
    WHY_LINK,
    WHY_SITE,
    WHY_SLIM,
    WHY_SPECIAL,
    WHY_WHEEL,
    BundleExistsError,
    BundleTargetError,
    inspect_bundle,
    open_bundle,
    write_bundle,
)
from lab.bundle.compare import compare, signature
from lab.bundle.instructions import REPLAY_HEADING, replay_instructions
from lab.bundle.manifest import MAX_MANIFEST_BYTES, BundleLimits
from lab.core.errors import ResultError
from lab.core.results import RunResult
from lab.core.safetar import BundleError
from tests.conftest import last_json, run_lab

REAL_RUN = Path(__file__).resolve().parents[1] / "data" / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"
CREATED = datetime(2026, 11, 22, 12, 30, tzinfo=timezone.utc)
SECRET = "hf_SuperSecretValue123"
HOME = "/home/ana"
ENV = {"HF_TOKEN": SECRET, "HOME": HOME, "PATH": "/usr/bin"}
NAME = "20261122T120958Z-torch2.5.1-arm64"

RESULT = {  # a result.json as `lab run` writes it (schema 1)
    "schema_version": 1, "kind": "run",
    "scenario": "libgomp-aarch64", "case": "libgomp-aarch64[torch=2.5.1,arch=arm64]", "torch": "2.5.1",
    "arch": "arm64", "backend": None, "mode": None, "emulated": True, "verdict": "reproduced",
    "reason": "every expectation held", "summary": ["two GNU OpenMP runtimes in pid 1"],
    "run_dir": f"runs/libgomp-aarch64/{NAME}",
    "evidence": {"duplicate_runtimes": [{"family": "libgomp", "pid": 1, "paths": [
        "/opt/venv/lib/python3.11/site-packages/torch/lib/../../torch.libs/libgomp-f3febf51.so.1.0.0",
        "/lib/aarch64-linux-gnu/libgomp.so.1"]}], "exception": None},
    "graph_breaks": None, "exit_code": 0, "duration_s": 58.97, "killed": None,
    "limits": "memory 8 GiB, pids 4096, all cpus, no network", "checks": [],
    "image": {"tag": "torch-repro-lab/case:libgomp-aarch64-742e2307b639011e", "id": "sha256:01", "cached": False},
    "base": {"requested": "debian:bookworm", "ref": "torch-repro-lab/debian:bookworm-arm64",
             "origin": "bootstrapped", "image_id": "sha256:00"},
    "engine": {"version": "20.10.24+dfsg1", "host_arch": "x86_64"}, "lab_version": "0.1.0",
    "started": "2026-11-22T12:09:58+00:00",
}
SCENARIO_YAML = f"""\
name: libgomp-aarch64
base: debian:bookworm
gpu: false
env:
  OMP_NUM_THREADS: '2'
  HF_TOKEN: {SECRET}
resolved:
  vars:
    N: '512'
"""


def make_run(parent: Path, name: str = NAME) -> Path:
    """A run folder shaped like a real one, with a secret, URL credentials, the home path, a wheel,
    a CA bundle, links and a fifo planted in it."""
    run = parent / "runs" / "libgomp-aarch64" / name
    files: dict[str, str | bytes] = {
        "result.json": json.dumps(RESULT, indent=2),
        "report.md": "# libgomp: reproduced\n\nSome evidence.\n",
        "scenario.yaml": SCENARIO_YAML,
        "Dockerfile": "ARG BASE=debian:bookworm\nFROM ${BASE}\nCOPY lab/ca.crt lab/pip.conf /etc/lab/\n",
        ".dockerignore": "out\ndiagnose\n*.txt\n*.json\n*.md\n*.log\nscenario.yaml\n",
        "lab/pip.conf": "[global]\ncert = /etc/lab/ca.crt\nindex-url = https://ana:hunter22@mirror.example/simple\n",
        "lab/ca.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "wheels/README": "Wheels from the host's local pip sources.\n",
        "site/README.md": "# site/: the venv's packages, installed on the host\n",
        "site/torch/lib/libtorch_cpu.so": b"\x7fELF" + bytes(2000),
        "wheels/torch-2.5.1-cp311-none-linux_aarch64.whl": b"PK\x03\x04" + os.urandom(3000),
        "repro/libgomp_aarch64.py": "import torch\nprint(sorted([3, 1], key=abs))\n",
        "stdout.txt": f"token is {SECRET}\nfile {HOME}/proj/x.py\n",
        "stderr.txt": "Traceback...\nRuntimeError: boom\n",
        "build.log": "Step 1/9\nLooking in indexes: https://__token__:pypi-xyz@mirror.example/simple\n",
        "out/ld/ld.1": "     1:\tcalling init: /lib/aarch64-linux-gnu/libgomp.so.1\n",
        "out/ld/ld.7": "     7:\tfind library=libm.so.6\n",
        "diagnose/trace/dedicated_log_torch_trace.log": "{}\n",
        "diagnose/blob.bin": b"\x00\x01binary\xff" * 100,
        "diagnose/leaky.bin": b"\x00\xff" + SECRET.encode() + b"\x00",
    }
    for rel, content in files.items():
        path = run / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    (run / "repro" / "libgomp_aarch64.py").chmod(0o755)
    (run / "passwd-link").symlink_to("/etc/passwd")
    (run / "etc-dir-link").symlink_to("/etc", target_is_directory=True)
    os.mkfifo(run / "out" / "pipe")
    return run


def members(bundle: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(bundle, "r:gz") as tar:
        return tar.getmembers()


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path)


@pytest.fixture
def bundle(run: Path, tmp_path: Path) -> Path:
    return write_bundle(run, tmp_path / "b.tar.gz", env=ENV, created=CREATED).path


# --------------------------------------------------------------------------- writing


def test_bundle_layout(run: Path, tmp_path: Path) -> None:
    info = write_bundle(run, tmp_path / "b.tar.gz", env=ENV, created=CREATED)
    assert info.path == tmp_path / "b.tar.gz" and info.size == info.path.stat().st_size
    names = [m.name for m in members(info.path)]
    assert names[0] == f"{NAME}/bundle.json"
    rel = [n.split("/", 1)[1] for n in names[1:]]
    meta = [r for r in rel if not r.startswith(("out/", "diagnose/"))]
    data = [r for r in rel if r.startswith(("out/", "diagnose/"))]
    assert rel == meta + data and meta == sorted(meta) and data == sorted(data)
    assert "result.json" in meta and "wheels/LEFT-OUT.txt" in meta and "out/ld/ld.1" in data
    assert info.file_count == len(rel)
    for member in members(info.path):
        assert member.isreg() and member.uid == 0 and member.gid == 0 and member.uname == member.gname == ""
        assert member.mtime == int(CREATED.timestamp())
        assert member.mode == (0o755 if member.name.endswith(".py") else 0o644)


def test_left_out(bundle: Path) -> None:
    manifest = inspect_bundle(bundle)
    why = {entry.path: entry.why for entry in manifest.left_out}
    assert why == {
        "wheels/torch-2.5.1-cp311-none-linux_aarch64.whl": WHY_WHEEL, "lab/ca.crt": WHY_CA,
        "passwd-link": WHY_LINK, "etc-dir-link": WHY_LINK, "out/pipe": WHY_SPECIAL,
        "diagnose/leaky.bin": WHY_BINARY_SECRET, "site/torch/lib/libtorch_cpu.so": WHY_SITE,
    }
    wheel = next(e for e in manifest.left_out if e.why == WHY_WHEEL)
    assert wheel.size == 3004 and len(wheel.sha256) == 64
    assert next(e for e in manifest.left_out if e.path == "passwd-link").sha256 is None
    paths = {f.path for f in manifest.files}
    assert not paths & set(why)


def test_manifest_fields(bundle: Path) -> None:
    manifest = inspect_bundle(bundle)
    assert manifest.format == "torch-repro-lab-bundle" and manifest.format_version == 1
    assert manifest.created == "2026-11-22T12:30:00+00:00" and manifest.lab_version == "0.1.0"
    assert (manifest.scenario, manifest.torch, manifest.arch, manifest.verdict) == \
        ("libgomp-aarch64", "2.5.1", "arm64", "reproduced")
    assert manifest.summary == ["two GNU OpenMP runtimes in pid 1"] and manifest.slim is False
    kinds = {f.path: f.kind for f in manifest.files}
    assert kinds["result.json"] == "meta" and kinds["out/ld/ld.1"] == "data" and kinds["diagnose/blob.bin"] == "data"


def test_open_bundle_roundtrip_and_scrubbed(bundle: Path, tmp_path: Path) -> None:
    folder = open_bundle(bundle, tmp_path / "opened")
    assert folder == tmp_path / "opened" / NAME
    manifest = inspect_bundle(bundle)
    for entry in manifest.files:
        data = (folder / entry.path).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry.size, entry.sha256)
    everything = all_bytes(tmp_path / "opened")
    assert SECRET.encode() not in everything
    assert b"hunter22" not in everything and b"pypi-xyz" not in everything
    assert HOME.encode() not in everything
    assert (folder / "lab" / "pip.conf").read_text().endswith("index-url = https://mirror.example/simple\n")
    assert (folder / "stdout.txt").read_text() == "token is ***\nfile ~/proj/x.py\n"
    assert "HF_TOKEN: \"***\"" in (folder / "scenario.yaml").read_text()
    assert (folder / "repro" / "libgomp_aarch64.py").read_text() == "import torch\nprint(sorted([3, 1], key=abs))\n"
    assert (folder / "diagnose" / "blob.bin").read_bytes() == b"\x00\x01binary\xff" * 100
    assert not (folder / "lab" / "ca.crt").exists() and not (folder / "passwd-link").exists()
    assert "torch-2.5.1-cp311-none-linux_aarch64.whl" in (folder / "wheels" / "LEFT-OUT.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "opened").iterdir()) == [NAME]


def test_report_ends_with_replay(bundle: Path, tmp_path: Path) -> None:
    report = (open_bundle(bundle, tmp_path / "o") / "report.md").read_text()
    assert report.startswith("# libgomp: reproduced\n")
    tail = report[report.index(REPLAY_HEADING):]
    assert report.count(REPLAY_HEADING) == 1 and tail.rstrip().endswith("as the original run did.")
    assert "lab replay b.tar.gz" in tail and "tar xzf b.tar.gz" in tail and f"cd {NAME}" in tail
    assert "docker build --platform linux/arm64 --build-arg BASE=debian:bookworm -t repro ." in tail
    assert ("docker run --rm --platform linux/arm64 --network none -e HF_TOKEN=*** -e N=512 -e OMP_NUM_THREADS=2 "
            "-e OPENBLAS_NUM_THREADS=1 -e TORCHINDUCTOR_COMPILE_THREADS=1 -e LD_DEBUG=libs,files repro") in tail


def test_existing_replay_section_is_kept(run: Path, tmp_path: Path) -> None:
    text = "# r\n\n## How to replay\n\nmine\n"
    (run / "report.md").write_text(text)
    folder = open_bundle(write_bundle(run, tmp_path / "b.tar.gz", env=ENV).path, tmp_path / "o")
    assert (folder / "report.md").read_text() == text


def test_missing_report_gets_one(run: Path, tmp_path: Path) -> None:
    (run / "report.md").unlink()
    folder = open_bundle(write_bundle(run, tmp_path / "b.tar.gz", env=ENV).path, tmp_path / "o")
    report = (folder / "report.md").read_text()
    assert "This run wrote no report.md" in report and REPLAY_HEADING in report


def test_slim(run: Path, tmp_path: Path) -> None:
    full = write_bundle(run, tmp_path / "full.tar.gz", env=ENV, created=CREATED)
    slim = write_bundle(run, tmp_path / "slim.tar.gz", slim=True, env=ENV, created=CREATED)
    manifest = inspect_bundle(slim.path)
    assert manifest.slim is True
    slimmed = {e.path for e in manifest.left_out if e.why == WHY_SLIM}
    assert slimmed == {"out/ld/ld.1", "out/ld/ld.7"}
    paths = {f.path for f in manifest.files}
    assert "diagnose/blob.bin" in paths and not any(p.startswith("out/ld/") for p in paths)
    assert slim.file_count == full.file_count - 2


def test_deterministic(run: Path, tmp_path: Path) -> None:
    a = write_bundle(run, tmp_path / "a" / "b.tar.gz", env=ENV, created=CREATED).path.read_bytes()
    b = write_bundle(run, tmp_path / "b" / "b.tar.gz", env=ENV, created=CREATED).path.read_bytes()
    assert a != b"" and hashlib.sha256(a).digest() == hashlib.sha256(b).digest()


def test_default_output_in_cwd(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    info = write_bundle(run, env=ENV)
    assert info.path == tmp_path / f"{NAME}.tar.gz" and info.path.is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_output_inside_the_run_folder_is_refused(run: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    before = _tree(run)
    (tmp_path / "link").symlink_to(run / "out")           # a link that leads into it
    monkeypatch.chdir(run / "out")                        # the default (NAME.tar.gz here) is inside too
    for target in (run / "self.tar.gz", run / "report.md", run / "out" / "x.tar.gz", tmp_path / "link" / "x.tar.gz",
                   run, None):
        with pytest.raises(BundleTargetError, match="inside the run folder it packs"):
            write_bundle(run, target, env=ENV, force=True)
    assert _tree(run) == before                           # nothing written, nothing replaced


def test_an_existing_file_is_replaced_only_with_force(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "b.tar.gz"
    target.write_bytes(b"the user's own file")
    with pytest.raises(BundleExistsError, match="exists already.*--force"):
        write_bundle(run, target, env=ENV)
    assert target.read_bytes() == b"the user's own file"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no partial file left
    precious = tmp_path / "precious.txt"                  # a link: replaced with --force, never written through
    precious.write_bytes(b"keep me")
    (tmp_path / "l.tar.gz").symlink_to(precious)
    with pytest.raises(BundleExistsError):
        write_bundle(run, tmp_path / "l.tar.gz", env=ENV)
    info = write_bundle(run, tmp_path / "l.tar.gz", env=ENV, force=True)
    assert precious.read_bytes() == b"keep me" and not info.path.is_symlink()
    assert write_bundle(run, target, env=ENV, force=True).manifest.case == inspect_bundle(target).case
    (tmp_path / "dir.tar.gz").mkdir()
    with pytest.raises(BundleExistsError, match="not a file"):
        write_bundle(run, tmp_path / "dir.tar.gz", env=ENV, force=True)


def test_lab_bundle_refuses_to_overwrite_or_write_inside(run: Path, tmp_path: Path) -> None:
    target = tmp_path / "b.tar.gz"
    target.write_bytes(b"mine")
    proc = run_lab("bundle", str(run), "-o", str(target))
    assert proc.returncode == 2 and "exists already" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr and target.read_bytes() == b"mine"
    inside = run_lab("bundle", str(run), "-o", str(run / "self.tar.gz"))
    assert inside.returncode == 2 and "inside the run folder" in inside.stderr and not (run / "self.tar.gz").exists()
    forced = run_lab("bundle", str(run), "-o", str(target), "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert last_json(forced.stdout)["bundle"] == str(target) and inspect_bundle(target).files


def test_not_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(ResultError, match="result.json: there is no such file, so .* is not a run folder"):
        write_bundle(tmp_path, tmp_path / "x.tar.gz")
    with pytest.raises(BundleError, match="it is not a folder"):
        write_bundle(tmp_path / "absent", tmp_path / "x.tar.gz")
    (tmp_path / "result.json").write_text("[1, 2")
    with pytest.raises(ResultError, match="result.json: is not valid JSON"):
        write_bundle(tmp_path, tmp_path / "x.tar.gz")
    (tmp_path / "result.json").write_text(json.dumps({**RESULT, "schema_version": 2}))
    with pytest.raises(ResultError, match="written by a newer torch-repro-lab"):
        write_bundle(tmp_path, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def test_an_unfinished_run_can_be_bundled(run: Path, tmp_path: Path) -> None:
    unfinished = {"schema_version": 1, "kind": "run", "scenario": "libgomp-aarch64", "case": RESULT["case"],
                  "torch": "2.5.1", "arch": "arm64", "backend": None, "mode": None, "verdict": None,
                  "status": "interrupted", "reason": "interrupted by the user", "run_dir": RESULT["run_dir"]}
    (run / "result.json").write_text(json.dumps(unfinished))
    manifest = write_bundle(run, tmp_path / "b.tar.gz", env=ENV, created=CREATED).manifest
    assert (manifest.verdict, manifest.reason, manifest.summary) == (None, "interrupted by the user", [])


def test_real_run_folder(tmp_path: Path) -> None:
    full = write_bundle(REAL_RUN, tmp_path / "full.tar.gz", env={}, created=CREATED)
    slim = write_bundle(REAL_RUN, tmp_path / "slim.tar.gz", slim=True, env={}, created=CREATED)
    assert full.size < 64_000 and slim.size < full.size
    assert [e.path for e in full.left_out] == ["lab/ca.crt"]
    folder = open_bundle(full.path, tmp_path / "o")
    for rel in ("result.json", "evidence.json", "out/ld/ld.1", "Dockerfile", "repro/libgomp_aarch64.py"):
        assert (folder / rel).read_bytes() == (REAL_RUN / rel).read_bytes(), rel


# --------------------------------------------------------------------------- inspect reads only the head


class CountingFile(io.RawIOBase):
    def __init__(self, path: Path) -> None:
        self.handle = path.open("rb")
        self.bytes_read = 0
        self.name = str(path)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.handle.close()
        super().close()


def test_inspect_reads_only_the_head(run: Path, tmp_path: Path) -> None:
    (run / "out" / "big.bin").write_bytes(os.urandom(50 << 20))  # incompressible
    info = write_bundle(run, tmp_path / "big.tar.gz", env=ENV)
    assert info.size > 50 << 20
    counting = CountingFile(info.path)
    try:
        manifest = inspect_bundle(counting)
    finally:
        counting.close()
    assert manifest.verdict == "reproduced"
    assert counting.bytes_read < 256 << 10, counting.bytes_read  # of more than 50 MiB


# --------------------------------------------------------------------------- hostile bundles


def good_manifest(files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "format": "torch-repro-lab-bundle", "format_version": 1, "created": "2026-11-22T12:30:00+00:00",
        "lab_version": "0.1.0", "scenario": "s", "case": "s[torch=2.5.1,arch=amd64]", "torch": "2.5.1",
        "arch": "amd64", "verdict": "reproduced", "reason": "r", "summary": [], "slim": False,
        "files": [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "kind": "meta"}
                  for p, d in files.items()],
        "left_out": [],
    }


def craft(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


def craft_bundle(path: Path, manifest: Any, files: dict[str, bytes], root: str = "r") -> Path:
    raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    return craft(path, [(f"{root}/bundle.json", raw)] + [(f"{root}/{p}", d) for p, d in files.items()])


FILES = {"result.json": b"{}", "report.md": b"# r\n"}


def test_crafted_good_bundle_opens(tmp_path: Path) -> None:
    bundle = craft_bundle(tmp_path / "b.tar.gz", good_manifest(FILES), FILES)
    assert (open_bundle(bundle, tmp_path / "o") / "report.md").read_bytes() == b"# r\n"


def refused(tmp_path: Path, bundle: Path, fragment: str) -> str:
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BundleError) as info:
        open_bundle(bundle, tmp_path / "o")
    text = str(info.value)
    assert str(bundle) in text and fragment in text, text
    assert "\n" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return text


def test_manifest_not_first(tmp_path: Path) -> None:
    manifest = json.dumps(good_manifest(FILES)).encode()
    bundle = craft(tmp_path / "b.tar.gz", [("r/result.json", b"{}"), ("r/bundle.json", manifest)])
    refused(tmp_path, bundle, "its first member is 'r/result.json', not <folder>/bundle.json")


def test_tampered_file(tmp_path: Path) -> None:
    bundle = craft_bundle(tmp_path / "b.tar.gz", good_manifest(FILES), {**FILES, "report.md": b"# X\n"})
    refused(tmp_path, bundle, "its sha256 is")


def test_extra_member(tmp_path: Path) -> None:
    bundle = craft_bundle(tmp_path / "b.tar.gz", good_manifest(FILES), {**FILES, "evil.sh": b"rm -rf ~"})
    refused(tmp_path, bundle, "'r/evil.sh': the manifest does not list this file")


def test_missing_member(tmp_path: Path) -> None:
    bundle = craft_bundle(tmp_path / "b.tar.gz", good_manifest(FILES), {"result.json": b"{}"})
    refused(tmp_path, bundle, "the manifest lists it, but the archive lacks it")


def test_member_outside_root(tmp_path: Path) -> None:
    manifest = json.dumps(good_manifest(FILES)).encode()
    bundle = craft(tmp_path / "b.tar.gz", [("r/bundle.json", manifest), ("r/result.json", b"{}"),
                                           ("r/report.md", b"# r\n"), ("other/x", b"x")])
    refused(tmp_path, bundle, "'other/x': the manifest does not list this file")


def bad(manifest: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**manifest, **changes}


GOOD = good_manifest(FILES)
BAD_MANIFESTS = [
    ("format", bad(GOOD, format="zip"), "field `format`: Input should be 'torch-repro-lab-bundle'"),
    ("version", bad(GOOD, format_version=2), "this lab reads bundle format 1, but the bundle is format 2"),
    ("version-text", bad(GOOD, format_version="1"), "field `format_version`: Input should be a valid integer"),
    ("extra", bad(GOOD, extra=1), "unknown field `extra`"),
    ("missing", {k: v for k, v in GOOD.items() if k != "files"}, "the required field `files` is missing"),
    ("abs-path", bad(GOOD, files=[{**GOOD["files"][0], "path": "/etc/passwd"}]), "field `files[0].path`"),
    ("dotdot", bad(GOOD, files=[{**GOOD["files"][0], "path": "a/../../x"}]), "'..' component"),
    ("sha", bad(GOOD, files=[{**GOOD["files"][0], "sha256": "ABC"}]), "64 lowercase hexadecimal digits"),
    ("size-neg", bad(GOOD, files=[{**GOOD["files"][0], "size": -1}]), "field `files[0].size`"),
    ("size-float", bad(GOOD, files=[{**GOOD["files"][0], "size": 2.0}]), "field `files[0].size`"),
    ("size-bool", bad(GOOD, files=[{**GOOD["files"][0], "size": True}]), "field `files[0].size`"),
    ("kind", bad(GOOD, files=[{**GOOD["files"][0], "kind": "x"}]), "field `files[0].kind`"),
    ("dup", bad(GOOD, files=GOOD["files"] + GOOD["files"][:1]), "lists 'result.json' twice"),
    ("self", bad(GOOD, files=[{**GOOD["files"][0], "path": "bundle.json"}]), "lists bundle.json itself"),
    ("slim", bad(GOOD, slim="no"), "field `slim`"),
    ("created", bad(GOOD, created="yesterday"), "ISO 8601"),
    ("not-object", [1, 2], "must be a JSON object, got list"),
    ("summary", bad(GOOD, summary="text"), "field `summary`"),
    ("left-out", bad(GOOD, left_out=[{"path": "x"}]), "the required field `left_out[0].size` is missing"),
]


@pytest.mark.parametrize(("manifest", "fragment"), [c[1:] for c in BAD_MANIFESTS], ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest(tmp_path: Path, manifest: Any, fragment: str) -> None:
    text = refused(tmp_path, craft_bundle(tmp_path / "b.tar.gz", manifest, FILES), fragment)
    assert "bundle.json" in text


@pytest.mark.parametrize(("raw", "fragment"), [
    (b"{", "is not valid JSON"),
    (b'{"format": 1, "format": 2}', "appears twice"),
    (b'{"x": NaN}', "NaN is not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "is not usable JSON"),
    (b"\xff\xfe", "is not UTF-8"),
    (b'{"format_version": ' + b"9" * 5000 + b"}", "is not usable JSON"),
    (b" " * (MAX_MANIFEST_BYTES + 1), "the limit"),
], ids=["syntax", "dup-key", "nan", "deep", "utf8", "huge-int", "too-big"])
def test_unparsable_manifest(tmp_path: Path, raw: bytes, fragment: str) -> None:
    refused(tmp_path, craft_bundle(tmp_path / "b.tar.gz", raw, FILES), fragment)


def test_limits(tmp_path: Path) -> None:
    bundle = craft_bundle(tmp_path / "b.tar.gz", GOOD, FILES)
    with pytest.raises(BundleError, match="more than the limit of 1"):
        open_bundle(bundle, tmp_path / "o", BundleLimits(max_files=1))
    with pytest.raises(BundleError, match="adds up to 6 bytes, more than the limit of 5"):
        open_bundle(bundle, tmp_path / "o", BundleLimits(max_total_bytes=5))


def test_not_a_bundle(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"hello")
    refused(tmp_path, junk, "not a gzip-compressed tar archive")
    empty = tmp_path / "empty.tar.gz"
    empty.write_bytes(gzip.compress(b"\0" * 1024))
    refused(tmp_path, empty, "")
    with pytest.raises(BundleError, match="cannot read it"):
        inspect_bundle(tmp_path / "absent.tar.gz")


def test_truncated_bundle(run: Path, tmp_path: Path) -> None:
    (run / "out" / "random.bin").write_bytes(os.urandom(200_000))
    data = write_bundle(run, tmp_path / "b.tar.gz", env=ENV).path.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert inspect_bundle(cut).verdict == "reproduced"  # the head is intact
    refused(tmp_path, cut, "truncated")


# --------------------------------------------------------------------------- replay instructions


def test_replay_instructions_plain() -> None:
    text = replay_instructions("b.tar.gz", result(arch="amd64", run_dir="runs/s/run-1", emulated=False, base=None))
    assert text.startswith(REPLAY_HEADING + "\n")
    assert "lab replay b.tar.gz" in text and "tar xzf b.tar.gz" in text and "cd run-1" in text
    assert "pip install ./torch-repro-lab" in text
    assert "docker build --platform linux/amd64 --build-arg BASE=debian:bookworm -t repro ." in text
    assert "docker run --rm --platform linux/amd64 --network none -e LD_DEBUG=libs,files repro" in text
    assert "QEMU" not in text


def test_replay_instructions_gpu_network_limits() -> None:
    scenario = {"base": "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", "gpu": True, "network": True,
                "env": {"A": "x y"}, "limits": {"memory": "8g", "pids": 4096, "cpus": 2.0}}
    text = replay_instructions("my bundle.tar.gz", result(arch="amd64", backend="inductor", base=None),
                               scenario=scenario, folder="f")
    assert "--build-arg BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04" in text
    assert ("docker run --rm --platform linux/amd64 --gpus all --memory 8g --pids-limit 4096 --cpus 2.0 "
            "-e 'A=x y' -e LAB_BACKEND=inductor -e OPENBLAS_NUM_THREADS=1 -e TORCHINDUCTOR_COMPILE_THREADS=1 "
            "-e LD_DEBUG=libs,files repro") in text
    assert "--network none" not in text and "tar xzf 'my bundle.tar.gz'" in text and "cd f" in text


# --------------------------------------------------------------------------- signatures


def result(**changes: Any) -> RunResult:
    return RunResult.model_validate({**RESULT, **changes})


def test_signature() -> None:
    sig = signature(result())
    assert sig == {"verdict": "reproduced",
                   "duplicate_runtimes": {"libgomp": ["libgomp-f3febf51.so.1.0.0", "libgomp.so.1"]},
                   "exception": None, "exit": "success"}
    exc = signature(result(evidence={"duplicate_runtimes": [], "exception": {
        "type": "torch._dynamo.exc.Unsupported", "message": "\nDynamo does not know\nmore"}},
        graph_breaks=3, exit_code=1))
    assert exc["exception"] == {"type": "torch._dynamo.exc.Unsupported", "message": "Dynamo does not know"}
    assert exc["graph_breaks"] == 3 and exc["exit"] == "failure"
    assert signature(result(exit_code=None))["exit"] == "none" and signature(result(exit_code=139))["exit"] == "signal"


def test_compare_same_ignores_pids_and_folders() -> None:
    moved = result(evidence={"duplicate_runtimes": [
        {"family": "libgomp", "pid": 77, "paths": ["/lib/aarch64-linux-gnu/libgomp.so.1"]},
        {"family": "libgomp", "pid": 77, "paths": ["/other/venv/torch.libs/libgomp-f3febf51.so.1.0.0"]}],
        "exception": None}, run_dir="elsewhere", duration_s=3)
    assert compare(result(), moved) == compare(result(), result())
    assert compare(result(), moved).same and compare(result(), moved).lines == ("same verdict, same signature",)


def test_compare_lists_differences() -> None:
    new = result(verdict="not_reproduced", exit_code=1, evidence={
        "duplicate_runtimes": [{"family": "libgomp", "pid": 1, "paths": ["/lib/libgomp.so.1"]}],
        "exception": {"type": "RuntimeError", "message": "boom\ndetails"}})
    comparison = compare(result(), new)
    assert not comparison.same
    assert comparison.lines == (
        "verdict: reproduced → not_reproduced",
        "libgomp runtimes: {libgomp-f3febf51.so.1.0.0, libgomp.so.1} → {libgomp.so.1}",
        "exception: none → RuntimeError: boom",
        "exit: success → failure",
    )
    gone = compare(result(), result(evidence={"duplicate_runtimes": [], "exception": None}))
    assert gone.lines == ("libgomp runtimes: {libgomp-f3febf51.so.1.0.0, libgomp.so.1} → none",)
    breaks = compare(result(graph_breaks=1), result(graph_breaks=0))
    assert breaks.lines == ("graph breaks: 1 → 0",)
    assert compare(result(graph_breaks=1), result(graph_breaks=None)).same  # not collected is not a change
