"""lab.report.loader_graph on the LD_DEBUG log of a real run (torch 2.5.1, arm64 under QEMU, two libgomp)."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest

from lab.report.loader_graph import NO_DOT, draw, graph_of_run, to_dot
from tests.conftest import DATA

RUN = DATA / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"
TORCH_GOMP = "/opt/venv/lib/python3.11/site-packages/torch.libs/libgomp-f3febf51.so.1.0.0"
SYSTEM_GOMP = "/lib/aarch64-linux-gnu/libgomp.so.1"
KERNEL = "/tmp/torchinductor_root/la/cla3kg3e6mygqwcwoez2bawwpwycekmzmi7f7k2c3mxmxfpqgj5s.so"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None and not __import__("os").environ.get("CI"),
                               reason="Graphviz dot is not installed (bin/setup-host installs it)")


def test_the_graph_is_the_process_with_the_duplicate_and_its_chains():
    g = graph_of_run(RUN)
    assert (g.pid, g.program, g.family) == (1, "python", "libgomp")
    assert g.duplicates == (TORCH_GOMP, SYSTEM_GOMP)
    parent = {e.child: e.parent for e in g.edges}
    assert parent[TORCH_GOMP].endswith("torch/lib/libtorch_cpu.so")
    assert parent[SYSTEM_GOMP] == KERNEL and parent[KERNEL] == "python"
    red = {(e.parent, e.child) for e in g.edges if e.duplicate}
    # torch's copy: python -dlopen-> _C -> libtorch_python -> libtorch_cpu -> libgomp-f3febf51
    assert len(red) == 6 and (KERNEL, SYSTEM_GOMP) in red and ("python", KERNEL) in red
    assert not any(e.duplicate for e in g.edges if e.child.endswith("libm.so.6"))
    assert {e.how for e in g.edges if e.child == KERNEL} == {"dlopen"}
    assert len(g.edges) == 47 and "two GNU OpenMP runtimes in pid 1" in g.words[0]


def test_a_folder_without_a_loader_log_has_no_graph(tmp_path):
    assert graph_of_run(tmp_path) is None


def test_dot_text_quotes_names_and_marks_the_copies():
    text = to_dot(graph_of_run(RUN))
    assert text.startswith('digraph "loader pid 1" {') and text.rstrip().endswith("}")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith(f'"{SYSTEM_GOMP}" ['))
    assert 'label="libgomp.so.1"' in line and "penwidth=2" in line and "#f8d0d0" in line


@needs_dot
def test_dot_lays_it_out_as_inline_svg():
    picture = draw(graph_of_run(RUN))
    assert picture.note is None and picture.svg.startswith("<svg")
    root = ET.fromstring(picture.svg)
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert TORCH_GOMP in titles and SYSTEM_GOMP in titles          # one node per object, named by its path
    assert "http" not in picture.svg.replace("http://www.w3.org/", "")
    node = next(g for g in root.iter(f"{ns}g") if g.get("class") == "node" and g.findtext(f"{ns}title") == SYSTEM_GOMP)
    filled = {el.get("fill") for el in node.iter()}
    assert "#f8d0d0" in filled


def test_without_dot_the_picture_is_a_note(tmp_path, monkeypatch):
    graph = graph_of_run(RUN)
    broken = draw(graph, dot=str(tmp_path / "no-such-dot"))
    assert broken.svg is None and broken.note.startswith("Graphviz `dot` failed")
    monkeypatch.setattr("lab.report.loader_graph.shutil.which", lambda name: None)
    assert draw(graph) == type(broken)(None, NO_DOT)
