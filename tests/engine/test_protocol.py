"""Every engine implements lab.engine.protocol.Engine in full: the pipeline and the drivers call
nothing else, and read capabilities, never the engine's kind."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lab.engine import protocol
from lab.engine.docker_engine import DockerEngine
from lab.engine.local_engine import LocalEngine, LocalOptions
from lab.engine.slurm import SlurmEngine

LAB = Path(__file__).resolve().parents[2] / "lab"


def _members() -> list[str]:
    return sorted(n for n in vars(protocol.Engine) if not n.startswith("_") and n not in ("kind", "name", "url"))


@pytest.mark.parametrize("engine_class", [DockerEngine, LocalEngine, SlurmEngine], ids=["docker", "local", "slurm"])
def test_each_engine_has_every_member_of_the_protocol_with_its_parameters(engine_class):
    for name in _members():
        theirs = getattr(engine_class, name, None)
        assert theirs is not None, f"{engine_class.__name__} lacks {name}"
        ours = vars(protocol.Engine)[name]
        if isinstance(ours, property):
            assert isinstance(theirs, property), f"{engine_class.__name__}.{name} is not a property"
            continue
        wanted = list(inspect.signature(ours).parameters)
        given = list(inspect.signature(theirs).parameters)
        assert given[:len(wanted)] == wanted, f"{engine_class.__name__}.{name}{given} is not {wanted}"
    assert engine_class.kind in ("docker", "local", "slurm")


def test_the_local_engine_is_an_engine_and_says_what_it_can_do():
    engine = LocalEngine(LocalOptions(bwrap="off", trust_script=True))
    assert isinstance(engine, protocol.Engine)
    assert engine.native_arches == {engine.arch} and not engine.emulates and not engine.keeps_images
    assert not engine.confined and engine.unconfined_reason and not engine.cross_installs
    assert engine.resume_args() == ("--engine", "local", "--trust-script")
    assert engine.managed_images() == [] and engine.begin is not None


@pytest.mark.parametrize("path", ["pipeline.py", "drivers"])
def test_the_pipeline_and_the_drivers_never_ask_which_engine_they_hold(path):
    """No test of `engine.kind` (it is only recorded), no `is_local`, no local-only attribute, no
    engine class named: what differs lives in the engine."""
    files = [LAB / path] if path.endswith(".py") else sorted((LAB / path).glob("*.py"))
    for file in files:
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                kinds = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "kind"
                         and _engine_like(n)]
                assert not kinds, f"{file.name}:{node.lineno} compares the engine's kind"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("is_local", "options", "confinement") or not _engine_like(node), \
                    f"{file.name}:{node.lineno} reads the engine's {node.attr}"
            if isinstance(node, ast.Name):
                assert node.id not in ("DockerEngine", "LocalEngine", "is_local"), f"{file.name}:{node.lineno}"


def _engine_like(node: ast.Attribute) -> bool:
    base = node.value
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return name in ("engine", "on", "e") or name.endswith("engine")
