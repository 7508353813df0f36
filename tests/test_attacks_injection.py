"""The attacker's suite, Dockerfile injection: every input that meets a template, tried with line
breaks, quotes, `${}`, backslashes and shell syntax, and a torch release that does not exist.

What must hold: a hostile value is refused with exit 2 and one paragraph before anything is built
(the CLI tests point DOCKER_HOST at a dead socket, so reaching the engine would be exit 3), or it
lands in the Dockerfile quoted, as the exact value, without one instruction more. A Docker-like
parser here (`instructions`) reads the rendered text the way the engine's does. The hypothesis
tests fill each template field with arbitrary text.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.core.errors import ScenarioError
from lab.image.render import dockerfile_fields, render_dockerfile, render_template, template_environment, template_for
from lab.image.resolve import resolve
from lab.scenario.lookup import load_scenario
from tests.conftest import DATA, ROOT, SCENARIOS, run_lab, tiny_scenario
from tests.test_cli import assert_one_paragraph_error

INJECTION = '2.9.0"\nRUN echo INJECTED\nLABEL x="'
HOSTILE = [
    INJECTION,
    "2.9.0\nRUN echo INJECTED",
    "2.9.0\r\nRUN echo INJECTED",
    "2.9.0\u2028RUN echo INJECTED",
    '2.9.0"',
    "2.9.0'",
    "${HOME}",
    "2.9.0${IFS}x",
    "$(id)",
    "`id`",
    "2.9.0\\",
    "2.9.0\\\nRUN echo INJECTED",
    "2.9.0 && echo INJECTED",
    "2.9.0; echo INJECTED",
    "2.9.0\x00",
    "",
]
SHOWN = [repr(v)[:30] for v in HOSTILE]


def dead_engine(tmp_path: Path) -> dict[str, str]:
    """An environment where reaching the engine fails (exit 3): exit 2 proves the refusal came first."""
    return {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}


# --- a Docker-like reading of a Dockerfile ----------------------------------------------------

def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, logical line) for each instruction, split as the engine's parser splits: lines end
    at \\n (a \\r before it is dropped), comment lines are skipped (also inside a continuation), and a
    line ending in a backslash continues on the next."""
    out: list[tuple[str, str]] = []
    current: str | None = None
    for raw in text.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        stripped = line.lstrip()
        if stripped.startswith("#") or (current is None and not stripped):
            continue
        current = line if current is None else current + line
        match = re.search(r"\\[ \t]*$", current)
        if match:
            current = current[:match.start()]
            continue
        out.append((current.split(None, 1)[0].upper(), current))
        current = None
    if current is not None:
        out.append((current.split(None, 1)[0].upper(), current))
    return out


def keywords(text: str) -> list[str]:
    return [k for k, _ in instructions(text)]


def label_value(text: str, key: str) -> str:
    """A LABEL value as the engine reads a double-quoted word: \\", \\\\ and \\$ unescaped; no bare `$`."""
    (line,) = [body for k, body in instructions(text) if k == "LABEL"]
    match = re.search(re.escape(key) + r'=("(?:[^"\\]|\\.)*")', line)
    assert match, (key, line)
    quoted = match.group(1)[1:-1]
    assert not re.search(r"(?<!\\)\$", quoted.replace("\\\\", "")), quoted  # nothing to substitute
    return re.sub(r"\\(.)", r"\1", quoted)


def pip_args(text: str) -> list[str]:
    """The words `pip install` gets, as the shell splits its line of the pip step (which ends in the
    continuation; the step's next line starts with `&& pip freeze`)."""
    (line,) = [ln.lstrip() for ln in text.split("\n") if ln.lstrip().startswith("&& pip install ")]
    assert line.endswith(" \\"), line
    return shlex.split(line.removeprefix("&& pip install ").removesuffix(" \\"))


def arg_value(text: str) -> str:
    """The BASE argument's default as the engine reads an ARG word (a double-quoted one unescaped)."""
    (line,) = [body for k, body in instructions(text) if k == "ARG" and body.split()[1].startswith("BASE=")]
    word = line.split(None, 1)[1].removeprefix("BASE=")
    if not word.startswith('"'):
        assert re.fullmatch(r"[A-Za-z0-9_.:/@+=,-]+", word), word
        return word
    assert word.endswith('"') and not re.search(r"(?<!\\)\$", word[1:-1].replace("\\\\", "")), word
    return re.sub(r"\\(.)", r"\1", word[1:-1])


