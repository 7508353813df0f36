"""The attacker's side of `lab replay`, against the real engine: a stranger's bundle tampered
with (its Dockerfile, its script, its manifest, its scenario) and replayed through the CLI.

A bundle carries no signature, so the attacker updates bundle.json's sizes and checksums to
match what they changed. Each test asserts what a maintainer relies on: the tampered part is
not built or is refused, or is shown before it runs and runs confined; the error is one clear
paragraph (exit 2 for bad input); and nothing outside the replay's run folder changed (a
canary folder beside it is snapshot before and after).

The bundle comes from a real run of a cheap amd64 scenario (the CPU torch of tests/cpu_torch.py,
here 2.13.0+cpu from the host's find-links, debian:bookworm), which shares every layer but the
script with libgomp-amd64.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
import yaml

from tests.conftest import LAB, ROOT, last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800), pytest.mark.usefixtures("cpu_torch")]

TOKEN = uuid.uuid4().hex[:12]
HONEST = "import os\nprint('honest replay target', os.environ.get('N'))\n"
SCENARIO = f"""\
name: tamper-target
title: an honest scenario for the bundle attacks
{TORCH.header.rstrip()}
base: debian:bookworm
system_packages: [g++, python3-dev]
pip: [numpy]
vars: {{N: "512"}}
script: target.py
timeout: 300
expect:
  stdout_contains: honest replay target
