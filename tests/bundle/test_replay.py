"""Tests for lab.replay's prepare step: what a replay shows and refuses before anything is built.

Bundles here are real `lab bundle` archives of run folders written with the lab's own functions
(a scenario resolved and rendered by this lab), tampered with as an attacker would: a changed
file with the manifest updated to match, since a bundle carries no signature. Nothing here
needs the Docker engine; tests/test_attacks_bundle.py replays tampered bundles for real.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lab.bundle.archive import write_bundle
from lab.bundle.replay import (
    MAX_DIFF_LINES,
    SCRIPT_HEAD_LINES,
    Built,
    discard_replay,
    prepare_replay,
    visible,
)
from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.core.safetar import BundleError
from lab.image.render import render_dockerfile
from lab.image.resolve import resolve
from lab.report.run_folder import resolved_scenario
from lab.scenario.lookup import load_scenario
from tests.conftest import fake_result

REAL_RUN = Path(__file__).resolve().parents[1] / "data" / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"
SCRIPT = "import os\nprint('honest', os.environ.get('N'))\n"
SCENARIO = """\
name: tiny-replay
title: a tiny scenario to bundle
torch: "2.13.0+cpu"
arch: amd64
base: debian:bookworm
system_packages: [g++]
pip: [numpy]
env: {OMP_NUM_THREADS: "2"}
vars: {N: "512"}
script: s.py
timeout: 60
expect:
  stdout_contains: honest