def cmd(text: str) -> list[str]:
    (line,) = [body for k, body in instructions(text) if k == "CMD"]
    return json.loads(line.split(None, 1)[1])


def honest_case():
    return resolve(load_scenario("libgomp-amd64", SCENARIOS))


HONEST = render_dockerfile(honest_case())


def test_the_reader_sees_the_templates_instructions():
    starts = [line for line in HONEST.splitlines() if re.match(r"[A-Z]+ ", line)]
    assert keywords(HONEST) == [line.split()[0] for line in starts]
    # BASE and SITE (the cross-installed packages' image), then their two stages
    assert keywords(HONEST)[:4] == ["ARG", "ARG", "FROM", "FROM"] and keywords(HONEST)[-1] == "CMD"
    assert arg_value(HONEST) == "debian:bookworm"
    assert label_value(HONEST, "org.torch-repro-lab.torch") == "2.13.0+cpu"
    assert pip_args(HONEST) == ["torch==2.13.0+cpu", "numpy"]
    assert cmd(HONEST) == ["python", "libgomp_aarch64.py"]


# --- --torch and the other versions: resolve and the CLI ---------------------------------------

@pytest.mark.parametrize("value", HOSTILE, ids=SHOWN)
def test_resolve_refuses_a_hostile_torch(value):
    with pytest.raises(ScenarioError, match="--torch"):
        resolve(load_scenario("graph-break-explain", SCENARIOS), torch=value)


@pytest.mark.parametrize("value", ["2.9.0", " 2.9.0 ", "2.13.0+cpu", "2.6.0rc1", "1!2.0", "9.9.9"])
def test_render_takes_any_pep440_version_and_labels_it_exactly(value):
    case = resolve(load_scenario("graph-break-explain", SCENARIOS), torch=value)
    text = render_dockerfile(case)
    assert keywords(text) == keywords(HONEST)
    assert label_value(text, "org.torch-repro-lab.torch") == value.strip()
    assert pip_args(text)[0] == f"torch=={value.strip()}"


ARGV_HOSTILE = [v for v in HOSTILE if "\x00" not in v]  # a NUL cannot be passed in argv


@pytest.mark.parametrize("value", ARGV_HOSTILE, ids=[repr(v)[:30] for v in ARGV_HOSTILE])
def test_lab_render_refuses_a_hostile_torch_and_prints_no_dockerfile(value, tmp_path):
    proc = run_lab("render", "graph-break-explain", "--torch", value)
    assert_one_paragraph_error(proc, "--torch", "PEP 440")
    assert proc.stdout == ""
    assert "INJECTED" not in proc.stdout


@pytest.mark.parametrize("command", [["render"], ["build"], ["run", "--out", "RUNS"],
                                     ["run", "--json", "--out", "RUNS"]])
def test_the_issues_injection_is_refused_by_every_command_before_the_engine(command, tmp_path):
    command = [str(tmp_path / "runs") if word == "RUNS" else word for word in command]
    proc = run_lab(*command, "graph-break-explain", "--torch", INJECTION, env=dead_engine(tmp_path))
    assert_one_paragraph_error(proc, "--torch")
    assert proc.stdout == "" and not (tmp_path / "runs").exists()


def test_a_hostile_version_in_a_matrix_list_is_refused(tmp_path):
    proc = run_lab("run", "libgomp-amd64", "--torch", "2.13.0+cpu,2.9.0\nRUN echo INJECTED", "--out",
                   str(tmp_path / "runs"), env=dead_engine(tmp_path))
    assert_one_paragraph_error(proc, "--torch")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option", ["--from", "--to"])
