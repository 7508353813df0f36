from lab.image.resolve import resolve
from lab.report.run_folder import collect_env_facts, scenario_ref
from lab.scenario.lookup import load_scenario
from tests.conftest import DATA, SCENARIOS


def test_collect_env_facts_from_a_real_record():
    facts = dict(collect_env_facts((DATA / "collect_env" / "torch2.5.1-arm64-qemu.txt").read_text()))
    assert facts["Python version"].startswith("3.11.2")
    assert facts["OS"] == "Debian GNU/Linux 12 (bookworm) (aarch64)"
    assert facts["Libc version"] == "glibc-2.36"
    assert "CUDA runtime version" not in facts  # "No CUDA" is not a fact worth a line


def test_collect_env_facts_tolerate_garbage():
    assert collect_env_facts("") == []
    assert collect_env_facts("Could not collect\nPython version: Could not collect\n:::") == []


def test_rerun_command_names_shipped_scenarios_by_name_and_others_by_their_files_name():
    assert scenario_ref(resolve(load_scenario("libgomp-aarch64", SCENARIOS))) == "libgomp-aarch64"
    other = DATA / "e2e" / "sleeper.yaml"
    assert scenario_ref(resolve(load_scenario(other, SCENARIOS))) == "sleeper.yaml"  # never the user's path
