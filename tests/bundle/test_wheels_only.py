"""A stranger's bundle runs nothing of its own at build time and learns no secret (lab.image.wheelsonly,
lab.image.render's sealed plan, lab.image.builder's sealed build), and the summary shown before a replay
(lab.bundle.replay.limit_lines). Logic only: tests/test_attacks_replay.py replays for real."""

from __future__ import annotations

import os
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

import lab.image.builder as build_module
from lab.bundle.replay import discard_replay, limit_lines
from lab.core.records import BaseImage
from lab.image.builder import OFFLINE, _sealed_networks, build_image
from lab.image.crossinstall import Installed, InstallJob, Locked, Pending
from lab.image.hostpip import HostPip
from lab.image.render import Sealed, plan_build
from lab.image.resolve import resolve
from lab.image.wheelsonly import SourceBuildError, direct_references, reference_kind
from lab.scenario.lookup import load_scenario
from tests.bundle.test_replay import bundle as bundle  # noqa: F401  (the fixture)
from tests.bundle.test_replay import edit_scenario, prepare, tamper
from tests.conftest import LAB, ROOT
from tests.image.test_buildsecret import CREDENTIALED, TOKEN, FakeEngine

FORMS = {
    "evil @ https://evil.example/evil-1.0.tar.gz": "a direct URL",
    "evil @ https://evil.example/evil-1.0-py3-none-any.whl": "a direct URL",  # a wheel, but not from your index
    "evil @ http://127.0.0.1:8000/evil-1.0.tar.gz": "a direct URL",
    "evil @ git+https://github.com/evil/evil@main": "a VCS reference",
    "evil @ hg+https://hg.example/evil": "a VCS reference",
    "evil @ file:///tmp/evil": "a local path",
    "evil @ file:///tmp/evil-1.0-py3-none-any.whl": "a local path",
}
WHEELS = ("numpy", "numpy>=1.26", "numpy[dev]>=1.26; python_version >= '3.9'", "sympy===1.13.3")


@pytest.mark.parametrize("requirement", sorted(FORMS))
def test_each_form_that_is_not_an_index_requirement_is_named(requirement):
    assert reference_kind(requirement) == FORMS[requirement]


@pytest.mark.parametrize("requirement", WHEELS)
def test_index_requirements_are_accepted(requirement):
    assert reference_kind(requirement) is None and direct_references((requirement,)) == ()


# --------------------------------------------------------------------------- prepare: the bundle's pip list


@pytest.mark.parametrize("requirement", sorted(FORMS))
def test_a_bundle_naming_one_is_refused_before_anything_unless_the_flag(bundle, tmp_path, requirement):  # noqa: F811
    evil = tamper(bundle, tmp_path / "evil.tar.gz", edit_scenario(lambda d: d.update(pip=["numpy", requirement])))
    with pytest.raises(SourceBuildError) as info:
        prepare(evil, tmp_path)
    text = str(info.value)
    assert text.startswith(f"scenario.yaml in {evil}, line ") and "field `pip[1]`" in text
    assert repr(requirement) in text and FORMS[requirement] in text and "--allow-source-builds" in text
    assert "\n" not in text
    assert not (tmp_path / "runs").exists()  # nothing left behind
    plan = prepare(evil, tmp_path, allow_source_builds=True)
    try:
        assert plan.allow_source_builds
        assert [(r.requirement, r.kind) for r in plan.source_requirements] == [(requirement, FORMS[requirement])]
    finally:
        discard_replay(plan)


def test_a_bundle_of_index_requirements_prepares(bundle, tmp_path):  # noqa: F811
    plan = prepare(bundle, tmp_path)
    try:
        assert plan.source_requirements == () and not plan.allow_source_builds
    finally:
        discard_replay(plan)


# --------------------------------------------------------------------------- the sealed plan