"""


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> tuple[Path, dict]:
    """A real run folder bundled by `lab bundle`, and the run's result."""
    folder = tmp_path_factory.mktemp("honest")
    (folder / "target.py").write_text(HONEST)
    (folder / "tamper-target.yaml").write_text(SCENARIO)
    proc = run_lab("run", str(folder / "tamper-target.yaml"), "--no-diagnose", "--out", str(folder / "runs"),
                   "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "reproduced", result
    bundle = folder / "honest.tar.gz"
    made = run_lab("bundle", result["run_dir"], "-o", str(bundle))
    assert made.returncode == 0, made.stderr
    return bundle, result


def tamper(bundle: Path, out: Path, edit: Callable[[dict[str, bytes]], None], *, update_manifest: bool = True,
           manifest_edit: Callable[[dict], None] | None = None, extra: tuple[tuple[str, bytes], ...] = ()) -> Path:
    """The bundle with `edit` applied to its files ({path: bytes}) and bundle.json updated to
    match, as an attacker would; `extra` adds raw members (names relative to the bundle's folder)."""
    with tarfile.open(bundle) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        root = members[0].name.split("/")[0]
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in members}
    manifest = json.loads(files.pop("bundle.json"))
    edit(files)
    if update_manifest:
        kinds = {f["path"]: f["kind"] for f in manifest["files"]}
        manifest["files"] = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(),
                              "kind": kinds.get(p, "meta")} for p, d in sorted(files.items())]
    if manifest_edit:
        manifest_edit(manifest)
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [("bundle.json", json.dumps(manifest).encode()), *files.items(), *extra]:
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def snapshot(folder: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under `folder` (links not followed) with its content's sha256."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            found[rel] = "link -> " + os.readlink(path)
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


@pytest.fixture
def place(tmp_path: Path, honest) -> dict:
    """A runs folder for the replay, and a canary folder beside it that nothing may touch."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("the maintainer's file\n")
    return {"runs": tmp_path / "runs", "canary": canary, "before": snapshot(tmp_path),
            "bundle_sha": hashlib.sha256(honest[0].read_bytes()).hexdigest()}


def assert_refused(proc: subprocess.CompletedProcess, tmp_path: Path, place: dict, *words: str) -> None:
    """Exit 2, one paragraph naming the problem, and nothing written anywhere."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    paragraph = proc.stderr[proc.stderr.index("error:"):].strip()
    assert "\n\n" not in paragraph, paragraph
    paragraph = " ".join(paragraph.split())  # as one line, however the terminal wrapped it
    for word in words:
        assert word in paragraph, (word, paragraph)
    assert not place["runs"].exists() or not [p for p in place["runs"].rglob("*") if p.is_file()]
    assert_untouched(tmp_path, place)


def assert_untouched(tmp_path: Path, place: dict, run_dir: Path | None = None) -> None:
    """Nothing changed outside the replay's run folder: the canary, the bundles, the runs folder."""
    after = snapshot(tmp_path, skip=run_dir)
    before = place["before"]
    changed = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    added = {k for k in after.keys() - before.keys()
             if not k.startswith("runs") and not k.endswith(".tar.gz")}  # the tampered bundles we wrote
    runs = {k for k in after.keys() - before.keys() if k.startswith("runs")}
    allowed = set() if run_dir is None else {str(p.relative_to(tmp_path)) for p in [*run_dir.parents]
                                             if tmp_path in p.parents}
    if run_dir is not None:  # a run is recorded in the runs folder's history index (lab.history), and marked
        allowed |= {k for k in runs if Path(k).parent == Path("runs")
                    and Path(k).name.startswith(("index.sqlite3", ".lab-key"))}
    assert not changed and not added and not (runs - allowed), (changed, added, runs - allowed)
    assert (place["canary"] / "keep.txt").read_text() == "the maintainer's file\n"


def replay(bundle: Path, place: dict, *options: str) -> subprocess.CompletedProcess:
    return run_lab("replay", str(bundle), "--out", str(place["runs"]), *options,
                   env={"COLUMNS": "400"})  # long temporary paths stay on one line


def image_history(tag: str) -> str:
    return "\n".join(str(layer.get("CreatedBy", "")) for layer in docker.from_env().images.get(tag).history())


# --------------------------------------------------------------------------- Dockerfile


def evil_dockerfile(canary: Path) -> Callable[[dict[str, bytes]], None]:
    step = f"RUN echo PWNED-{TOKEN} && mkdir -p {canary} && touch {canary}/pwned-at-build\n".encode()

    def edit(files: dict[str, bytes]) -> None:
        assert b"COPY repro/" in files["Dockerfile"]
        files["Dockerfile"] = files["Dockerfile"].replace(b"COPY repro/", step + b"COPY repro/")
    return edit


def test_a_tampered_dockerfile_is_not_built_the_rerender_is(honest, tmp_path, place):
    bundle, original = honest
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", evil_dockerfile(place["canary"]))
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place, "--json", "--yes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    # shown: the summary, the diff with the tampered step, which one is built, and why nobody was asked
    assert "the bundled Dockerfile differs from this lab's re-render" in proc.stderr
    assert f"-RUN echo PWNED-{TOKEN}" in proc.stderr
    assert "this lab's re-render is built, not the bundled one" in proc.stderr
    assert "--yes: building and running without asking." in proc.stderr
    assert result["replay"]["dockerfile_built"] == "rendered"
    assert result["replay"]["dockerfile_same_as_this_lab"] is False
    # not built: not in the build log, the Dockerfile that was built or the image's history
    run_dir = Path(result["run_dir"])
    assert f"PWNED-{TOKEN}" not in (run_dir / "build.log").read_text()
    assert f"PWNED-{TOKEN}" not in (run_dir / "Dockerfile").read_text()
    # the honest image, rebuilt from this lab's render (its context differs from the original run's only in
    # what a replay's sealed build needs: the host's setuptools wheel and a pip.conf with no index)
    assert (run_dir / "Dockerfile").read_bytes() == (Path(original["run_dir"]) / "Dockerfile").read_bytes()
    assert f"PWNED-{TOKEN}" not in image_history(result["image"]["tag"])
    # recorded: which Dockerfile was built, and the diff
    replay_json = json.loads((run_dir / "replay.json").read_text())
    assert replay_json["dockerfile_built"] == "rendered" and f"PWNED-{TOKEN}" in replay_json["dockerfile_diff"]
    report = (run_dir / "report.md").read_text()
    assert "Built: this lab's re-render of the bundled scenario, not the bundled Dockerfile." in report
    assert f"-RUN echo PWNED-{TOKEN}" in report
    assert result["verdict"] == "reproduced" and result["replay"]["same"] is True
    assert_untouched(tmp_path, place, run_dir)


def test_the_bundled_dockerfile_is_built_only_with_the_flag_and_a_warning(honest, tmp_path, place):
    bundle, original = honest
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", evil_dockerfile(place["canary"]))
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place, "--bundled-dockerfile", "--json", "--yes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    try:
        assert "WARNING:" in proc.stderr and "--bundled-dockerfile builds the bundle's own Dockerfile" in proc.stderr
        assert "at build time, as root in a build container (without network" in " ".join(proc.stderr.split())
        assert proc.stderr.index("WARNING:") < proc.stderr.index("--yes: building")  # warned before going on
        assert f"-RUN echo PWNED-{TOKEN}" in proc.stderr  # the diff is shown here too
        assert result["replay"]["dockerfile_built"] == "bundled"
        run_dir = Path(result["run_dir"])
        assert f"PWNED-{TOKEN}" in (run_dir / "build.log").read_text()  # the flag does what it says
        assert "Built: the bundle's own Dockerfile (`--bundled-dockerfile`)." in (run_dir / "report.md").read_text()
        assert result["image"]["tag"] != original["image"]["tag"]
        # its step ran in a build container: the host path it touched is not on the host
        assert not (place["canary"] / "pwned-at-build").exists()
        assert_untouched(tmp_path, place, run_dir)
    finally:
        if result.get("image") and result["image"]["tag"] != original["image"]["tag"]:
            docker.from_env().images.remove(result["image"]["tag"], noprune=False)  # this test's own image


# --------------------------------------------------------------------------- script


def test_a_tampered_script_is_shown_before_it_runs_and_runs_confined(honest, tmp_path, place):
    bundle, _ = honest
    target = place["canary"] / "keep.txt"
    script = (f"# TAMPERED-{TOKEN}: read me before you replay\n"
              "# \x1b[2K\x1b]0;innocent title\x07 \u202e hidden \u202c\n"
              "import os, pathlib, socket\n"
              f"print('TAMPERED-{TOKEN} ran')\n"
              "try:\n"
              "    socket.create_connection(('1.1.1.1', 53), timeout=5)\n"
              "    print('NET-OPEN')\n"
              "except OSError as exc:\n"
              "    print('NET-BLOCKED', exc)\n"
              f"target = pathlib.Path({str(target)!r})\n"
              "try:\n"
              "    target.parent.mkdir(parents=True, exist_ok=True)\n"
              "    target.write_text('pwned')\n"
              "    print('WROTE', target)\n"
              "except OSError as exc:\n"
              "    print('WRITE-REFUSED', exc)\n"
              + "".join(f"print({i})\n" for i in range(30)))

    def edit(files: dict[str, bytes]) -> None:
        files["repro/target.py"] = script.encode()
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", edit)
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place, "--json", "--yes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    # the summary shows the tampered script's first lines, made safe to print, and counts the rest
    summary = proc.stderr[:proc.stderr.index("--yes: building")]
    assert f"1 | # TAMPERED-{TOKEN}: read me before you replay" in summary
    assert "\\x1b[2K\\x1b]0;innocent title\\x07 \\u202e hidden \\u202c" in summary
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    assert "... and 26 more lines" in summary
    assert "network          no" in summary
    # it ran, confined: no network, and the host file it wrote to is untouched
    run_dir = Path(result["run_dir"])
    stdout = (run_dir / "stdout.txt").read_text()
    assert f"TAMPERED-{TOKEN} ran" in stdout
    assert "NET-BLOCKED" in stdout and "NET-OPEN" not in stdout
    assert result["verdict"] == "not_reproduced" and result["replay"]["same"] is False
    assert_untouched(tmp_path, place, run_dir)


def test_a_script_changed_without_its_manifest_is_refused(honest, tmp_path, place):
    bundle, _ = honest

    def edit(files: dict[str, bytes]) -> None:
        files["repro/target.py"] = b"import os\nos.system('touch /tmp/pwned')\n"
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", edit, update_manifest=False)
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place)
    assert_refused(proc, tmp_path, place, "evil.tar.gz", "repro/target.py", "manifest")
    assert "replay of" not in proc.stderr  # refused before anything was shown as if it would run