@pytest.mark.parametrize("value", [INJECTION, "2.5.1;id", "${X}", "2.5.1\\"], ids=["issue", "shell", "var", "bslash"])
def test_bisect_refuses_a_hostile_end_before_the_engine(option, value, tmp_path):
    ends = {"--from": "2.5.1", "--to": "2.6.0", option: value}
    proc = run_lab("bisect", "libgomp-amd64", "--from", ends["--from"], "--to", ends["--to"], "--out",
                   str(tmp_path / "runs"), env=dead_engine(tmp_path))
    assert_one_paragraph_error(proc, option, "PEP 440")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, needle", [
    (["--arch", "amd64\nRUN echo INJECTED"], "--arch"),
    (["--arch", "amd64,arm64\";x"], "--arch"),
    (["--backend", "inductor\nRUN echo INJECTED"], "--backend"),
    (["--backend", "eager\"$(id)"], "--backend"),
    (["--mode", "max-autotune\\\nRUN echo INJECTED"], "--mode"),
])
def test_hostile_arch_backend_and_mode_are_refused_before_the_engine(args, needle, tmp_path):
    proc = run_lab("run", "libgomp-amd64", *args, "--out", str(tmp_path / "runs"), env=dead_engine(tmp_path))
    assert_one_paragraph_error(proc, needle)
    assert not (tmp_path / "runs").exists()


# --- a torch release that does not exist ------------------------------------------------------

@pytest.fixture
def local_index(tmp_path: Path) -> dict[str, str]:
    """Host pip settings with one source only: a file:// simple index that lists torch 2.13.0+cpu
    and 2.5.1 for cp311 x86_64, and 1.12.1 for cp39 only (the check reads file names; no wheel has
    to be there)."""
    page = tmp_path / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    names = ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl",
             "torch-1.12.1-cp39-cp39-manylinux1_x86_64.whl"]
    page.write_text("".join(f'<a href="{n}">{n}</a>\n' for n in names))
    return {"PIP_INDEX_URL": (tmp_path / "simple").as_uri(), "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
            "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home"),
            "LAB_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.parametrize("command", [["build"], ["run", "--json"], ["run", "--torch", "2.13.0+cpu,9.9.9"]])
def test_a_release_that_does_not_exist_is_refused_before_anything_is_built(command, local_index, tmp_path):
    args = [*command, "libgomp-amd64"] + ([] if "--torch" in command else ["--torch", "9.9.9"])
    if command[0] == "run":
        args += ["--out", str(tmp_path / "runs")]
    proc = run_lab(*args, env={**local_index, **dead_engine(tmp_path)})
    assert_one_paragraph_error(proc, "torch 9.9.9 has no x86_64 cp311 wheel", "nearest release is 2.13.0+cpu")
    assert proc.stdout == "" and not (tmp_path / "runs").exists()


def test_a_release_only_an_older_python_has_names_the_base_that_has_it(local_index, tmp_path):
    """torch 1.12.1 has no wheel for bookworm's Python 3.11: the error says which base the lab can
    make has a Python that it has a wheel for (bullseye's 3.9), and the hint how to use it."""
    proc = run_lab("run", "libgomp-amd64", "--torch", "1.12.1", "--out", str(tmp_path / "runs"),
                   env={**local_index, **dead_engine(tmp_path)})
    assert_one_paragraph_error(proc, "torch 1.12.1 has no x86_64 cp311 wheel",
                               "it has wheels for the Python of debian:bullseye (3.9)",
                               "Set `base: debian:bullseye` in the scenario")
    assert not (tmp_path / "runs").exists()
    proc = run_lab("run", "libgomp-amd64", "--torch", "9.9.9", "--out", str(tmp_path / "runs"),
                   env={**local_index, **dead_engine(tmp_path)})
    assert_one_paragraph_error(proc, "torch 9.9.9 has no x86_64 cp311 wheel")
    assert "debian:" not in proc.stderr and "Set `base:" not in proc.stderr


def test_a_public_version_finds_its_local_build_and_render_needs_no_index(local_index, tmp_path):
    from lab.image.builder import check_release
    from lab.image.hostpip import HostPip
    from lab.image.releases import ReleaseError
    host = HostPip(index_url=local_index["PIP_INDEX_URL"])
    check_release(resolve(load_scenario("libgomp-amd64", SCENARIOS), torch="2.13.0"), host)  # pip's == matches +cpu
    check_release(resolve(load_scenario("libgomp-amd64", SCENARIOS), torch="2.5.1"), host)
    with pytest.raises(ReleaseError, match="nearest releases are 2.5.1 and 2.13.0"):
        check_release(resolve(load_scenario("libgomp-amd64", SCENARIOS), torch="2.6.0"), host)
    proc = run_lab("render", "libgomp-amd64", "--torch", "9.9.9", env={**local_index, **dead_engine(tmp_path)})
    assert proc.returncode == 0 and "torch==9.9.9" in proc.stdout