def wheel(folder: Path, name: str, version: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}-{version}.dist-info/METADATA",
                     f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def installer_needing_setuptools(job: InstallJob, prefix: Path) -> Installed:
    """What uv leaves for torch >= 2.10: its dist-info requires a setuptools newer than the venv's;
    requirements named sdist-only* have no wheel."""
    info = prefix / "lib" / "python3.11" / "site-packages" / "torch-2.13.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n"
                                   "Requires-Dist: setuptools>=77.0.3\nRequires-Dist: filelock\n")
    pending = tuple(Pending(r, "no usable wheels", "no_wheel") for r in job.requirements if r.startswith("sdist-only"))
    return Installed((Locked("torch", "2.13.0"),), pending, "fake")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAB_CROSS_INSTALL", raising=False)
    return tmp_path / "cache"


def amd64_case(tmp_path: Path, pip: str = "[numpy]"):
    (tmp_path / "s.py").write_text("print('x')\n")
    (tmp_path / "c.yaml").write_text(f'name: c\ntorch: "2.13.0+cpu"\narch: amd64\nbase: debian:bookworm\n'
                                     f"pip: {pip}\nscript: s.py\nexpect: {{exit_code: 0}}\n")
    return resolve(load_scenario(tmp_path / "c.yaml"))


def context(plan) -> dict[str, bytes]:
    return {f.arcname: (f.data if f.data is not None else f.source.read_bytes())
            for f in plan.files if hasattr(f, "data")}


def test_a_sealed_plan_installs_host_wheels_only_with_no_index_in_the_image(cache, tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, "setuptools", "80.9.0")
    host = HostPip(index_url=CREDENTIALED.index_url, find_links=(str(links),))
    case = amd64_case(tmp_path)
    plan = plan_build(case, host, installer=installer_needing_setuptools, sealed=Sealed(scenario_file="b"))
    files = context(plan)
    conf = files["lab/pip.conf"].decode()
    assert "no-index = true" in conf and "find-links = /lab/wheels" in conf
    assert "mirror.example" not in conf and TOKEN not in conf  # no index at all, let alone its credentials
    assert "wheels/setuptools-80.9.0-py3-none-any.whl" in files  # what the venv needs newer, as a host wheel
    assert plan.sealed == Sealed(scenario_file="b")
    # the user's own run: today's pip.conf with the index, no sealing
    own = plan_build(case, host, installer=installer_needing_setuptools)
    own_conf = context(own)["lab/pip.conf"].decode()  # lab run's: the index is a secret URL (issue 33), counted
    assert own.sealed is None and "1 index URL(s) of the host are secrets" in own_conf and TOKEN not in own_conf


def test_an_sdist_only_requirement_is_refused_unless_the_flag(cache, tmp_path):
    case = amd64_case(tmp_path, "[numpy, sdist-only-thing]")
    with pytest.raises(SourceBuildError) as info:
        plan_build(case, HostPip(), installer=installer_needing_setuptools,
                   sealed=Sealed(scenario_file="scenario.yaml in b.tar.gz"))
    text = str(info.value)
    assert text.startswith("scenario.yaml in b.tar.gz, field `pip`:") and "sdist-only-thing (no usable wheels)" in text
    assert "--allow-source-builds" in text and "Nothing was built." in text
    plan = plan_build(case, HostPip(), installer=installer_needing_setuptools, sealed=Sealed(source_builds=True))
    assert "no-index" not in context(plan)["lab/pip.conf"].decode()  # pip in the image may use the index


