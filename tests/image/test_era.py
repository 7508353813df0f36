"""lab.image.era: deps settings, a release's upload time from the index's JSON API, and uv's
resolution as of a cut, against a fake index on 127.0.0.1 serving small wheels with upload times."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import zipfile

import pytest

from lab.core.errors import ScenarioError
from lab.image import era, releases
from lab.image.casekey import content_key
from lab.image.crossinstall import InstallJob, Target, site_key
from lab.image.hostpip import HostPip
from lab.image.resolve import resolve
from tests.conftest import tiny_scenario
from tests.localhttp import QuietHandler, serving, without_proxies

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def wheel(name: str, version: str, requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A pure-Python wheel (py3-none-any), made here."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}_pkg/__init__.py": b"", f"{dist}/METADATA": meta.encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for n, d in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


# name -> [(version, upload time, requires)]
INDEX = {
    "torch": [("2.2.2", "2024-03-27T21:09:22.686579Z", ("numpy",)), ("2.3.0", "2024-04-24T16:00:00Z", ("numpy",))],
    "numpy": [("1.26.4", "2024-02-05T10:00:00Z", ()), ("2.0.0", "2024-06-16T10:00:00Z", ())],
}
WHEELS = {fn: data for name, rows in INDEX.items() for v, _, req in rows for fn, data in [wheel(name, v, req)]}


class Handler(QuietHandler):

    def do_HEAD(self):  # uv asks first (for range requests); no Accept-Ranges: it downloads the wheel
        name = self.path.strip("/").split("/")[-1]
        self.send_response(200 if name in WHEELS else 404)
        self.send_header("Content-Length", str(len(WHEELS.get(name, b""))))
        self.end_headers()

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2 and parts[1] in INDEX:
            files = []
            for version, uploaded, req in INDEX[parts[1]]:
                fn, data = wheel(parts[1], version, req)
                files.append({"filename": fn, "url": f"/files/{fn}", "upload-time": uploaded,
                              "hashes": {"sha256": hashlib.sha256(data).hexdigest()}})
            body = {"meta": {"api-version": "1.1"}, "name": parts[1], "files": files,
                    "versions": [v for v, _, _ in INDEX[parts[1]]]}
            self.send(200, JSON_TYPE, json.dumps(body).encode())
        elif parts[0] == "files" and parts[-1] in WHEELS:
            self.send(200, "application/octet-stream", WHEELS[parts[-1]])
        else:
            self.send(404, "text/plain", b"not found")


@pytest.fixture(scope="module")
def index():
    with serving(Handler) as url:
        yield url + "/simple"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    without_proxies(monkeypatch, tmp_path)


# --- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "canonical"), [
    ("latest", "latest"), ("ERA", "era"), (" era ", "era"), ("2024-04-01", "2024-04-01"),
    ("2024-04-01T12:00:00Z", "2024-04-01T12:00:00Z"), ("2024-04-01T14:00:00+02:00", "2024-04-01T12:00:00Z")])
def test_a_setting_has_one_spelling(given, canonical):
    assert era.parse_deps(given) == canonical


def test_a_yaml_date_is_a_date():
    import datetime
    assert era.parse_deps(datetime.date(2024, 4, 1)) == "2024-04-01"


@pytest.mark.parametrize("bad", ["newest", "2024-13-01", "", 5, "yesterday"])
def test_a_bad_setting_is_refused(bad):
    with pytest.raises(ValueError, match="must be `latest`"):
        era.parse_deps(bad)


def test_the_cut_of_each_setting():
    assert era.cut_of("latest") is None
    assert era.cut_of("2024-04-01") == "2024-04-02T00:00:00Z"           # the end of the day
    assert era.cut_of("era", "2024-03-27T21:09:22.686579Z") == "2024-04-03T21:09:22Z"  # plus a week
    with pytest.raises(era.DepsError, match="no upload time"):
        era.cut_of("era", None)


def test_scenario_field_and_the_command_line_option(tmp_path):
    s = tiny_scenario(tmp_path, 'name: t\ntorch: "2.2.2"\narch: arm64\nbase: debian:bookworm\ndeps: era\n'
                                "expect: {exit_code: 1}\n")
    assert s.deps == "era" and resolve(s).deps == "era" and resolve(s, deps="2024-01-31").deps == "2024-01-31"
    with pytest.raises(ScenarioError, match="--deps"):
        resolve(s, deps="sometime")
    with pytest.raises(ScenarioError, match=r"line 5, field `deps`"):
        tiny_scenario(tmp_path, 'name: t\ntorch: "2.2.2"\narch: arm64\nbase: debian:bookworm\ndeps: soon\n'
                                "expect: {exit_code: 1}\n")


def test_the_setting_and_the_lab_s_pins_are_in_the_content_key_and_latest_keeps_old_keys(tmp_path):
    s = tiny_scenario(tmp_path, 'name: t\ntorch: "2.2.2"\narch: arm64\nbase: debian:bookworm\n'
                                "expect: {exit_code: 1}\n")
    latest, eras = content_key(resolve(s)), content_key(resolve(s, deps="era"))
    assert latest != eras and latest.parts["deps"] != eras.parts["deps"]
    assert "deps" in (eras.differs(latest.digest, latest.parts) or "")
    pinned = content_key(resolve(s, pins=("numpy==1.26.4",)))
    assert pinned.parts["deps"] != latest.parts["deps"]
    # an era's resolved pins are derived from the setting: not a part of the key
    import dataclasses
    case = resolve(s, deps="era")
    assert content_key(dataclasses.replace(case, resolved=("numpy==1.26.4",))) == eras


def test_an_era_install_never_reuses_a_latest_site_tree(tmp_path):
    s = tiny_scenario(tmp_path, 'name: t\ntorch: "2.2.2"\narch: arm64\nbase: debian:bookworm\npip: [numpy]\n'
                                "expect: {exit_code: 1}\n")
    import dataclasses
    case = resolve(s, deps="era")
    target = Target("arm64", "aarch64", "3.11", (2, 36))

    def key(c):
        return site_key(InstallJob(c.requirements, target, HostPip(), False, tmp_path))
    assert key(case) != key(dataclasses.replace(case, resolved=("numpy==1.26.4",)))


# --- the upload time ----------------------------------------------------------------------------
def test_the_upload_time_comes_from_the_json_api(index, tmp_path):
    host = HostPip(index_url=index)
    assert releases.upload_time("torch", "2.2.2", host=host, cache_dir=tmp_path / "c") == "2024-03-27T21:09:22.686579Z"
    assert releases.upload_time("torch", "2.9.9", host=host, cache_dir=tmp_path / "c") is None


def test_a_local_build_takes_its_public_version_s_time(index, tmp_path):
    host = HostPip(index_url=index, find_links=(str(tmp_path / "wheels"),))
    assert releases.upload_time("torch", "2.2.2+cpu", host=host, cache_dir=tmp_path / "c") == \
        "2024-03-27T21:09:22.686579Z"


# --- uv as of a cut -----------------------------------------------------------------------------
def _resolve(index: str, setting: str, torch: str = "2.2.2", host: HostPip | None = None, pip=("numpy",),
             exempt=()):
    return era.resolve_set((f"torch=={torch}", *pip), setting=setting, torch=torch,
                           host=host or HostPip(index_url=index), python="3.11", arch="arm64",
                           platform="aarch64-manylinux_2_36", exempt=exempt)


def test_era_resolves_what_the_index_had_a_week_after_the_release(index):
    found = _resolve(index, "era")
    assert found.pins == ("numpy==1.26.4",)
    assert (found.cut, found.released) == ("2024-04-03T21:09:22Z", "2024-03-27T21:09:22.686579Z")
    assert "--exclude-newer 2024-04-03T21:09:22Z" in found.lock_text("2.2.2")
    assert _resolve(index, "latest").pins == ()          # latest: nothing pinned, today's behaviour
    assert _resolve(index, "2024-07-01").pins == ("numpy==2.0.0",)


def test_torch_itself_resolves_past_a_date_cut(index):
    # torch 2.3.0 was uploaded after 2024-04-01; only numpy is cut
    assert _resolve(index, "2024-04-01", torch="2.3.0").pins == ("numpy==1.26.4",)


def test_a_package_the_lab_pins_is_exempt_from_the_cut(index):
    assert _resolve(index, "era", pip=("numpy==2.0.0",), exempt=("numpy",)).pins == ("numpy==2.0.0",)


def test_nothing_before_the_cut_is_a_clear_error(index):
    with pytest.raises(era.DepsError, match="as of 2024-01-02"):
        _resolve(index, "2024-01-01")


def test_a_find_links_torch_without_upload_time_still_resolves(index, tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    fn, data = wheel("torch", "2.2.2+cpu", ("numpy",))
    (folder / fn).write_bytes(data)
    host = HostPip(index_url=index, find_links=(str(folder),))
    found = _resolve(index, "era", torch="2.2.2+cpu", host=host)
    assert found.pins == ("numpy==1.26.4",) and found.cut == "2024-04-03T21:09:22Z"


def test_no_upload_time_anywhere_asks_for_a_date(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    host = HostPip(index_url=(tmp_path / "empty").as_uri(), find_links=(str(folder),))
    with pytest.raises(era.DepsError, match="give the date|Give the date|no upload time"):
        era.resolve_set(("torch==2.2.2+cpu",), setting="era", torch="2.2.2+cpu", host=host, python="3.11",
                        arch="arm64", platform="aarch64-manylinux_2_36")


def test_a_freeze_is_read_without_torch_and_the_venv_s_tools():
    text = "torch==2.2.2\nnumpy==1.26.4\npip==24.0\nSetuptools==69.0\nJinja2==3.1.3\n# comment\n-e foo\n"
    assert era.freeze_versions(text) == {"jinja2": "3.1.3", "numpy": "1.26.4"}
    assert era.versions_to_pins({"numpy": "1.26.4", "jinja2": "3.1.3"}) == ("jinja2==3.1.3", "numpy==1.26.4")


def test_a_local_venv_with_an_era_seeds_as_of_its_cut_and_never_reuses_a_venv_seeded_today(tmp_path):
    # torch 2.0's Inductor imports pkg_resources, which setuptools 81 removed: the local engine's
    # `uv venv --seed` takes pip and setuptools as of the era's cut, and that cut is part of the venv's key
    import dataclasses

    from lab.image.localenv import probe_python, venv_key
    s = tiny_scenario(tmp_path, 'name: t\ntorch: "2.0.0"\narch: amd64\nbase: debian:bullseye\ndeps: era\n'
                                "expect: {exit_code: 1}\n")
    case = resolve(s)
    interp = probe_python(sys.executable)
    dated = dataclasses.replace(case, deps_cut="2023-03-22T00:00:00Z")
    assert venv_key(dated, HostPip(), interp) != venv_key(case, HostPip(), interp)
    assert venv_key(dataclasses.replace(case, deps="latest"), HostPip(), interp) == venv_key(case, HostPip(), interp)


def test_the_pins_are_resolved_for_the_python_the_engine_makes_the_environment_with(tmp_path, monkeypatch):
    """A bullseye scenario (Python 3.9) run on the local engine, whose venvs are made from the host's
    Python 3.11: its era's pins are resolved for 3.11, where they are installed (torch 2.15.0 has
    no cp39 wheel: resolving for 3.9 failed the run before it started). On a Docker engine
    (environment_python None) the base's Python stays."""
    asked = []

    def resolve_set(requirements, **kw):
        asked.append(kw["python"])
        return era.DepSet("era", "2026-11-04T00:00:00Z", "2026-10-28T00:00:00Z", ("numpy==2.3.4",))

    monkeypatch.setattr(era, "resolve_set", resolve_set)
    s = tiny_scenario(tmp_path, 'name: t\ntorch: "2.0.0"\narch: amd64\nbase: debian:bullseye\ndeps: era\n'
                                "expect: {exit_code: 1}\n")
    case = resolve(s, torch="2.15.0")
    pinned, _ = era.apply(case, HostPip(), python="3.11")
    assert asked == ["3.11"] and pinned.resolved == ("numpy==2.3.4",)
    era.apply(case, HostPip())
    assert asked == ["3.11", "3.9"]