# --------------------------------------------------------------------------- manifest


def _first_file(key: str, value) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        entry = next(f for f in manifest["files"] if f["path"] == "result.json")
        entry[key] = value(entry[key])
    return change


MANIFEST_ATTACKS = {
    "wrong sha256": (dict(manifest_edit=_first_file("sha256", lambda _: "0" * 64)), ("result.json", "sha256")),
    "wrong size": (dict(manifest_edit=_first_file("size", lambda n: n + 1)), ("result.json", "size")),
    "extra member": (dict(extra=(("repro/helper.py", b"import os\n"),)), ("repro/helper.py", "does not list")),
    "member outside": (dict(extra=((f"../../escaped-{TOKEN}.txt", b"pwned\n"),)), ("..", "leave the folder")),
}


@pytest.mark.parametrize("attack", sorted(MANIFEST_ATTACKS))
def test_a_tampered_manifest_is_refused(honest, tmp_path, place, attack):
    bundle, _ = honest
    options, words = MANIFEST_ATTACKS[attack]
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", lambda files: None, **options)
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place)
    assert_refused(proc, tmp_path, place, "evil.tar.gz", *words)
    assert not list(tmp_path.parent.glob(f"escaped-{TOKEN}.txt")) and not list(tmp_path.glob(f"escaped-{TOKEN}*"))


