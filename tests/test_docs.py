"""The documentation: the README's two commands, the MkDocs site built --strict (a broken link or anchor,
or a page missing from the nav, fails it), the command reference against `lab --help`, and the tests
that the security model names as keeping each promise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mkdocs_build(config_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=config_dir, env=env, capture_output=True, text=True, timeout=300)


def test_the_readme_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert first_block is not None
    assert first_block.group(1) == "bin/setup && .venv/bin/lab run libgomp-aarch64\n.venv/bin/just test\n"


def test_the_site_builds_strict_with_every_command_in_its_reference(tmp_path):
    done = _mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    commands = (tmp_path / "site" / "commands" / "index.html").read_text()
    help_ = subprocess.run([sys.executable, "-m", "lab", "--help"], capture_output=True, text=True, check=True,
                           env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}).stdout
    names = re.findall(r"^│ ([a-z][\w-]*) ", help_, re.M)   # a command's row; options start with -
    assert "run" in names and "bisect" in names and "cache" in names
    for name in names:
        assert f"$ lab {name} --help" in commands, name
    assert "$ lab cache prune --help" in commands


def test_a_broken_link_or_a_page_outside_the_nav_fails_the_build(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "README.md", "ARCHITECTURE.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "lab").symlink_to(ROOT / "lab")   # the module table reads the source tree
    (tmp_path / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "README.md", tmp_path / "bench" / "README.md")
    engines = tmp_path / "docs" / "engines.md"
    engines.write_text(engines.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# A page in no nav\n")
    done = _mkdocs_build(tmp_path, tmp_path / "site")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "no-such-page.md" in out
    assert "orphan.md" in out


def test_every_test_the_security_model_names_exists():
    """Each promise of docs/security.md names the tests that keep it: each named file and test exists."""
    text = (ROOT / "docs" / "security.md").read_text()
    named = []
    for paragraph in text.split("\n\n"):
        current = None
        for token in re.findall(r"`([^`]+)`", paragraph):
            full = re.fullmatch(r"(tests/[\w/]+\.py)(?:::(\w+))?", token)
            if full:
                current = full.group(1)
                named.append((current, full.group(2)))
                continue
            short = re.fullmatch(r"::(\w+)", token) or re.fullmatch(r"(test_\w+)", token)
            if short and current:
                named.append((current, short.group(1)))
    assert len(named) >= 30
    for file, test in named:
        path = ROOT / file
        assert path.is_file(), file
        if test:
            assert re.search(rf"^(async )?def {test}\(", path.read_text(), re.M), f"{file}::{test}"
