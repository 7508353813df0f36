"""Tests for lab.scenario: the schema, the YAML loader and its one-paragraph errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.scenario import lookup as scenario_module
from lab.scenario.lookup import default_scenarios_dir, list_scenarios, load_scenario
from lab.scenario.model import KNOWN_RUNTIME_FAMILIES, Expect, Limits, Scenario, parse_size

DATA = Path(__file__).resolve().parents[1] / "data" / "scenarios"
GOOD = DATA / "good"
BAD = DATA / "bad"

# Lines: 1 name, 2 torch, 3 arch, 4 base, 5 script, 6 expect, 7 exit_code; appended keys start at 8.
BASE = """\
name: t
torch: "2.5.1"
arch: amd64
base: debian:bookworm
script: repro.py
expect:
  exit_code: 1
"""


def write(folder: Path, text: str | bytes, name: str = "s.yaml") -> Path:
    """Write a scenario file next to a tiny script `repro.py`."""
    (folder / "repro.py").write_text("raise SystemExit(1)\n")
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def check_error(path: Path, line: int | None, field: str | None, fragment: str) -> ScenarioError:
    """Loading `path` fails with a one-paragraph ScenarioError naming file, line and field."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    err = info.value
    text = str(err)
    assert path.name in text
    assert err.line == line, text
    if line is not None:
        assert re.search(rf"line {line}\b", text), text
    assert err.field == field, text
    if field is not None:
        assert f"field `{field}`" in text, text
    assert fragment in text, text
    assert "\n" not in text and "Traceback" not in text, text
    return err


# --------------------------------------------------------------------------- good files


def test_minimal_loads() -> None:
    s = load_scenario(GOOD / "minimal.yaml")
    assert s.name == "minimal"
    assert s.torch == ("2.5.1",)
    assert s.arch == (Arch.AMD64,)
    assert s.gpu is False and s.timeout == 1200
    assert s.system_packages == () and s.pip == () and s.args == ()
    assert s.env == {} and s.vars == {}
    assert s.script == (GOOD / "repro.py").resolve()
    assert s.source is not None and s.source.name == "minimal.yaml"
    assert s.expect == Expect(exit_code=1)


def test_full_loads() -> None:
    s = load_scenario(GOOD / "full.yaml")
    assert s.torch == ("2.5.1", "2.6.0", "2.13.0+cpu")
    assert s.arch == (Arch.ARM64, Arch.AMD64)
    assert s.base == "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"
    assert s.gpu is True and s.cpu_variant == "minimal"
    assert s.pip == ("numpy>=1.26", "scipy; python_version >= '3.10'")
    # Unquoted scalars under env/vars/args are kept exactly as written.
    assert s.env == {"OMP_NUM_THREADS": "4", "MODE": "010", "VERBOSE": "yes"}
    assert s.vars == {"N": "512", "DTYPE": "float32"}
    assert s.args == ("--size", "512", "--fast")
    assert s.script.is_file() and s.script.name == "full.py"
    assert s.description is not None and s.description.startswith("Two copies")
    assert s.expect.duplicate_runtime == "cublasLt" and s.expect.exit_code == 1


def test_load_by_name_yaml_and_yml() -> None:
    assert load_scenario("minimal", GOOD).name == "minimal"
    assert load_scenario("yml-suffix", GOOD).arch == (Arch.ARM64,)


def test_scenario_is_frozen() -> None:
    s = load_scenario(GOOD / "minimal.yaml")
    with pytest.raises(ValidationError):
        s.timeout = 5  # type: ignore[misc]


def test_numbers_in_env_are_text_programmatically(tmp_path: Path) -> None:
    script = write(tmp_path, BASE).parent / "repro.py"
    s = Scenario(
        name="p", torch="2.5.1", arch="x86_64", base="debian:bookworm", script=script,
        env={"A": 1, "B": True, "C": 1.5}, expect={"exit_code": 0},
    )
    assert s.env == {"A": "1", "B": "true", "C": "1.5"}
    assert s.arch == (Arch.AMD64,)


def test_timestamps_stay_text(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, BASE + "title: 2020-13-45\ndescription: 2024-01-01\n"))
    assert s.title == "2020-13-45" and s.description == "2024-01-01"


# --------------------------------------------------------------------------- bad sample files

