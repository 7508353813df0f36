"""The files the lab ships inside its package, read with importlib.resources.

    lab.dockerfiles   the Dockerfile templates (the repository's dockerfiles/, mapped in at build time)
    lab.scenarios     the shipped scenarios and their scripts (the repository's scenarios/)
    lab/probe/        the in-image runner, lab_run.py
    lab/report/templates/  every Markdown and HTML report's template, read by lab.report.writer

pyproject.toml maps the repository's top-level `dockerfiles/` and `scenarios/` folders into the
package as `lab.dockerfiles` and `lab.scenarios` (setuptools `package-dir`), so a wheel carries
them and an editable install (`pip install -e .`) finds them through setuptools' import finder.
Run from a bare checkout on PYTHONPATH, the folders next to `lab/` are used instead.

Templates and the runner are read through `Traversable`, so they work from a zip as well. Scenario
files need real paths (a scenario's script is a build-context file with a path shown to users), so
where the package is not a plain folder (a zipapp), the shipped scenarios are copied once into
the lab's cache.
"""

from __future__ import annotations

import importlib.resources
import shutil
import tempfile
from importlib.resources.abc import Traversable
from pathlib import Path

import jinja2

from lab import __version__

_REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNER_NAME = "lab_run.py"


def shipped(package: str) -> Traversable:
    """`lab.dockerfiles` or `lab.scenarios` as a Traversable (a folder of the package)."""
    try:
        return importlib.resources.files(f"lab.{package}")
    except ModuleNotFoundError:  # a bare checkout on PYTHONPATH: the repository's own folder
        return _REPO_ROOT / package


def runner_source() -> bytes:
    """The in-image runner (lab/probe/lab_run.py): baked into every image at /lab/tools/."""
    return importlib.resources.files("lab").joinpath("probe", RUNNER_NAME).read_bytes()


def template_loader(templates_dir: Path | None = None) -> jinja2.BaseLoader:
    """Templates from `templates_dir` (LAB_TEMPLATES_DIR / the `templates_dir` setting) when given,
    else the package's own, read through importlib.resources (zip-safe)."""
    if templates_dir is not None:
        return jinja2.FileSystemLoader(str(templates_dir))
    return traversable_loader(shipped("dockerfiles"))


def traversable_loader(root: Traversable) -> jinja2.BaseLoader:
    """A Jinja loader over any Traversable (a folder, a package inside a zip)."""

    def load(name: str) -> str | None:
        item = root.joinpath(*name.split("/"))
        return item.read_text(encoding="utf-8") if item.is_file() else None

    return jinja2.FunctionLoader(load)


def shipped_scenarios_dir(cache_root: Path | None = None) -> Path:
    """The shipped scenarios as a real folder: the package's own, or (zip) a copy under `cache_root`
    (the lab's cache folder; None: the system's temporary folder)."""
    root = shipped("scenarios")
    if isinstance(root, Path):
        return root
    base = cache_root if cache_root is not None else Path(tempfile.gettempdir()) / "torch-repro-lab"
    target = base / "shipped" / f"scenarios-{__version__}"
    if not target.is_dir():
        materialize(root, target)
    return target


def materialize(root: Traversable, target: Path) -> Path:
    """Copy a Traversable folder tree to `target` (written beside it, then renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        _copy_tree(root, staging)
        try:
            staging.rename(target)
        except OSError:  # another process put it there first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _copy_tree(node: Traversable, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for child in node.iterdir():
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            _copy_tree(child, dest / child.name)
        else:
            (dest / child.name).write_bytes(child.read_bytes())
