"""torch/version.py read as text: the release and torch.version.git_version."""

from __future__ import annotations

from lab.analyze.torchbuild import parse_version_file

# torch/version.py of the real torch-2.13.0+cpu x86_64 wheel (the host's find-links folder)
REAL = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0+cpu'
debug = False
cuda: Optional[str] = None
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


def test_a_real_version_file():
    build = parse_version_file(REAL)
    assert build is not None
    assert (build.version, build.git_version, build.cuda) == ("2.13.0+cpu", "cf30153c4c131c8164ee7798e5022d810682e2cb",
                                                              None)


def test_annotated_cuda_and_nothing_executed():
    build = parse_version_file("__version__ = '2.5.1'\ncuda: Optional[str] = '12.4'\n"
                               "git_version = __import__('os').system('false')\n")
    assert build is not None and build.cuda == "12.4" and build.git_version is None


def test_garbage_is_none():
    assert parse_version_file("def (:\n") is None
    assert parse_version_file("x = 1\n") is None
    assert parse_version_file("git_version = 'a\\nb'\n") is None  # not printable: not taken