BAD_FILES = [
    ("syntax.yaml", 5, None, "mapping values are not allowed here"),
    ("duplicate-key.yaml", 9, "timeout", "duplicate key 'timeout' (first given at line 6)"),
    ("nested-duplicate.yaml", 9, "expect.exit_code", "duplicate key 'exit_code'"),
    ("alias.yaml", 8, None, "anchors and aliases"),
    ("bomb.yaml", 1, None, "anchors and aliases"),
    ("unknown-key.yaml", 2, "torhc", "Did you mean `torch`?"),
    ("wrong-type.yaml", 6, "timeout", "must be a whole number of seconds between 1 and 86400, got 'soon'."),
    ("missing-key.yaml", 2, "base", "required key `base` is missing"),
    ("missing-script.yaml", 5, "script", "'does_not_exist.py' was not found"),
    ("torch-float.yaml", 2, "torch", 'Quote every version: torch: "2.10"'),
    ("not-mapping.yaml", 2, None, "top level must be a mapping"),
    ("empty.yaml", 1, None, "the file is empty"),
    ("pip-torch.yaml", 9, "pip[2]", "must not name torch"),
    ("deep.yaml", 2, None, "nested more than 20 levels"),
]


@pytest.mark.parametrize(("name", "line", "field", "fragment"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_sample_files(name: str, line: int, field: str | None, fragment: str) -> None:
    check_error(BAD / name, line, field, fragment)


# --------------------------------------------------------------------------- bad inline inputs

INLINE = [
    # (id, YAML text, line, field, fragment)
    ("timeout-zero", BASE + "timeout: 0\n", 8, "timeout", "between 1 and 86400, got 0"),
    ("timeout-float", BASE + "timeout: 12.5\n", 8, "timeout", "got 12.5"),
    ("gpu-text", BASE + "gpu: maybe\n", 8, "gpu", "must be true or false"),
    ("pip-block", BASE + "pip:\n  - numpy\n  - scipy>=1\n  - 'not a req!!'\n", 11, "pip[2]",
     "not a valid PEP 508 requirement"),
    ("pip-option", BASE + "pip: [-e .]\n", 8, "pip[0]", "not a valid PEP 508"),
    ("pip-torch-name", BASE + "pip: [Torch]\n", 8, "pip[0]", "must not name torch"),
    ("deb-injection", BASE + 'system_packages: [g++, "curl; rm -rf /"]\n', 8, "system_packages[1]",
     "not a Debian package name"),
    ("deb-type", BASE + "system_packages: g++\n", 8, "system_packages", "list of Debian package names"),
    ("env-reserved", BASE + "env: {LD_DEBUG: libs}\n", 8, "env.LD_DEBUG", "is reserved"),
    ("env-lab", BASE + "env:\n  OK: 1\n  LAB_RUN: x\n", 10, "env.LAB_RUN", "is reserved"),
    ("env-bad-key", BASE + "env:\n  OK: 1\n  bad-key: 2\n", 10, "env.bad-key", "not a valid variable name"),
    ("env-null", BASE + "env:\n  EMPTY:\n", 9, "env.EMPTY", 'Write "" for an empty value.'),
    ("env-list", BASE + "env: [A, B]\n", 8, "env", "must be a mapping of environment variable names"),
    ("vars-list-value", BASE + "vars: {N: [1, 2]}\n", 8, "vars.N", "must be a text, number or boolean"),
    ("vars-reserved", BASE + "vars: {LD_DEBUG_OUTPUT: x}\n", 8, "vars.LD_DEBUG_OUTPUT", "is reserved"),
    ("exit-code-range", BASE.replace("exit_code: 1", "exit_code: 300"), 7, "expect.exit_code",
     "between 0 and 255, or a list of them (any one counts), such as 139 or [134, 139], got 300"),
    ("exit-code-list-range", BASE.replace("exit_code: 1", "exit_code: [134, 300]"), 7, "expect.exit_code",
     "got [134, 300]"),
    ("exit-code-list-empty", BASE.replace("exit_code: 1", "exit_code: []"), 7, "expect.exit_code", "got []"),
    ("exit-code-list-twice", BASE.replace("exit_code: 1", "exit_code: [139, 139]"), 7, "expect.exit_code",
     "lists an exit code twice"),
    ("exit-code-bool", BASE.replace("exit_code: 1", "exit_code: true"), 7, "expect.exit_code", "got True"),
    ("runtime", BASE.replace("exit_code: 1", "duplicate_runtime: libgompp"), 7, "expect.duplicate_runtime",
     "Did you mean libgomp?"),
    ("expect-empty", BASE.replace("  exit_code: 1\n", "  {}\n"), 6, "expect", "gives no condition"),
    ("expect-null", BASE.replace("  exit_code: 1\n", ""), 6, "expect", "must be a mapping with at least one"),
    ("expect-unknown", BASE.replace("exit_code: 1", "exitcode: 1"), 7, "expect.exitcode",
     "Did you mean `exit_code`?"),
    ("expect-empty-text", BASE + "  stdout_contains: ''\n", 8, "expect.stdout_contains", "must not be empty"),
    ("missing-expect", BASE.replace("expect:\n  exit_code: 1\n", ""), 1, "expect",
     "required key `expect` is missing"),
    ("name-slug", BASE.replace("name: t", "name: Bad Name"), 1, "name", "must be a slug"),
    ("name-int", BASE.replace("name: t", "name: 12"), 1, "name", "must be a slug"),
    ("torch-list-float", BASE.replace('torch: "2.5.1"', 'torch: ["2.5.1", 2.6]'), 2, "torch[1]",
     "bare number"),
    ("torch-int", BASE.replace('torch: "2.5.1"', "torch: 2"), 2, "torch", "bare number"),
    ("torch-invalid", BASE.replace('torch: "2.5.1"', "torch: banana"), 2, "torch", "not a valid PEP 440"),
    ("torch-dup", BASE.replace('torch: "2.5.1"', 'torch: ["2.5", "2.5.0"]'), 2, "torch", "twice"),
    ("torch-empty", BASE.replace('torch: "2.5.1"', "torch: []"), 2, "torch", "at least one version"),
    ("torch-block", BASE.replace('torch: "2.5.1"', 'torch:\n  - "2.5.1"\n  - nope'), 4, "torch[1]",
     "not a valid PEP 440"),
    ("arch-unknown", BASE.replace("arch: amd64", "arch: mips"), 3, "arch", "unknown architecture 'mips'"),
    ("arch-dup", BASE.replace("arch: amd64", "arch: [amd64, x86_64]"), 3, "arch", "same architecture twice"),
    ("base-bad", BASE.replace("base: debian:bookworm", "base: debian bookworm; rm -rf /"), 4, "base",
     "Docker image reference"),
    ("upstream-ftp", BASE + "upstream: ftp://example.com/x\n", 8, "upstream", "http(s) URL"),
    ("title-list", BASE + "title: [a]\n", 8, "title", "one-line text, got ['a']"),
    ("cpu-variant-no-gpu", BASE + "cpu_variant: other\n", 8, "cpu_variant", "only applies to gpu: true"),
    ("script-int", BASE.replace("script: repro.py", "script: 42"), 5, "script",
     "file name of the reproduction"),
    ("script-folder", BASE.replace("script: repro.py", "script: ."), 5, "script", "was not found"),
    ("script-long", BASE.replace("script: repro.py", "script: " + "x" * 5000), 5, "script", "xxx... was not"),
    ("args-string", BASE + "args: --n 5\n", 8, "args", "list of command-line arguments"),
    ("args-null-item", BASE + "args: [a, null]\n", 8, "args[1]", "must be a text, number or boolean"),
    ("source-key", BASE + "source: /etc/passwd\n", 8, "source", "set by the loader"),
    ("unknown-top", BASE + "timout: 5\n", 8, "timout", "Did you mean `timeout`?"),
    ("duplicate-top", BASE + "name: again\n", 8, "name", "duplicate key 'name' (first given at line 1)"),
    ("duplicate-env", BASE + "env:\n  A: 1\n  A: 2\n", 10, "env.A",
     "duplicate key 'A' (first given at line 9)"),
    ("anchor", BASE.replace('torch: "2.5.1"', 'torch: &v "2.5.1"') + "title: *v\n", 2, None, "anchors"),
    ("merge-key", BASE + "env: {<<: *x}\n", 8, None, "aliases"),
    ("python-tag", BASE + "title: !!python/object/apply:os.system [ls]\n", 8, "title",
     "unsupported YAML tag"),
    ("custom-tag", BASE + "title: !env HOME\n", 8, "title", "unsupported YAML tag !env."),
    ("binary-tag", BASE + "title: !!binary aGVsbG8=\n", 8, "title", "unsupported YAML tag !!binary."),
    ("set-tag", BASE + "pip: !!set {numpy}\n", 8, "pip", "unsupported YAML tag"),
    ("bad-int-tag", BASE + "timeout: !!int abc\n", 8, "timeout", "cannot be read as int"),
    ("bad-bool-tag", BASE + "gpu: !!bool maybe\n", 8, "gpu", "cannot be read as bool"),
    ("empty-int-tag", BASE + "timeout: !!int\n", 8, "timeout", "cannot be read as int"),
    ("empty-float-tag", BASE + "timeout: !!float ''\n", 8, "timeout", "cannot be read as float"),
    ("huge-int", BASE + "timeout: " + "9" * 5000 + "\n", 8, "timeout", "cannot be read as int"),
    ("complex-key", BASE + "? [a, b]\n: c\n", 8, None, "keys must be plain names"),
    ("tab-indent", BASE.replace("  exit_code: 1", "\texit_code: 1"), 7, None, "invalid YAML"),
    ("unclosed-flow", BASE + "pip: [numpy,\n", 9, None, "invalid YAML"),
    ("two-documents", BASE + "---\nname: x\n", 8, None, "expected a single document"),
    ("top-text", "just some text\n", 1, None, "top level must be a mapping"),
    ("top-list-after-comments", "# c\n\n- a\n", 3, None, "top level must be a mapping"),
    ("blank-file", "", 1, None, "the file is empty"),
    ("control-char", BASE + "title: a\x07b\n", 8, None, "invalid YAML"),
]


@pytest.mark.parametrize(
    ("text", "line", "field", "fragment"), [c[1:] for c in INLINE], ids=[c[0] for c in INLINE]
)
def test_bad_inline(tmp_path: Path, text: str, line: int, field: str | None, fragment: str) -> None:
    check_error(write(tmp_path, text), line, field, fragment)


def test_missing_key_lists_more_problems(tmp_path: Path) -> None:
    text = "name: t\narch: amd64\n"
    err = check_error(write(tmp_path, text), 1, "torch", "required key `torch` is missing")
    assert "more problems after this one" in str(err)


def test_non_utf8(tmp_path: Path) -> None:
    data = BASE.encode().replace(b"arch: amd64", b"arch: amd\xff64")
    check_error(write(tmp_path, data), 3, None, "not valid UTF-8")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, b"\xef\xbb\xbf" + BASE.encode())).name == "t"


