"""The content key of a case (lab.image.casekey): every ingredient of a run changes it, cosmetic edits
of the YAML do not, and a recorded key that differs is explained by the parts that changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab.image import render
from lab.image.casekey import PARTS, content_key
from lab.image.resolve import resolve
from lab.scenario.lookup import load_scenario

YAML = """\
name: keyed
title: a title
torch: ["2.4.0", "2.5.1"]
arch: [arm64, amd64]
base: debian:bookworm
system_packages: [g++, python3-dev]
pip: [numpy]
env: {OMP_NUM_THREADS: "4"}
vars: {N: "512"}
script: s.py
args: [--size, "512"]
timeout: 600
limits: {memory: 8g}
expect:
  traceback_contains: "boom"
  exit_code: 1
"""


def key_of(tmp_path: Path, yaml: str = YAML, script: str = "print(1)\n", *, torch="2.5.1", arch="arm64",
           backend=None, mode=None, sets=None, folder: str = "a"):
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    (where / "s.py").write_text(script)
    (where / "keyed.yaml").write_text(yaml)
    scenario = load_scenario(where / "keyed.yaml")
    return content_key(resolve(scenario, torch=torch, arch=arch, backend=backend, mode=mode, sets=sets))


def changed_parts(a, b) -> set[str]:
    return {name for name in PARTS if a.parts[name] != b.parts[name]}


def test_the_same_case_has_the_same_key_wherever_the_file_is(tmp_path):
    a, b = key_of(tmp_path), key_of(tmp_path, folder="elsewhere")
    assert a == b and len(a.digest) == 64 and set(a.parts) == set(PARTS)
    assert a.differs(b.digest, b.parts) is None


@pytest.mark.parametrize("edit", [
    "# a comment\n" + YAML.replace("timeout: 600", "timeout: 600   # ten minutes"),
    YAML.replace("title: a title", "title: another title\ndescription: words\nupstream: https://github.com/x/y/issues/1"),
    YAML.replace("limits: {memory: 8g}", "limits: {memory: 8GiB}"),
    YAML.replace("exit_code: 1", "exit_code: [1]"),
    YAML.replace('  traceback_contains: "boom"\n  exit_code: 1\n', '  exit_code: 1\n  traceback_contains: boom\n'),
    YAML.replace("system_packages: [g++, python3-dev]", "system_packages: [python3-dev, g++]"),
    YAML.replace('torch: ["2.4.0", "2.5.1"]', 'torch: ["2.5.1", "2.6.0"]'),  # the case picks 2.5.1 either way
    # the key order of the whole file
    "\n".join(reversed(YAML.split("expect:")[0].splitlines())) + "\nexpect:" + YAML.split("expect:")[1],
], ids=["comments", "title-description-upstream", "memory-spelling", "exit-code-list", "expect-order",
        "package-order", "other-pinned-versions", "key-order"])
def test_cosmetic_edits_keep_the_key(tmp_path, edit):
    assert key_of(tmp_path, edit, folder="edited") == key_of(tmp_path)


@pytest.mark.parametrize(("edit", "part"), [
    (dict(yaml=YAML.replace('traceback_contains: "boom"', 'traceback_contains: "bang"')), "expect"),
    (dict(yaml=YAML.replace("exit_code: 1", "exit_code: [1, 139]")), "expect"),
    (dict(script="print(2)\n"), "script"),
    (dict(sets={"N": "1024"}), "vars"),
    (dict(yaml=YAML.replace('vars: {N: "512"}', 'vars: {N: "1024"}')), "vars"),
    (dict(yaml=YAML.replace("base: debian:bookworm", "base: debian:trixie")), "base"),
    (dict(yaml=YAML.replace("pip: [numpy]", "pip: [numpy<2]")), "deps"),
    (dict(yaml=YAML.replace("system_packages: [g++, python3-dev]", "system_packages: [g++]")), "deps"),
    (dict(yaml=YAML.replace('env: {OMP_NUM_THREADS: "4"}', 'env: {OMP_NUM_THREADS: "1"}')), "scenario"),
    (dict(yaml=YAML.replace('args: [--size, "512"]', 'args: [--size, "256"]')), "scenario"),
    (dict(yaml=YAML.replace("timeout: 600", "timeout: 60")), "scenario"),
    (dict(yaml=YAML.replace("limits: {memory: 8g}", "limits: {memory: 4g}")), "scenario"),
    (dict(yaml=YAML + "network: true\n"), "scenario"),
    (dict(yaml=YAML + "ablation: {via: hook}\n"), "scenario"),
    (dict(torch="2.4.0"), "case"),
    (dict(arch="amd64"), "case"),
    (dict(backend="eager"), "case"),
])
def test_each_ingredient_changes_the_key_and_is_named(tmp_path, edit, part):
    before = key_of(tmp_path)
    after = key_of(tmp_path, folder="edited", **edit)
    assert after.digest != before.digest
    assert changed_parts(before, after) == {part}
    assert after.differs(before.digest, before.parts).startswith("the scenario changed since (")


def test_the_lab_part_follows_the_templates_and_the_cross_install_setting(tmp_path, monkeypatch):
    before = key_of(tmp_path)
    monkeypatch.setenv("LAB_CROSS_INSTALL", "false")
    assert changed_parts(before, key_of(tmp_path)) == {"deps"}
    monkeypatch.delenv("LAB_CROSS_INSTALL")
    templates = tmp_path / "templates"
    shutil.copytree(Path(render.__file__).parents[2] / "dockerfiles", templates,
                    ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    with (templates / "debian.Dockerfile.j2").open("a") as f:
        f.write("# one more line\n")
    monkeypatch.setenv("LAB_TEMPLATES_DIR", str(templates))
    render.template_environment.cache_clear()
    try:
        after = key_of(tmp_path)
    finally:
        monkeypatch.delenv("LAB_TEMPLATES_DIR")
        render.template_environment.cache_clear()
    assert changed_parts(before, after) == {"lab"}
    assert "the lab's templates, runner or judging rules" in after.differs(before.digest, before.parts)


def test_a_missing_key_is_never_taken_for_the_same(tmp_path):
    key = key_of(tmp_path)
    assert key.differs(None, None) == "it has no content key (made by an older lab), so what it ran is unknown"
    assert key.differs("0" * 64, None) == "its content key differs"
