"""lab.resources: the package data, read through importlib.resources, from a folder or a zip."""

from __future__ import annotations

import zipfile
from pathlib import Path

import jinja2
import pytest

from lab.core import resources
from tests.conftest import ROOT


def test_the_package_data_is_the_repositorys_folders_in_an_editable_install():
    assert Path(str(resources.shipped("dockerfiles"))).resolve() == ROOT / "dockerfiles"
    assert resources.shipped_scenarios_dir().resolve() == ROOT / "scenarios"
    assert resources.runner_source() == (ROOT / "lab" / "probe" / "lab_run.py").read_bytes()


def test_templates_load_from_a_zip(tmp_path):
    archive = tmp_path / "lab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in (ROOT / "dockerfiles").glob("*.j2"):
            z.write(path, f"lab/dockerfiles/{path.name}")
    root = zipfile.Path(archive, "lab/dockerfiles/")
    env = jinja2.Environment(loader=resources.traversable_loader(root), keep_trailing_newline=True)
    source, _, _ = env.loader.get_source(env, "debian.Dockerfile.j2")
    assert source == (ROOT / "dockerfiles" / "debian.Dockerfile.j2").read_text()
    with pytest.raises(jinja2.TemplateNotFound):
        env.get_template("nope.j2")


def test_scenarios_are_copied_out_of_a_zip_once(tmp_path):
    archive = tmp_path / "lab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted((ROOT / "scenarios").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, f"lab/scenarios/{path.relative_to(ROOT / 'scenarios')}")
    target = resources.materialize(zipfile.Path(archive, "lab/scenarios/"), tmp_path / "out" / "scenarios")
    assert (target / "libgomp-aarch64.yaml").read_bytes() == (ROOT / "scenarios" / "libgomp-aarch64.yaml").read_bytes()
    assert (target / "scripts" / "libgomp_aarch64.py").is_file()
    again = resources.materialize(zipfile.Path(archive, "lab/scenarios/"), target)  # already there: kept
    assert again == target and not [p for p in target.parent.iterdir() if p.name.startswith(".staging")]


def test_templates_dir_setting_replaces_the_shipped_templates(tmp_path):
    (tmp_path / "debian.Dockerfile.j2").write_text("FROM scratch\n")
    env = jinja2.Environment(loader=resources.template_loader(tmp_path))
    assert env.get_template("debian.Dockerfile.j2").render() == "FROM scratch"