def test_nothing_resolved_on_the_host_is_refused(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CROSS_INSTALL", "0")
    with pytest.raises(SourceBuildError, match="cross_install is off"):
        plan_build(amd64_case(tmp_path), HostPip(), sealed=Sealed())


# --------------------------------------------------------------------------- the sealed build's network


def base_for(case, with_packages: bool) -> BaseImage:
    from lab.image.base import bootstrap_tag
    from lab.image.render import system_packages
    if with_packages:
        return BaseImage("debian:bookworm", bootstrap_tag("bookworm", case.arch, system_packages(case)), "sha256:b",
                         "bootstrapped")
    return BaseImage("debian:bookworm", "debian:bookworm", "sha256:b", "local")


def test_a_sealed_build_has_no_network_but_where_a_step_needs_it(cache, tmp_path):
    case = amd64_case(tmp_path, "[numpy, sdist-only-thing]")
    sealed = plan_build(case, HostPip(), installer=installer_needing_setuptools, sealed=Sealed(source_builds=True))
    quiet = lambda *_: None  # noqa: E731
    wheels_only = replace(sealed, sealed=Sealed())
    # a base the lab bootstrapped with the packages: no apt, no pip: no network anywhere
    assert _sealed_networks(wheels_only, base_for(case, True), True, quiet) == (OFFLINE, OFFLINE)
    # a base without them: the lab's system-packages step gets the default network, the rest none
    assert _sealed_networks(wheels_only, base_for(case, False), True, quiet) == (None, OFFLINE)
    # --allow-source-builds with something left to pip: that step gets the default network, never "host"
    assert _sealed_networks(sealed, base_for(case, True), True, quiet) == (OFFLINE, None)
    # a bundle's own Dockerfile: no network at all, even with the flag
    bundled = replace(sealed, sealed=Sealed(rendered=False, source_builds=True))
    assert _sealed_networks(bundled, base_for(case, False), True, quiet) == (OFFLINE, OFFLINE)
    assert _sealed_networks(bundled, base_for(case, False), False, quiet) == (OFFLINE, OFFLINE)


def test_a_sealed_build_gets_no_credentials_and_no_proxy_password(cache, tmp_path, monkeypatch):
    host = replace(CREDENTIALED, proxies=(("HTTPS_PROXY", f"http://user:{TOKEN}@proxy.example:3128"),))
    case = amd64_case(tmp_path)
    monkeypatch.setattr(build_module, "ensure_base",
                        lambda engine, ref, arch, events, packages=(): base_for(case, False))
    plan = replace(plan_build(case, host, installer=None), sealed=Sealed(source_builds=True))  # unstacked: one build
    engine = FakeEngine()
    build_image(plan, engine, host, log_path=tmp_path / "build.log")
    (call,) = engine.calls
    assert call["network_mode"] is None and call["served"] is None  # the default network; no one-shot pip.conf
    assert build_module.PIP_CONF_URL_ARG not in call["buildargs"]
    assert call["buildargs"] == {"HTTPS_PROXY": "http://proxy.example:3128"}  # the proxy, without its password
    assert TOKEN not in repr(call)
    engine = FakeEngine()
    build_image(replace(plan, sealed=Sealed(rendered=False)), engine, host)
    assert engine.calls[0]["network_mode"] == OFFLINE and engine.calls[0]["buildargs"] == {}
    # the user's own run keeps today's behaviour: the credentials through the one-shot URL, host network
    engine = FakeEngine()
    build_image(replace(plan, sealed=None), engine, host)
    assert engine.calls[0]["network_mode"] == "host" and TOKEN in engine.calls[0]["served"]


# --------------------------------------------------------------------------- the summary


def test_every_limit_is_shown_and_none_is_marked_at_the_defaults(bundle, tmp_path):  # noqa: F811
    plan = prepare(bundle, tmp_path)
    try:
        lines = {line.name: line for line in limit_lines(plan)}
    finally:
        discard_replay(plan)
    assert list(lines) == ["memory", "pids", "CPUs", "timeout", "/out copied", "stdout, stderr", "network"]
    assert lines["memory"].value == "8 GiB" and lines["pids"].value == "4096"
    assert lines["CPUs"].value == "all of the engine's" and lines["timeout"].value == "60 s"
    assert lines["/out copied"].value == "up to 1 GiB and 100000 files"
    assert lines["stdout, stderr"].value == "kept up to 64 MiB each" and lines["network"].value == "no"
    assert all(line.above is None for line in lines.values())


def test_raised_limits_are_marked_above_the_default(bundle, tmp_path):  # noqa: F811
    raised = tamper(bundle, tmp_path / "raised.tar.gz", edit_scenario(lambda d: d.update(
        timeout=86400, network=True, limits={"memory": "64g", "pids": 100000, "cpus": 2, "output": "1t",
                                             "logs": "16g"})))
    plan = prepare(raised, tmp_path, allow_network=True)
    try:
        lines = {line.name: line for line in limit_lines(plan)}
    finally:
        discard_replay(plan)
    assert (lines["memory"].value, lines["memory"].above) == ("64 GiB", "8 GiB")
    assert (lines["pids"].value, lines["pids"].above) == ("100000", "4096")
    assert (lines["timeout"].value, lines["timeout"].above) == ("86400 s", "1200 s")
    assert (lines["/out copied"].value, lines["/out copied"].above) == ("up to 1024 GiB and 100000 files", "1 GiB")
    assert (lines["stdout, stderr"].value, lines["stdout, stderr"].above) == ("kept up to 16 GiB each", "64 MiB")
    assert lines["network"].value.startswith("YES") and lines["network"].above == "no network"
    assert (lines["CPUs"].value, lines["CPUs"].above) == ("2", None)  # the default is every core


# --------------------------------------------------------------------------- the real CLI, without a terminal


def run_replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LAB, "replay", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "400"})