# --- scenario fields and file names -----------------------------------------------------------

BASE_YAML = 'name: probe\ntorch: "2.13.0+cpu"\narch: amd64\nbase: debian:bookworm\nexpect: {exit_code: 0}\n'


def _yaml_with(field: str, value) -> str:
    data = yaml.safe_load(BASE_YAML)
    data[field] = value
    return yaml.safe_dump(data, allow_unicode=True)


@pytest.mark.parametrize("field, value", [
    ("name", "probe\nRUN echo INJECTED"), ("name", 'probe"'), ("name", "${X}"), ("name", "probe\\"),
    ("base", "debian:bookworm\nRUN echo INJECTED"), ("base", "debian:bookworm;id"), ("base", "${BASE}"),
    ("base", 'debian"'), ("base", "debian\\"),
    ("torch", INJECTION), ("torch", "${X}"), ("torch", "2.5.1\\"), ("torch", "2.5.1'"),
    ("system_packages", ["g++\nRUN echo INJECTED"]), ("system_packages", ["g++; id"]),
    ("system_packages", ["$(id)"]), ("system_packages", ['g++"']), ("system_packages", ["g\\+"]),
    ("pip", ["numpy\nRUN echo INJECTED"]), ("pip", ["num\rpy"]), ("pip", ["numpy; id"]),
    ("pip", ["--index-url=http://evil"]),
])
def test_a_hostile_scenario_field_is_refused_at_load_naming_file_line_and_field(field, value, tmp_path):
    (tmp_path / "s.py").write_text("")
    path = tmp_path / "hostile.yaml"
    path.write_text(_yaml_with(field, value) + "script: s.py\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path, SCENARIOS)
    assert err.value.field and err.value.field.split("[")[0] == field and err.value.line
    proc = run_lab("render", str(path))
    assert_one_paragraph_error(proc, "hostile.yaml", field)
    assert proc.stdout == ""


@pytest.mark.parametrize("requirement", [
    'numpy; python_version >= "3.8"',
    "pkg @ https://example.invalid/${HOME}/a\\b.whl",
    "pkg @ https://example.invalid/x'y\"z.whl",
    'pkg[a]>=1; sys_platform == "$(id)"',
])
def test_pip_requirements_with_quotes_vars_and_backslashes_reach_pip_exactly(requirement, tmp_path):
    scenario = tiny_scenario(tmp_path, _yaml_with("pip", [requirement]).replace("script: s.py\n", ""))
    text = render_dockerfile(resolve(scenario))
    assert keywords(text) == keywords(HONEST)
    assert pip_args(text) == ["torch==2.13.0+cpu", requirement]


@pytest.mark.parametrize("name", ["a b.py", "it's.py", 'q"uote.py', "$(id).py", "${HOME}.py", "back\\slash.py",
                                  "ünï.py", "x\\", 'x", "-c", "import os.py', "-c"])
def test_a_script_file_name_reaches_cmd_as_one_json_word(name, tmp_path):
    (tmp_path / name).write_text("")
    path = tmp_path / "s.yaml"
    path.write_text(BASE_YAML + yaml.safe_dump({"script": name}))
    text = render_dockerfile(resolve(load_scenario(path, SCENARIOS)))
    assert keywords(text) == keywords(HONEST)
    assert cmd(text) == ["python", name]


@pytest.mark.parametrize("name", ["x\nRUN echo INJECTED.py", "x\r.py", "x\x1b[31m.py", "x\u2029.py"])
def test_a_script_file_name_with_a_line_break_is_refused(name, tmp_path):
    (tmp_path / name).write_text("")
    path = tmp_path / "s.yaml"
    path.write_text(BASE_YAML + yaml.safe_dump({"script": name}))
    with pytest.raises(ScenarioError, match="control character") as err:
        load_scenario(path, SCENARIOS)
    assert err.value.field == "script"
    assert_one_paragraph_error(run_lab("render", str(path)), "s.yaml", "script", "control character")


def test_a_scenario_file_name_with_a_line_break_is_refused_at_render(tmp_path):
    (tmp_path / "s.py").write_text("")
    path = tmp_path / "x\nRUN echo INJECTED\n.yaml"
    path.write_text(BASE_YAML + "script: s.py\n")
    proc = run_lab("render", str(path))
    assert_one_paragraph_error(proc, "the scenario file's name", "control character")
    assert proc.stdout == ""
    honest = tmp_path / "it's a \"$(file)\" \\.yaml"
    shutil.copy(path, honest)
    proc = run_lab("render", str(honest))
    assert proc.returncode == 0 and keywords(proc.stdout) == keywords(HONEST)


@pytest.mark.parametrize("value", ["512\nRUN echo INJECTED", '"; id; "', "${HOME}", "a\\", "$(id)"])
def test_set_vars_env_and_args_never_reach_the_dockerfile(value, tmp_path):
    scenario = load_scenario("libgomp-amd64", SCENARIOS)
    assert render_dockerfile(resolve(scenario, sets={"N": value})) == HONEST
    changed = scenario.model_copy(update={"env": {"X": value}, "args": (value,)})
    assert render_dockerfile(resolve(changed)) == HONEST


@pytest.mark.docker
def test_a_bundle_whose_resolved_torch_is_hostile_is_refused_before_a_build(tmp_path):
    from lab.bundle.archive import write_bundle
    run = tmp_path / "run"
    shutil.copytree(next((DATA / "run-folders").iterdir()), run)
    data = yaml.safe_load((run / "scenario.yaml").read_text())
    data["resolved"]["torch"] = INJECTION
    (run / "scenario.yaml").write_text(yaml.safe_dump(data))
    bundle = write_bundle(run, tmp_path / "b.tar.gz").path
    proc = run_lab("replay", str(bundle), "--out", str(tmp_path / "runs"), "--yes")  # refused before building
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    error = " ".join(proc.stderr[proc.stderr.index("error:"):].split())  # after replay's progress lines
    assert proc.stderr.count("error:") == 1 and "torch" in error and "PEP 440" in error, proc.stderr
    assert "INJECTED\n" not in proc.stderr and proc.stdout == ""
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


# --- arbitrary text in every template field ---------------------------------------------------

FIELDS = ["case_name", "scenario_file", "scenario_name", "platform", "base", "torch", "arch", "script"]
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
PRINTABLE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20)
QUOTING = st.sampled_from(["\\", '"', "'", "$", "${X}", "$(id)", "`", " ", "&&", ";", "#", "[", "]", "=", "é",
                           '", "', "\\$", "\\\"", " \\"])