"""


def make_run(folder: Path, script: str = SCRIPT) -> Path:
    """A run folder as `lab run` leaves it: the scenario resolved and rendered by this lab."""
    source = folder / "scenario-src"
    source.mkdir(parents=True)
    (source / "s.py").write_text(script)
    (source / "tiny-replay.yaml").write_text(SCENARIO)
    case = resolve(load_scenario(source / "tiny-replay.yaml"))
    run = folder / "runs" / "tiny-replay" / "20261122T120000Z-torch2.13.0+cpu-amd64"
    (run / "repro").mkdir(parents=True)
    (run / "repro" / "s.py").write_text(script)
    (run / "Dockerfile").write_text(render_dockerfile(case))
    (run / "scenario.yaml").write_text(yaml.safe_dump(resolved_scenario(case, None), sort_keys=False))
    fake_result(case, "reproduced", run, reason="every expectation held").write(run / "result.json")
    (run / "report.md").write_text("# tiny: reproduced\n")
    return run


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(make_run(tmp_path / "made"), tmp_path / "tiny.tar.gz", env={}).path


def tamper(bundle: Path, out: Path, edit: Callable[[dict[str, bytes]], None], *, update_manifest: bool = True) -> Path:
    """Rewrite a bundle with `edit` applied to its files ({relative path: bytes}), and its
    manifest updated to match (sizes, sha256, new files) unless told otherwise."""
    with tarfile.open(bundle) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        root = members[0].name.split("/")[0]
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in members}
    manifest = json.loads(files.pop("bundle.json"))
    edit(files)
    if update_manifest:
        manifest["files"] = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(),
                              "kind": "data" if p.startswith(("out/", "diagnose/")) else "meta"}
                             for p, d in sorted(files.items())]
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [("bundle.json", json.dumps(manifest).encode()), *files.items()]:
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def edit_scenario(change: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def edit(files: dict[str, bytes]) -> None:
        data = yaml.safe_load(files["scenario.yaml"])
        change(data)
        files["scenario.yaml"] = yaml.safe_dump(data, sort_keys=False).encode()
    return edit


def prepare(bundle: Path, tmp_path: Path, **options):
    return prepare_replay(bundle, tmp_path / "runs", Arch.AMD64, **options)


def test_an_untouched_bundle_shows_what_it_will_build(bundle: Path, tmp_path: Path) -> None:
    plan = prepare(bundle, tmp_path)
    try:
        assert plan.case.name == "tiny-replay[torch=2.13.0+cpu,arch=amd64]" and not plan.emulated
        assert plan.dockerfile_same and plan.diff == () and plan.built is Built.RENDERED
        assert plan.rendered.encode() == (plan.unpacked.folder / "Dockerfile").read_bytes()
        assert "from tiny-replay.yaml." in plan.rendered  # the original's provenance line, kept
        assert plan.system_packages == ("g++",) and "python3" in plan.lab_packages
        assert plan.requirements == ("torch==2.13.0+cpu", "numpy")
        assert plan.env == (("N", "512"), ("OMP_NUM_THREADS", "2"))
        assert not plan.network and not plan.gpu
        assert plan.script.name == "s.py" and plan.script.lines == tuple(SCRIPT.splitlines())
        assert plan.script.more_lines == 0 and plan.script.sha256 == hashlib.sha256(SCRIPT.encode()).hexdigest()
        assert plan.original.verdict.value == "reproduced"
        assert plan.scratch.is_dir()
    finally:
        discard_replay(plan)
    assert not (tmp_path / "runs").exists()  # it made the runs folder, and removed it again


def test_discard_keeps_a_runs_folder_that_was_there(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    discard_replay(prepare(bundle, tmp_path))
    assert (tmp_path / "runs").is_dir() and not list((tmp_path / "runs").iterdir())


def test_a_tampered_dockerfile_is_shown_as_a_diff_and_the_rerender_is_built(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files["Dockerfile"] = files["Dockerfile"].replace(b"COPY repro/", b"RUN echo PWNED\nCOPY repro/")
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert not plan.dockerfile_same and plan.built is Built.RENDERED
    assert "-RUN echo PWNED" in plan.diff and "PWNED" not in plan.rendered
    assert plan.diff[0] == "--- bundle: Dockerfile" and plan.diff[1].startswith("+++ this lab")


def test_the_flag_chooses_the_bundled_dockerfile(bundle: Path, tmp_path: Path) -> None:
    plan = prepare(bundle, tmp_path, bundled_dockerfile=True)
    discard_replay(plan)
    assert plan.built is Built.BUNDLED


@pytest.mark.parametrize("trick", ["\r", "\u2028", "\x85", "\x0c"])
def test_line_end_tricks_do_not_pass_for_the_same_dockerfile(bundle: Path, tmp_path: Path, trick: str) -> None:
    """Python's splitlines() splits on more than Docker does: a comparison by lines would take
    `RUN true<U+2028># Rendered by ...; curl evil` for two harmless lines."""
    def edit(files: dict[str, bytes]) -> None:
        text = files["Dockerfile"].decode()
        files["Dockerfile"] = text.replace("WORKDIR /lab/repro", f"WORKDIR /lab/repro{trick}# Rendered by x").encode()
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert not plan.dockerfile_same and plan.diff
    assert all(trick not in line for line in plan.diff)  # shown escaped


def test_a_forged_provenance_line_is_not_copied_into_the_build(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        lines = files["Dockerfile"].decode().split("\n")
        lines[1] = "# Rendered by torch-repro-lab 0.1.0 from x.yaml. \\"
        files["Dockerfile"] = "\n".join(lines).encode()
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert "\\" not in plan.rendered.split("\n")[1] and not plan.dockerfile_same


def test_an_old_labs_bundle_is_rebuilt_with_this_labs_templates(tmp_path: Path) -> None:
    bundle = write_bundle(REAL_RUN, tmp_path / "real.tar.gz", env={}).path
    plan = prepare(bundle, tmp_path)
    discard_replay(plan)
    assert plan.emulated and plan.case.arch is Arch.ARM64
    assert not plan.dockerfile_same and "+COPY tools/ /lab/tools/" in plan.diff
    assert plan.rendered == render_dockerfile(plan.case).replace(
        "from scenario.yaml.", "from libgomp-aarch64.yaml.")


def test_a_long_diff_is_cut_with_a_count(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files["Dockerfile"] += b"".join(b"RUN echo %d\n" % i for i in range(MAX_DIFF_LINES + 50))
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert len(plan.diff) == MAX_DIFF_LINES and plan.diff_cut > 0


def test_the_script_head_is_what_python_reads_and_safe_to_print(bundle: Path, tmp_path: Path) -> None:
    lines = ["# \x1b]0;innocent\x07\x1b[2K looks fine", "x = 1  # \u202e evil \u202c", "\tindented" + "y" * 300]
    lines += [f"print({i})" for i in range(SCRIPT_HEAD_LINES + 5)]

    def edit(files: dict[str, bytes]) -> None:
        files["repro/s.py"] = "\n".join(lines).encode()
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    head = plan.script.lines
    assert len(head) == SCRIPT_HEAD_LINES and plan.script.more_lines == len(lines) - SCRIPT_HEAD_LINES
    assert head[0] == "# \\x1b]0;innocent\\x07\\x1b[2K looks fine"
    assert head[1] == "x = 1  # \\u202e evil \\u202c"
    assert head[2].startswith("    indented") and head[2].endswith("more characters]")
    assert not any(ch in "".join(head) for ch in "\x1b\x07\u202e\t")


def test_a_coding_cookie_cannot_hide_lines(bundle: Path, tmp_path: Path) -> None:
    """In UTF-7, `+AAo-` is a newline: read as UTF-8 the payload would look like one comment."""
    def edit(files: dict[str, bytes]) -> None:
        files["repro/s.py"] = b"# coding: utf-7\n# harmless +AAo-import os+AAo-os.system('boom')\n"
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert plan.script.encoding == "utf-7" and any("utf-7" in note for note in plan.script.notes)
    assert "os.system('boom')" in plan.script.lines


def test_python_line_ends_split_the_script_as_python_does(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files["repro/s.py"] = b"# a comment\rimport os\r\nx = 1\x0cy = 2\n"
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert plan.script.lines == ("# a comment", "import os", "x = 1\\x0cy = 2")


def test_a_script_changed_without_its_manifest_is_refused(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files["repro/s.py"] = b"import os; os.system('boom')\n"
    with pytest.raises(BundleError, match="s.py"):
        prepare(tamper(bundle, tmp_path / "t.tar.gz", edit, update_manifest=False), tmp_path)
    assert not (tmp_path / "runs").exists()


SCENARIO_ATTACKS = {
    "newline in base": (lambda d: d.update(base="debian:bookworm\nRUN echo PWNED"), "base"),
    "unknown key": (lambda d: d.update(evil="yes"), "evil"),
    "newline in a package": (lambda d: d.update(system_packages=["g++\nRUN echo PWNED"]), "system_packages[0]"),
    "pip option": (lambda d: d.update(pip=["--index-url=http://evil/simple"]), "pip[0]"),
    "script outside repro/": (lambda d: d.update(script="../result.json"), "script"),
    "script the bundle lacks": (lambda d: d.update(script="other.py"), "script"),
    "resolved torch": (lambda d: d["resolved"].update(torch="2.13.0+cpu\nRUN echo PWNED"), "resolved.torch"),
    "resolved unknown key": (lambda d: d["resolved"].update(dockerfile="RUN echo PWNED"), "resolved.dockerfile"),
    "resolved backend": (lambda d: d["resolved"].update(backend="evil"), "resolved.backend"),
    "no resolved block": (lambda d: d.pop("resolved"), "resolved"),
    "network": (lambda d: d.update(network=True), "network"),
    "resolved pin with a line": (lambda d: d["resolved"].update(pins=["numpy==1.26.4\nRUN echo PWNED"]),
                                 "resolved.pins"),
    "resolved pin an option": (lambda d: d["resolved"].update(pins=["--index-url=http://evil/simple"]),
                               "resolved.pins"),
    "reserved env": (lambda d: d["env"].update(LD_PRELOAD_X="1", LAB_BACKEND="x"), "env"),
}


@pytest.mark.parametrize("attack", sorted(SCENARIO_ATTACKS))
def test_a_tampered_scenario_is_refused_with_its_file_line_and_field(bundle: Path, tmp_path: Path,
                                                                       attack: str) -> None:
    change, field = SCENARIO_ATTACKS[attack]
    tampered = tamper(bundle, tmp_path / "t.tar.gz", edit_scenario(change))
    with pytest.raises(ScenarioError) as caught:
        prepare(tampered, tmp_path)
    error = caught.value
    assert error.file == f"scenario.yaml in {tampered}"
    assert error.field is not None and error.field.startswith(field), str(error)
    assert error.line is not None or attack == "no resolved block", str(error)
    assert "\n" not in str(error)
    assert not (tmp_path / "runs").exists()


def test_network_is_granted_only_with_allow_network(bundle: Path, tmp_path: Path) -> None:
    tampered = tamper(bundle, tmp_path / "t.tar.gz", edit_scenario(lambda d: d.update(network=True)))
    with pytest.raises(ScenarioError, match="--allow-network"):
        prepare(tampered, tmp_path)
    plan = prepare(tampered, tmp_path, allow_network=True)
    discard_replay(plan)
    assert plan.network and plan.limits.network


def test_a_bundle_without_a_dockerfile_builds_the_rerender(bundle: Path, tmp_path: Path) -> None:
    tampered = tamper(bundle, tmp_path / "t.tar.gz", lambda files: files.pop("Dockerfile"))
    plan = prepare(tampered, tmp_path)
    discard_replay(plan)
    assert plan.bundled is None and plan.built is Built.RENDERED and not plan.dockerfile_same
    with pytest.raises(ScenarioError, match="no Dockerfile"):
        prepare(tampered, tmp_path, bundled_dockerfile=True)


def test_visible_escapes_and_cuts() -> None:
    assert visible("a\tb") == "a   b"
    assert visible("\x1b[31mred\u2066") == "\\x1b[31mred\\u2066"
    assert visible("x" * 10, limit=4) == "xxxx [... 6 more characters]"
    assert visible("ünïcode ✓") == "ünïcode ✓"


def test_a_missing_resolved_torch_names_the_field(bundle: Path, tmp_path: Path) -> None:
    tampered = tamper(bundle, tmp_path / "t.tar.gz", edit_scenario(lambda d: d["resolved"].pop("torch")))
    with pytest.raises(ScenarioError, match=r"field `resolved.torch`: is missing"):
        prepare(tampered, tmp_path)


def test_an_unknown_coding_cookie_is_noted(bundle: Path, tmp_path: Path) -> None:
    def edit(files: dict[str, bytes]) -> None:
        files["repro/s.py"] = b"# coding: no-such-codec \x1b[2K\nprint(1)\n"
    plan = prepare(tamper(bundle, tmp_path / "t.tar.gz", edit), tmp_path)
    discard_replay(plan)
    assert any(note.startswith("Python will refuse it") for note in plan.script.notes)
    assert "\x1b" not in "".join(plan.script.notes + plan.script.lines)


def test_the_pins_a_run_recorded_are_installed_exactly(tmp_path: Path) -> None:
    """A run under `deps: era` records its pins in scenario.yaml's resolved block; the replay pins them."""
    run = make_run(tmp_path / "made")
    data = yaml.safe_load((run / "scenario.yaml").read_text())
    data["deps"] = "era"
    data["resolved"]["pins"] = ["numpy==1.26.4", "typing-extensions==4.10.0"]
    (run / "scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    plan = prepare(write_bundle(run, tmp_path / "era.tar.gz", env={}).path, tmp_path)
    discard_replay(plan)
    assert plan.case.deps == "era" and plan.case.pins == ("numpy==1.26.4", "typing-extensions==4.10.0")
    assert plan.requirements == ("torch==2.13.0+cpu", "numpy", "numpy==1.26.4", "typing-extensions==4.10.0")



def _with_freeze(run: Path, packages: dict[str, str]) -> None:
    """The run's result.json as `lab run` writes it under `deps: latest`: every version it had."""
    data = json.loads((run / "result.json").read_text())
    data["deps"] = {"setting": "latest", "packages": packages}
    (run / "result.json").write_text(json.dumps(data, indent=2))


def test_a_latest_run_is_replayed_with_exactly_the_versions_it_had(tmp_path: Path) -> None:
    """`deps: latest` resolves against today's index; a replay does not: it constrains the same
    requirements to every version the original run's freeze names, and its Dockerfile stays the bundled one."""
    run = make_run(tmp_path / "made")
    _with_freeze(run, {"numpy": "2.2.2", "typing-extensions": "4.12.2"})
    plan = prepare(write_bundle(run, tmp_path / "latest.tar.gz", env={}).path, tmp_path)
    discard_replay(plan)
    assert plan.case.deps == "latest" and plan.case.pins == ()
    assert plan.case.constraints == ("numpy==2.2.2", "typing-extensions==4.12.2")
    assert plan.requirements == ("torch==2.13.0+cpu", "numpy")  # what the scenario asks, as bundled
    assert plan.dockerfile_same


def test_a_pin_the_run_chose_wins_over_its_freeze_and_a_direct_reference_is_not_constrained(tmp_path: Path) -> None:
    run = make_run(tmp_path / "made")
    data = yaml.safe_load((run / "scenario.yaml").read_text())
    data["pip"] = ["numpy", "tiny @ https://example.org/tiny-1.0-py3-none-any.whl"]
    data["resolved"]["pins"] = ["numpy==1.26.4"]
    (run / "scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    _with_freeze(run, {"numpy": "2.2.2", "tiny": "1.0", "six": "1.16.0"})
    plan = prepare(write_bundle(run, tmp_path / "b.tar.gz", env={}).path, tmp_path, allow_source_builds=True)
    discard_replay(plan)
    assert plan.case.pins == ("numpy==1.26.4",) and plan.case.constraints == ("six==1.16.0",)


@pytest.mark.parametrize("packages", [{"numpy": "1.0\nRUN echo PWNED"}, {"numpy": "--index-url=http://evil"},
                                      {"x y": "1.0"}])
def test_a_tampered_freeze_is_refused_naming_result_json(tmp_path: Path, packages: dict[str, str]) -> None:
    run = make_run(tmp_path / "made")
    _with_freeze(run, packages)
    bundle = write_bundle(run, tmp_path / "t.tar.gz", env={}).path
    with pytest.raises(ScenarioError) as caught:
        prepare(bundle, tmp_path)
    assert "result.json" in caught.value.file and caught.value.field.startswith("deps.packages.")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