def test_file_over_one_mib(tmp_path: Path) -> None:
    text = BASE + "description: " + "x" * (1 << 20) + "\n"
    check_error(write(tmp_path, text), None, None, "larger than 1 MiB")


def test_deep_nesting_in_block_style(tmp_path: Path) -> None:
    text = BASE + "vars:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 30))
    check_error(write(tmp_path, text), 27, None, "nested more than 20 levels")


# --------------------------------------------------------------------------- loader: names and folders


def test_unknown_name_lists_closest_first() -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario("minimall", GOOD)
    text = str(info.value)
    assert "unknown scenario 'minimall'" in text
    listed = text.split("good: ", 1)[1]
    assert listed.startswith("minimal, ") and "full" in listed and "yml-suffix" in listed
    assert "Did you mean minimal?" in text and "\n" not in text


def test_unknown_name_in_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no scenario files"):
        load_scenario("anything", tmp_path)


def test_missing_path_and_folder_path(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError, match="is not a file"):
        load_scenario(tmp_path)


def test_default_dir_is_the_shipped_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # An editable install maps the repository's scenarios/ into the package (lab.scenarios).
    assert default_scenarios_dir().resolve() == Path(__file__).resolve().parents[2] / "scenarios"
    monkeypatch.setattr(scenario_module, "SCENARIOS_DIR", GOOD)
    assert load_scenario("minimal").name == "minimal"