BREAKS = st.sampled_from(["\n", "\r", "\\\n", "\t", "\u2028", "\x00", "\x85", "\x1b"])
ANY_TEXT = st.one_of(TEXT, st.lists(st.one_of(QUOTING, PRINTABLE), max_size=8).map("".join),
                     st.lists(st.one_of(QUOTING, BREAKS, PRINTABLE), max_size=8).map("".join))
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow])


def _fields(field: str, value):
    fields = dockerfile_fields(honest_case())
    fields[field] = value
    return fields


def _check_structure(text: str, field: str, value) -> None:
    assert keywords(text) == keywords(HONEST), text
    if field == "torch":
        assert label_value(text, "org.torch-repro-lab.torch") == value
    if field == "scenario_name":
        assert label_value(text, "org.torch-repro-lab.scenario") == value
    if field == "arch":
        assert label_value(text, "org.torch-repro-lab.arch") == value
    if field == "base":
        assert arg_value(text) == value
    if field == "script":
        assert cmd(text) == ["python", value]
    if field == "requirements":
        assert pip_args(text) == list(value)
    if field == "system_packages":
        (apt,) = [b for k, b in instructions(text) if k == "RUN" and "apt-get install" in b]
        assert " ".join(value) in apt


@FUZZ
@given(field=st.sampled_from(FIELDS), value=ANY_TEXT)
def test_any_text_in_a_field_is_refused_or_quoted_without_a_new_instruction(field, value):
    try:
        text = render_template(template_for(honest_case()), _fields(field, value))
    except ScenarioError as err:
        assert "\n" not in str(err)
        return
    _check_structure(text, field, value)