@pytest.mark.docker  # it connects to the engine (for its arch) and must build nothing there
@pytest.mark.parametrize("extra", [(), ("--bundled-dockerfile",)])
def test_without_a_terminal_and_without_yes_replay_refuses_and_builds_nothing(bundle, tmp_path, extra):  # noqa: F811
    raised = tamper(bundle, tmp_path / "raised.tar.gz", edit_scenario(lambda d: d.update(limits={"output": "1t"})))
    runs = tmp_path / "runs"
    proc = run_replay(str(raised), "--out", str(runs), *extra)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    said = proc.stderr[proc.stderr.index("no terminal to ask on"):].strip()
    assert "\n\n" not in said and "--yes" in said and "nothing was built or run" in said
    summary = " ".join(proc.stderr[:proc.stderr.index("no terminal to ask on")].split())
    for shown in ("memory 8 GiB", "pids 4096", "CPUs all of the engine's", "timeout 60 s", "network no",
                  "/out copied up to 1024 GiB and 100000 files (above this lab's default 1 GiB)",
                  "stdout, stderr kept up to 64 MiB each"):
        assert shown in summary, (shown, summary)
    assert not runs.exists() or not [p for p in runs.rglob("*") if p.is_file()]  # nothing was made
    assert "building" not in proc.stderr


def test_the_cli_marks_above_default_values_in_bold_red():
    from rich.console import Console

    import lab.cli.replay as cli
    from lab.bundle.replay import LimitLine
    console = Console(record=True, force_terminal=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115
    saved, cli.err = cli.err, console
    try:
        cli._limit_row(LimitLine("/out copied", "up to 1024 GiB and 100000 files", "1 GiB"))
        cli._limit_row(LimitLine("memory", "8 GiB"))
    finally:
        cli.err = saved
    text = console.export_text(styles=True)
    assert "\x1b[1;31mup to 1024 GiB and 100000 files (above this lab's default 1 GiB)" in text
    assert "memory           8 GiB" in text and "\x1b[1;31m8 GiB" not in text



def test_a_complete_host_tree_gives_the_same_context_as_the_users_own_run(cache, tmp_path):
    from tests.image.test_crossinstall import fake_installer  # a tree that needs nothing of pip in the image
    case = amd64_case(tmp_path)
    sealed = plan_build(case, CREDENTIALED, installer=fake_installer, sealed=Sealed())
    own = plan_build(case, CREDENTIALED, installer=fake_installer)
    assert sealed.digest == own.digest and sealed.sealed is not None  # a replay reuses the user's image


def test_with_the_flag_a_direct_reference_is_not_fetched_on_the_host(cache, tmp_path):
    def no_uv(job, prefix):
        raise AssertionError("uv would fetch the bundle's URL on this host")
    case = amd64_case(tmp_path, '[numpy, "evil @ http://127.0.0.1:9/evil-1.0.tar.gz"]')
    plan = plan_build(case, HostPip(), installer=no_uv, sealed=Sealed(source_builds=True))
    assert plan.site.root is None and "does not fetch" in plan.notes[0]
    assert plan.pip_in_image == case.requirements  # pip inside the build, with the default network