# --------------------------------------------------------------------------- scenario


def edit_scenario(change: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def edit(files: dict[str, bytes]) -> None:
        data = yaml.safe_load(files["scenario.yaml"])
        change(data)
        files["scenario.yaml"] = yaml.safe_dump(data, sort_keys=False).encode()
    return edit


SCENARIO_ATTACKS = {
    "newline in base": (lambda d: d.update(base=f"debian:bookworm\nRUN echo PWNED-{TOKEN}"), "field `base`"),
    "unknown key": (lambda d: d.update(run_as_root=True), "field `run_as_root`"),
    "newline in resolved torch": (lambda d: d["resolved"].update(torch=f"2.13.0+cpu\nRUN echo PWNED-{TOKEN}"),
                                  "field `resolved.torch`"),
    "network": (lambda d: d.update(network=True), "field `network`"),
}


@pytest.mark.parametrize("attack", sorted(SCENARIO_ATTACKS))
def test_a_tampered_scenario_is_refused_with_file_line_and_field(honest, tmp_path, place, attack):
    bundle, _ = honest
    change, field = SCENARIO_ATTACKS[attack]
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", edit_scenario(change))
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place)
    assert_refused(proc, tmp_path, place, f"scenario.yaml in {tampered}, line ", field)
    if attack == "network":
        assert "--allow-network" in proc.stderr


def test_network_asked_by_a_bundle_runs_only_with_allow_network_and_is_shown(honest, tmp_path, place):
    bundle, _ = honest
    tampered = tamper(bundle, tmp_path / "evil.tar.gz", edit_scenario(lambda d: d.update(network=True)))
    place["before"] = snapshot(tmp_path)
    proc = replay(tampered, place, "--allow-network", "--yes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "network          YES" in proc.stderr
    assert "--yes: building and running without asking." in proc.stderr
    result = last_json(proc.stdout)
    assert "network on" in result["limits"]
    assert_untouched(tmp_path, place, Path(result["run_dir"]))


# --------------------------------------------------------------------------- the question


def test_declining_builds_and_keeps_nothing(honest, tmp_path, place):
    """With a terminal, replay asks; "n" exits 4 before anything is built, and leaves nothing."""
    bundle, _ = honest
    master, slave = pty.openpty()
    proc = subprocess.Popen([*LAB, "replay", str(bundle), "--out", str(place["runs"])], cwd=ROOT, stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(slave)
    try:
        os.write(master, b"n\n")  # the terminal holds the answer until replay asks
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-3000:]
    assert "Build this image and run the script? [y/N]" in err
    assert "declined: nothing was built or run" in err
    assert "honest replay target" in err  # the summary came first
    assert not place["runs"].exists()
    assert_untouched(tmp_path, place)
