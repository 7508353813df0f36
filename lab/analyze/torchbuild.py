"""The torch an image really has: its `torch/version.py`, read as text (never executed).

`torch.version.git_version` is the commit the release was built from, so a bisection's boundary
between two releases maps onto PyTorch's source (lab.core.results.SourceBoundary).
"""

from __future__ import annotations

import ast

from lab.core.results import TorchBuild

_FIELDS = {"__version__": "version", "git_version": "git_version", "cuda": "cuda"}


def parse_version_file(text: str) -> TorchBuild | None:
    """`torch/version.py` -> TorchBuild; None when the text holds none of its fields. Only literal
    string assignments are read (`git_version = 'cf30153c...'`), with or without an annotation."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in _FIELDS and isinstance(value, ast.Constant) \
                and isinstance(value.value, str) and value.value.isprintable() and len(value.value) < 200:
            found[_FIELDS[target.id]] = value.value
    return TorchBuild(**found) if found else None