@FUZZ
@given(field=st.sampled_from(["requirements", "system_packages"]), value=st.lists(ANY_TEXT, min_size=1, max_size=4))
def test_any_text_in_a_list_field_is_refused_or_quoted_without_a_new_instruction(field, value):
    try:
        text = render_template(template_for(honest_case()), _fields(field, value))
    except ScenarioError:
        return
    _check_structure(text, field, value)


@FUZZ
@given(field=st.sampled_from(FIELDS + ["requirements", "system_packages"]), value=ANY_TEXT)
def test_the_templates_own_quoting_holds_without_the_field_checks(field, value):
    """Defence in depth: skip `check_fields`; the filters and `finalize` alone keep the structure."""
    fields = _fields(field, [value] if field in ("requirements", "system_packages") else value)
    try:
        text = template_environment().get_template(template_for(honest_case())).render(**fields)
    except ScenarioError as err:
        assert "line break or another control character" in str(err)
        return
    _check_structure(text, field, fields[field])


@pytest.mark.parametrize("value", ["1\nRUN echo INJECTED", "1\r\nRUN x", "1\u2028x", "1\x00"])
def test_a_field_added_to_a_template_later_cannot_add_an_instruction(value):
    """`finalize` checks every expression, whatever its filter: a new, unquoted field is refused too."""
    template = template_environment().from_string("FROM scratch\nLABEL new={{ x }} other={{ x | label }}\n")
    with pytest.raises(ScenarioError, match="line break or another control character"):
        template.render(x=value)
    assert keywords(template.render(x="plain")) == ["FROM", "LABEL"]


def test_every_template_field_is_covered():
    assert set(dockerfile_fields(honest_case())) - {"lab_version", "venv"} == \
        set(FIELDS) | {"requirements", "system_packages"}
    assert (ROOT / "dockerfiles" / "cuda.Dockerfile.j2").read_text().startswith("{% extends")


# --- the engine's own reading -----------------------------------------------------------------

ROUND_TRIP = ['2.13.0+cpu', 'a"b', "$HOME", "${X:-y}", "a\\b", "back\\", "sp ace", "'single'", "$(id)", "`id`",
              'x", "-c", "import os', "é", "\\$", '\\"', "#", "a=b c=d"]


@pytest.mark.docker
def test_the_engine_reads_quoted_values_back_exactly(tmp_path):
    """A FROM-scratch build with the template's filters: every LABEL, the ARG default and CMD's
    array come back from `docker inspect` as the exact values, and nothing else was added."""
    import io
    import tarfile
    import uuid

    import docker
    template = template_environment().from_string(
        "FROM scratch\n"
        "ARG BASE={{ base | word }}\n"
        "LABEL org.torch-repro-lab.managed=\"true\" \\\n"
        "{% for v in values %}      lab.test.v{{ loop.index }}={{ v | label }} \\\n{% endfor %}"
        "      lab.test.base=\"${BASE}\"\n"
        "CMD [\"python\", {{ script | json }}]\n")
    client = docker.from_env()
    tag = f"torch-repro-lab/test-quoting:{uuid.uuid4().hex[:12]}"
    try:
        for value in ROUND_TRIP:
            text = template.render(base=value, values=ROUND_TRIP, script=value)
            assert keywords(text) == ["FROM", "ARG", "LABEL", "CMD"]
            context = io.BytesIO()
            with tarfile.open(fileobj=context, mode="w") as tar:
                info = tarfile.TarInfo("Dockerfile")
                info.size = len(text.encode())
                tar.addfile(info, io.BytesIO(text.encode()))
            context.seek(0)
            client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True)
            config = client.api.inspect_image(tag)["Config"]
            labels = config["Labels"]
            assert [labels[f"lab.test.v{i}"] for i in range(1, len(ROUND_TRIP) + 1)] == ROUND_TRIP
            assert labels["lab.test.base"] == value, text
            assert config["Cmd"] == ["python", value]
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag, force=True)