def test_a_list_of_folders_is_searched_in_order(tmp_path: Path) -> None:
    (tmp_path / "repro.py").write_text("")
    (tmp_path / "minimal.yaml").write_text((GOOD / "minimal.yaml").read_text().replace('"2.5.1"', '"2.9.0"'))
    assert load_scenario("minimal", [tmp_path, GOOD]).torch == ("2.9.0",)  # the first folder wins
    assert load_scenario("minimal", [GOOD, tmp_path]).torch == ("2.5.1",)
    assert load_scenario("full", [tmp_path, GOOD]).source == GOOD / "full.yaml"  # found in the second
    assert load_scenario("minimal.yaml", [tmp_path, GOOD]).source.parent == tmp_path
    with pytest.raises(ScenarioError, match=r"available in .* and ") as caught:
        load_scenario("nope", [tmp_path, GOOD])
    assert str(tmp_path) in str(caught.value) and "full" in str(caught.value)


def test_list_scenarios_keeps_going(tmp_path: Path) -> None:
    shutil.copytree(GOOD, tmp_path, dirs_exist_ok=True)
    shutil.copy(BAD / "wrong-type.yaml", tmp_path / "b-wrong.yaml")
    shutil.copy(BAD / "syntax.yaml", tmp_path / "z-syntax.yaml")
    results = list_scenarios(tmp_path)
    kinds = [(r.source.name if isinstance(r, Scenario) else r.file.rsplit("/", 1)[-1]) for r in results]
    assert kinds == ["b-wrong.yaml", "full.yaml", "minimal.yaml", "yml-suffix.yml", "z-syntax.yaml"]
    assert isinstance(results[0], ScenarioError) and results[0].line == 6
    assert isinstance(results[-1], ScenarioError) and results[-1].line == 5
    assert all(isinstance(r, Scenario) for r in results[1:4])


