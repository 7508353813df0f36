"""tests/cpu_torch.py: which amd64 CPU torch the end-to-end tests pin, on any machine."""

from __future__ import annotations

import pytest

from tests import cpu_torch
from tests.cpu_torch import PYTORCH_CPU_INDEX, cpu_wheel_versions, pick

WHEEL = "torch-{}-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.fixture(autouse=True)
def _no_pip_conf(monkeypatch):
    """Only the environment each test gives: not this host's pip.conf files."""
    monkeypatch.setattr("lab.core.pipconf.config_files", lambda env: [])


def no_index():
    return None


def folder(tmp_path, *names):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_a_cpu_wheel_in_the_pip_find_links_folder_wins_with_nothing_to_add(tmp_path):
    links = folder(tmp_path / "w", WHEEL.format("2.13.0+cpu"), WHEEL.format("2.15.0"),  # 2.15.0: the CUDA build
                   "torch-2.15.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",         # another Python
                   "torch-2.14.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl")        # another arch
    torch = pick({"PIP_FIND_LINKS": str(links)}, fetch_index=no_index)
    assert (torch.version, torch.arch, torch.cuda_build, torch.missing) == ("2.13.0+cpu", "amd64", False, None)
    assert dict(torch.env) == {} and str(links) in torch.source
    assert torch.header == "torch: '2.13.0+cpu'\narch: amd64\n"
    assert torch.args == ("--torch", "2.13.0+cpu", "--arch", "amd64")


def test_a_folder_without_a_cpu_wheel_falls_through_to_pytorchs_cpu_index(tmp_path):
    links = folder(tmp_path / "w", WHEEL.format("2.13.0"), "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    page = "".join(f'<a href="/whl/cpu/{WHEEL.format(v)}#sha256=00">x</a>' for v in ("2.9.0+cpu", "2.10.0+cpu"))
    torch = pick({"PIP_FIND_LINKS": str(links), "PIP_EXTRA_INDEX_URL": "https://mirror/simple"},
                 fetch_index=lambda: page)
    assert torch.version == "2.10.0+cpu" and torch.source == PYTORCH_CPU_INDEX
    assert torch.env == {"PIP_EXTRA_INDEX_URL": f"https://mirror/simple {PYTORCH_CPU_INDEX}"}


def test_a_uv_find_links_folder_is_handed_to_the_lab(tmp_path):
    links = folder(tmp_path / "uv", WHEEL.format("2.12.0+cpu"))
    torch = pick({"UV_FIND_LINKS": str(links), "PIP_FIND_LINKS": "/elsewhere"}, fetch_index=no_index)
    assert torch.version == "2.12.0+cpu" and torch.env == {"PIP_FIND_LINKS": f"/elsewhere {links}"}


def test_a_file_simple_index_counts_as_a_local_source(tmp_path):
    project = tmp_path / "simple" / "torch"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="../../{WHEEL.format("2.13.0+cpu")}">w</a>')
    folder(tmp_path, WHEEL.format("2.13.0+cpu"))
    torch = pick({"PIP_EXTRA_INDEX_URL": (tmp_path / "simple").as_uri()}, fetch_index=no_index)
    assert torch.version == "2.13.0+cpu" and torch.env == {}


def test_versions_are_ordered_as_versions_not_as_text():
    names = [WHEEL.format(v) for v in ("2.9.0+cpu", "2.10.0+cpu", "2.13.0+cpu", "2.13.0+cu128", "2.2.2+cpu")]
    assert [str(v) for v in cpu_wheel_versions(names)] == ["2.13.0+cpu", "2.10.0+cpu", "2.9.0+cpu", "2.2.2+cpu"]
    assert cpu_wheel_versions(["not-a-wheel.txt", "torch-2.1.whl"]) == []


def test_nothing_found_says_what_was_looked_for_and_last_resorts_are_opt_in(tmp_path):
    empty = folder(tmp_path / "w")
    missing = pick({"PIP_FIND_LINKS": str(empty)}, fetch_index=no_index)
    assert missing.missing and str(empty) in missing.missing and PYTORCH_CPU_INDEX in missing.missing
    assert "did not answer" in missing.missing
    assert "none is named" in pick({}, fetch_index=no_index).missing
    cuda = pick({}, fetch_index=no_index, cuda_ok=True)
    assert cuda.cuda_build and cuda.arch == "amd64" and "+" not in cuda.version and cuda.missing is None
    arm = pick({}, fetch_index=no_index, arm64_ok=True)
    assert arm.arch == "arm64" and cpu_torch.version_at_least(arm, "2.0") and not cpu_torch.version_at_least(
        arm, "2.11")


def test_the_fixture_skips_here_but_fails_in_ci():
    """The `cpu_torch` fixture's rule, as a function: skip outside CI, fail in CI."""
    from tests.conftest import require_cpu_torch
    missing = cpu_torch.CpuTorch("2.13.0+cpu", missing="no amd64 CPU torch found: looked for X")
    with pytest.raises(pytest.skip.Exception, match="looked for X"):
        require_cpu_torch(missing, {})
    with pytest.raises(pytest.fail.Exception, match="looked for X"):
        require_cpu_torch(missing, {"CI": "1"})
    there = cpu_torch.CpuTorch("2.13.0+cpu")
    assert require_cpu_torch(there, {"CI": "1"}) is there
