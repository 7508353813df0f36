import pytest

from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.image.resolve import Case, base_python, resolve
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS, tiny_scenario


def scenario(name="libgomp-aarch64"):
    return load_scenario(name, SCENARIOS)


def test_defaults_come_from_the_scenario():
    case = resolve(scenario())
    assert (case.torch, case.arch, case.backend) == ("2.5.1", Arch.ARM64, None)
    assert case.name == "libgomp-aarch64[torch=2.5.1,arch=arm64]"
    assert case.requirements == ("torch==2.5.1", "numpy")


def test_set_overrides_a_variable_and_reaches_the_script_environment():
    case = resolve(scenario(), sets={"N": "8192"})
    env = case.run_env()
    assert env["N"] == "8192" and env["OMP_NUM_THREADS"] == "2"
    assert resolve(scenario()).run_env()["N"] == "512"


def test_unknown_variable_is_refused():
    with pytest.raises(ScenarioError, match="N"):
        resolve(scenario(), sets={"M": "1"})


def test_backend_is_passed_as_lab_backend():
    case = resolve(scenario(), backend="aot_eager")
    assert case.run_env()["LAB_BACKEND"] == "aot_eager"
    assert case.name.endswith(",backend=aot_eager]")
    with pytest.raises(ScenarioError, match="backend"):
        resolve(scenario(), backend="tvm")


def test_arch_aliases_and_bad_arch():
    assert resolve(scenario(), arch="x86_64").arch is Arch.AMD64
    with pytest.raises(ScenarioError, match="--arch"):
        resolve(scenario(), arch="sparc")


def test_several_pinned_versions_need_a_choice(tmp_path):
    s = tiny_scenario(tmp_path, 'name: m\ntorch: ["2.5.1", "2.6.0"]\narch: amd64\nbase: debian:bookworm\n'
                                'expect: {exit_code: 0}\n')
    with pytest.raises(ScenarioError, match="--torch"):
        resolve(s)
    assert resolve(s, torch="2.6.0").torch == "2.6.0"


@pytest.mark.parametrize("base, python", [
    ("debian:bookworm", "3.11"), ("debian:12-slim", "3.11"), ("debian:trixie", "3.13"),
    ("nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", "3.10"), ("ubuntu:24.04", "3.12"), ("alpine:3", None)])
def test_base_python(base, python):
    assert base_python(base) == python


def test_wheel_tags_fit_the_image():
    case: Case = resolve(scenario())
    tags = {str(t) for t in case.wheel_tags}
    assert "cp311-cp311-manylinux_2_28_aarch64" in tags and "py3-none-any" in tags
    assert not any("x86_64" in t for t in tags)