def test_list_scenarios_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot list the scenarios folder"):
        list_scenarios(tmp_path / "absent")


# --------------------------------------------------------------------------- Arch, Expect, with_vars


def test_arch_helpers() -> None:
    assert Arch.AMD64.platform == "linux/amd64" and Arch.ARM64.platform == "linux/arm64"
    assert Arch.AMD64.uname == "x86_64" and Arch.ARM64.uname == "aarch64"
    assert Arch.parse("x86_64") is Arch.AMD64 and Arch.parse("AArch64") is Arch.ARM64
    assert Arch.parse("arm64") is Arch.ARM64 and str(Arch.ARM64) == "arm64"
    with pytest.raises(ValueError, match="unknown architecture"):
        Arch.parse("riscv64")


def test_expect_rules() -> None:
    expected = {"libgomp", "libiomp5", "libomp", "libcuda", "cudart", "cublas", "cublasLt", "cudnn", "nccl",
                "libstdcxx"}
    assert expected == KNOWN_RUNTIME_FAMILIES
    assert Expect(duplicate_runtime="libgomp").duplicate_runtime == "libgomp"
    with pytest.raises(ValidationError):
        Expect()
    with pytest.raises(ValidationError):
        Expect(exit_code=256)


def test_with_vars() -> None:
    s = load_scenario(GOOD / "full.yaml")
    t = s.with_vars({"N": "8192"})
    assert t.vars == {"N": "8192", "DTYPE": "float32"}
    assert s.vars["N"] == "512"  # the original is unchanged
    assert s.with_vars({"N": 3}).vars["N"] == "3"  # type: ignore[dict-item]
    with pytest.raises(ScenarioError) as info:
        s.with_vars({"M": "1"})
    text = str(info.value)
    assert "'M'" in text and "DTYPE, N" in text and info.value.field == "vars.M" and "\n" not in text
    with pytest.raises(ScenarioError, match="Did you mean N"):
        s.with_vars({"n": "1"})


def test_with_vars_no_vars() -> None:
    with pytest.raises(ScenarioError, match="defines: no variables"):
        load_scenario(GOOD / "minimal.yaml").with_vars({"N": "1"})


# --------------------------------------------------------------------------- fuzzing

FRAGMENTS = [
    "name: x\n", "torch: ", '"2.5.1"', "2.10", "arch: ", "amd64", "[", "]", "{", "}", ",", ": ", "- ",
    "\n", "  ", "\t", "&a ", "*a", "!!int ", "!!python/object ", "? ", "---\n", "...\n", "'", '"', "#",
    "|\n", ">\n", "expect:\n  exit_code: ", "script: repro.py\n", "env: {A: ", "vars:\n  N: ", "null",
    "~", "yes", "0x1F", "1e5", "2020-13-45", "<<: ", "%YAML 1.1\n", "\x00", "\ufeff", "é", "\\",
]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "repro.py").write_text("raise SystemExit(1)\n")
    return folder


