import io
import tarfile
from pathlib import Path

import pytest

from lab.hostpip import HostPip
from lab.render import plan_build, render_dockerfile, write_context
from lab.resolve import resolve
from lab.scenario import load_scenario

from .conftest import SCENARIOS


def case(name="libgomp-aarch64", **kw):
    return resolve(load_scenario(name, SCENARIOS), **kw)


def test_render_is_byte_identical_for_the_same_case():
    assert render_dockerfile(case()) == render_dockerfile(case())


def test_torch_layer_comes_before_the_script():
    text = render_dockerfile(case())
    assert text.index("pip install torch==2.5.1") < text.index("COPY repro/")
    assert text.index("apt-get install") < text.index("pip install")
    assert text.rstrip().endswith('CMD ["python", "libgomp_aarch64.py"]')


def test_render_names_the_case_and_the_platform():
    text = render_dockerfile(case(torch="2.6.0", arch="amd64"))
    assert "libgomp-aarch64[torch=2.6.0,arch=amd64]" in text
    assert "--platform linux/amd64" in text
    assert "torch==2.6.0" in text


def test_dockerfile_does_not_depend_on_host_settings(tmp_path: Path):
    ca = tmp_path / "ca.crt"
    ca.write_text("CA")
    a = plan_build(case(), HostPip())
    b = plan_build(case(), HostPip(ca_bundle=ca, index_url="https://mirror.example/simple"))
    assert a.dockerfile == b.dockerfile
    assert a.digest != b.digest  # ... but the context, and so the image, does


def test_requirements_are_shell_quoted(tmp_path: Path):
    yaml_file = tmp_path / "s.yaml"
    (tmp_path / "s.py").write_text("print(1)\n")
    yaml_file.write_text('name: quoting\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
                         'pip: ["numpy<2", "sympy>=1.12; python_version >= \'3.8\'"]\n'
                         'script: s.py\nexpect: {exit_code: 0}\n')
    text = render_dockerfile(resolve(load_scenario(yaml_file, SCENARIOS)))
    assert "'numpy<2'" in text
    assert "'sympy>=1.12; python_version >= '\"'\"'3.8'\"'\"''" in text


def test_context_tar_is_byte_stable_and_sorted():
    plan = plan_build(case(), HostPip())
    first, second = io.BytesIO(), io.BytesIO()
    assert write_context(plan.files, first) == write_context(plan.files, second) == plan.digest
    assert first.getvalue() == second.getvalue()
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert {m.uid for m in tar.getmembers()} == {0} and {m.mtime for m in tar.getmembers()} == {0}
    assert "repro/libgomp_aarch64.py" in names and "Dockerfile" in names


def test_a_local_wheel_travels_in_the_context(tmp_path: Path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    host = HostPip(find_links=(str(tmp_path),))
    names = [f.arcname for f in plan_build(case(torch="2.13.0", arch="amd64"), host).files]
    assert "wheels/" + wheel.name in names
    names = [f.arcname for f in plan_build(case(torch="2.13.0", arch="arm64"), host).files]
    assert "wheels/" + wheel.name not in names


def test_gpu_scenarios_render_here():
    text = render_dockerfile(case("dlpack-cuda"))
    assert "ARG BASE=nvidia/cuda:" in text and "NVIDIA_VISIBLE_DEVICES=all" in text


@pytest.mark.parametrize("name", [p.stem for p in SCENARIOS.glob("*.yaml")])
def test_every_shipped_scenario_renders(name):
    s = load_scenario(name, SCENARIOS)
    for torch in s.torch:
        for arch in s.arch:
            assert "FROM ${BASE}" in render_dockerfile(resolve(s, torch=torch, arch=arch.value))


def test_layers_before_the_script_do_not_depend_on_scenario_or_torch():
    """The apt layer is shared by every scenario with the same packages (it is slow under QEMU)."""
    a = render_dockerfile(case("libgomp-aarch64"))
    b = render_dockerfile(case("dlpack-cpu"))
    upto = "RUN pip install"
    body = lambda t: t[t.index("ARG BASE"):t.index(upto)]  # noqa: E731
    assert body(a) == body(b)