def load_bytes(folder: Path, data: bytes) -> None:
    """Loading must either succeed or raise a one-paragraph ScenarioError, nothing else."""
    path = folder / "fuzz.yaml"
    path.write_bytes(data)
    try:
        assert isinstance(load_scenario(path), Scenario)
    except ScenarioError as err:
        assert "\n" not in str(err) and "fuzz.yaml" in str(err)


yamlish = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join)


@settings(derandomize=True, max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=yamlish)
def test_fuzz_yamlish_text(fuzz_dir: Path, text: str) -> None:
    load_bytes(fuzz_dir, text.encode("utf-8", "surrogatepass"))


VALID = (GOOD / "full.yaml").read_bytes().replace(b"scripts/full.py", b"repro.py")
mutation = st.tuples(st.sampled_from(["flip", "insert", "delete"]), st.integers(0, len(VALID)),
                     st.integers(0, 255))


@settings(derandomize=True, max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(mutation, min_size=1, max_size=8))
def test_fuzz_byte_mutations(fuzz_dir: Path, mutations: list[tuple[str, int, int]]) -> None:
    data = bytearray(VALID)
    for op, position, byte in mutations:
        at = min(position, max(len(data) - 1, 0))
        if op == "insert":
            data.insert(at, byte)
        elif data and op == "flip":
            data[at] = byte
        elif data:
            del data[at]
    load_bytes(fuzz_dir, bytes(data))


def test_fuzz_baseline_is_valid(fuzz_dir: Path) -> None:
    load_bytes(fuzz_dir, VALID)
    assert load_scenario(fuzz_dir / "fuzz.yaml").name == "full-cuda"


# --------------------------------------------------------------------------- network and limits


def test_network_and_limits_defaults() -> None:
    s = load_scenario(GOOD / "minimal.yaml")
    assert s.network is False
    assert s.limits == Limits() and s.limits.memory == "8g" and s.limits.memory_bytes == 8 << 30
    assert s.limits.pids == 4096 and s.limits.cpus is None


@pytest.mark.parametrize(("extra", "memory", "pids", "cpus"), [
    ("limits: {memory: 512m}\n", 512 << 20, 4096, None),
    ("limits: {memory: 8GiB, pids: 100, cpus: 0.5}\n", 8 << 30, 100, 0.5),
    ("limits: {memory: 2gb, cpus: 2}\n", 2 << 30, 4096, 2.0),
    ("limits: {memory: 1.5g}\n", 3 << 29, 4096, None),
    ("limits: {memory: 1073741824}\n", 1 << 30, 4096, None),
    ("limits:\n  pids: 16\n", 8 << 30, 16, None),
    ("limits:\n", 8 << 30, 4096, None),
])
def test_limits_load(tmp_path: Path, extra: str, memory: int, pids: int, cpus: float | None) -> None:
    limits = load_scenario(write(tmp_path, BASE + extra)).limits
    assert (limits.memory_bytes, limits.pids, limits.cpus) == (memory, pids, cpus)


def test_network_loads(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, BASE + "network: true\n")).network is True


def test_parse_size() -> None:
    assert parse_size("512m") == parse_size("512MiB") == parse_size("512 MB") == 512 << 20
    assert parse_size("8g") == parse_size("8G") == parse_size("8GiB") == 8 << 30
    assert parse_size("1k") == 1024 and parse_size("7") == parse_size(7) == 7 and parse_size("1t") == 1 << 40
    for bad in ("", "g", "8 x", "8gg", "-1g", "1e9", "8 gibibytes", True, None, 1.5):
        with pytest.raises(ValueError):
            parse_size(bad)  # type: ignore[arg-type]


LIMITS_BAD = [
    ("network-int", "network: 1\n", "network", "must be true or false"),
    ("network-text", "network: sometimes\n", "network", "must be true or false"),
    ("memory-bytes-too-small", "limits: {memory: 512}\n", "limits.memory", "Docker refuses less than 6 MiB"),
    ("memory-unit", "limits: {memory: 12x}\n", "limits.memory", "such as 512m, 8g or 8GiB"),
    ("memory-float", "limits: {memory: 1.5}\n", "limits.memory", "got 1.5."),
    ("memory-huge", f"limits: {{memory: {10**100}}}\n", "limits.memory", "more than 1 PiB"),
    ("memory-list", "limits: {memory: [8g]}\n", "limits.memory", "got ['8g']"),
    ("pids-low", "limits: {pids: 8}\n", "limits.pids", "between 16 and 4194304, got 8"),
    ("pids-bool", "limits: {pids: true}\n", "limits.pids", "got True"),
    ("pids-text", "limits: {pids: many}\n", "limits.pids", "got 'many'"),
    ("cpus-zero", "limits: {cpus: 0}\n", "limits.cpus", "greater than 0"),
    ("cpus-nan", "limits: {cpus: .nan}\n", "limits.cpus", "got nan"),
    ("cpus-inf", "limits: {cpus: .inf}\n", "limits.cpus", "got inf"),
    ("cpus-text", "limits: {cpus: '2'}\n", "limits.cpus", "such as 2 or 0.5"),
    ("limits-unknown", "limits: {cpu: 2}\n", "limits.cpu", "Did you mean `cpus`?"),
    ("limits-list", "limits: [8g]\n", "limits", "must be a mapping with any of memory, pids, cpus"),
    ("output-small", "limits: {output: 4k}\n", "limits.output", "from 1 MiB to 1 TiB"),
    ("output-unit", "limits: {output: lots}\n", "limits.output", "got 'lots'"),
    ("logs-huge", "limits: {logs: 1t}\n", "limits.logs", "from 64 KiB to 16 GiB"),
    ("logs-list", "limits: {logs: [1m]}\n", "limits.logs", "got ['1m']"),
    ("ablation-unknown", "ablation: {vai: env}\n", "ablation.vai", "the allowed keys are: via, max_autotune"),
]


def test_output_and_logs_caps(tmp_path: Path) -> None:
    default = load_scenario(GOOD / "minimal.yaml").limits
    assert (default.output_bytes, default.logs_bytes) == (1 << 30, 64 << 20)
    limits = load_scenario(write(tmp_path, BASE + "limits: {output: 16m, logs: 1m}\n")).limits
    assert (limits.output, limits.output_bytes, limits.logs, limits.logs_bytes) == ("16m", 16 << 20, "1m", 1 << 20)


@pytest.mark.parametrize(("extra", "field", "fragment"), [c[1:] for c in LIMITS_BAD],
                         ids=[c[0] for c in LIMITS_BAD])
def test_network_and_limits_errors(tmp_path: Path, extra: str, field: str, fragment: str) -> None:
    check_error(write(tmp_path, BASE + extra), 8, field, fragment)


def test_limits_programmatic() -> None:
    assert Limits(memory=1 << 30).memory == str(1 << 30)
    with pytest.raises(ValidationError):
        Limits(pids=4096, swap="1g")  # type: ignore[call-arg]


# --------------------------------------------------------------------------- YAML bombs


@pytest.mark.timeout(20)
def test_billion_laughs_fails_fast(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 40)]
    err = check_error(write(tmp_path, BASE + "\n".join(lines) + "\n"), 8, None, "anchors and aliases")
    assert "Write the value out in full" in str(err)


@pytest.mark.timeout(20)
def test_alias_without_anchor_and_merge_bomb(tmp_path: Path) -> None:
    check_error(write(tmp_path, BASE + "env: *nowhere\n"), 8, None, "anchors and aliases")
    bomb = BASE + "x: &x {a: 1}\n" + "".join(f"y{i}: {{<<: [*x, *x, *x]}}\n" for i in range(1000))
    check_error(write(tmp_path, bomb), 8, None, "anchors and aliases")


@pytest.mark.parametrize(("extra", "field", "fragment"), [
    ("'[key]': 1\n", "['[key]']", "unknown key '[key]'"),
    ("expect2: {'[key]': 1}\n", "expect2", "unknown key 'expect2'"),
    ("env: {'[key]': x}\n", "env['[key]']", "not a valid variable name"),
])
def test_key_spelt_like_pydantics_marker(tmp_path: Path, extra: str, field: str, fragment: str) -> None:
    """Found by fuzzing: a key written as "[key]" is a key, not pydantic's marker for key errors."""
    check_error(write(tmp_path, BASE + extra), 8, field, fragment)
