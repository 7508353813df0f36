import io
import tarfile
from pathlib import Path

import pytest

from lab.image.hostpip import HostPip
from lab.image.render import (
    ContextTree,
    builds_as_rendered,
    plan_build,
    render_dockerfile,
    write_context,
    write_context_folder,
    write_site_tar,
)
from lab.image.resolve import resolve
from lab.report.run_folder import write_scenario, write_site_readme
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS
from tests.image.test_crossinstall import fake_installer


def case(name="libgomp-aarch64", **kw):
    return resolve(load_scenario(name, SCENARIOS), **kw)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAB_CROSS_INSTALL", raising=False)
    return tmp_path / "cache"


def plan(c=None, host=None, installer=None):
    """Without an installer nothing is cross-installed (no uv, no network)."""
    return plan_build(c or case(), host or HostPip(), installer=installer)


def test_render_is_byte_identical_for_the_same_case():
    assert render_dockerfile(case()) == render_dockerfile(case())


def test_torch_layer_comes_before_the_script():
    text = render_dockerfile(case())
    assert text.index("pip install torch==2.5.1") < text.index("COPY repro/")
    assert text.index("apt-get install") < text.index("pip install")
    assert text.rstrip().endswith('CMD ["python", "libgomp_aarch64.py"]')


def test_render_names_the_case_and_the_platform():
    text = render_dockerfile(case(torch="2.6.0", arch="amd64"))
    assert "libgomp-aarch64[torch=2.6.0,arch=amd64]" in text
    assert "--platform linux/amd64" in text
    assert "torch==2.6.0" in text


def test_dockerfile_does_not_depend_on_host_settings(tmp_path: Path):
    ca = tmp_path / "ca.crt"
    ca.write_text("CA")
    a = plan(case(), HostPip())
    b = plan(case(), HostPip(ca_bundle=ca, index_url="https://mirror.example/simple"))
    assert a.dockerfile == b.dockerfile
    assert a.digest != b.digest  # ... but the context, and so the image, does


def test_requirements_are_shell_quoted(tmp_path: Path):
    yaml_file = tmp_path / "s.yaml"
    (tmp_path / "s.py").write_text("print(1)\n")
    yaml_file.write_text('name: quoting\ntorch: "2.5.1"\narch: amd64\nbase: debian:bookworm\n'
                         'pip: ["numpy<2", "sympy>=1.12; python_version >= \'3.8\'"]\n'
                         'script: s.py\nexpect: {exit_code: 0}\n')
    text = render_dockerfile(resolve(load_scenario(yaml_file, SCENARIOS)))
    assert "'numpy<2'" in text
    assert "'sympy>=1.12; python_version >= '\"'\"'3.8'\"'\"''" in text


def test_context_tar_is_byte_stable_and_sorted(cache):
    p = plan(installer=fake_installer)
    first, second = io.BytesIO(), io.BytesIO()
    assert write_context(p.files, first) == write_context(p.files, second)
    assert first.getvalue() == second.getvalue()
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert {m.uid for m in tar.getmembers()} == {0} and {m.mtime for m in tar.getmembers()} == {0}
        members = {m.name: m for m in tar.getmembers()}
    assert "repro/libgomp_aarch64.py" in names and "Dockerfile" in names
    # the site tree does not travel with the case: it is an image of its own (build arg SITE)
    assert members["site"].isdir() and not [n for n in names if n.startswith("site/")]
    assert p.site_image == f"torch-repro-lab/site:{p.site.digest[:24]}-arm64"


def test_the_site_image_layer_streams_the_tree_file_by_file_at_its_root(cache):
    (tree,) = [f for f in plan(installer=fake_installer).files if isinstance(f, ContextTree)]
    first, second = io.BytesIO(), io.BytesIO()
    assert write_site_tar(tree, first) == write_site_tar(tree, second)
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    # the layer of `docker import`: the tree at / (COPY --from=site / venv/), no Dockerfile
    assert "Dockerfile" not in members and not [n for n in members if n.startswith("site")]
    assert members["bin/fake"].mode == 0o755  # keeps its executable bit
    assert members["lib/python3.11/site-packages/fake/__init__.py"].mode == 0o644
    assert ".lab-lock.txt" in members and {m.uid for m in members.values()} == {0}
    assert {m.mtime for m in members.values()} == {0}


def test_an_empty_site_is_still_a_folder_in_the_context():
    with tarfile.open(fileobj=io.BytesIO(_tar(plan()))) as tar:
        site = [m for m in tar.getmembers() if m.name == "site" or m.name.startswith("site/")]
    assert [(m.name, m.isdir()) for m in site] == [("site", True)]


def _tar(p) -> bytes:
    buf = io.BytesIO()
    write_context(p.files, buf)
    return buf.getvalue()


def test_plan_digest_follows_the_requirements_and_is_stable(cache):
    """The site tree's digest is read from the cache, not recomputed: two plans agree."""
    a, b = plan(installer=fake_installer), plan(installer=fake_installer)
    assert a.digest == b.digest and b.site.cached
    other = plan(case(torch="2.6.0"), installer=fake_installer)
    assert other.digest != a.digest
    assert other.site.root != a.site.root
    (tree,) = [f for f in a.files if isinstance(f, ContextTree)]
    assert tree.digest == a.site.digest and tree.size() == a.site.size > 0


def test_a_local_wheel_travels_only_when_pip_in_the_image_needs_it(tmp_path: Path, cache):
    links = tmp_path / "links"
    links.mkdir()
    wheel = links / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    host = HostPip(find_links=(str(links),))
    names = [f.arcname for f in plan(case(torch="2.13.0", arch="amd64"), host).files]
    assert "wheels/" + wheel.name in names
    names = [f.arcname for f in plan(case(torch="2.13.0", arch="arm64"), host).files]
    assert "wheels/" + wheel.name not in names
    covered = plan(case(torch="2.13.0", arch="amd64"), host, installer=fake_installer)
    assert "wheels/" + wheel.name not in [f.arcname for f in covered.files]  # site/ has torch
    assert covered.host_wheels == (wheel,)  # ... but a run folder's plain `docker build .` needs it


def test_the_run_folder_gets_an_empty_site_with_a_readme(tmp_path: Path, cache):
    links = tmp_path / "links"
    links.mkdir()
    wheel = links / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    p = plan(case(torch="2.13.0", arch="amd64"), HostPip(find_links=(str(links),)), installer=fake_installer)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_context_folder(run_dir, p)
    write_site_readme(run_dir, p)  # the report stage writes it, from its template
    write_scenario(run_dir, p.case, None)
    assert sorted(x.name for x in (run_dir / "site").iterdir()) == ["README.md"]
    readme = (run_dir / "site" / "README.md").read_text()
    assert "pip installs" in readme and str(p.site.root) in readme and "fake==1.0" in readme
    assert "--build-arg SITE=" in readme and "docker import" in readme
    assert "site/README.md" in (run_dir / ".dockerignore").read_text().splitlines()
    assert str(wheel) in (run_dir / "wheels" / "FROM-HOST.txt").read_text()
    assert (run_dir / "Dockerfile").read_text() == p.dockerfile


def test_the_site_is_copied_into_the_venv_before_pip_checks_it():
    text = render_dockerfile(case())
    assert text.index("ARG SITE=scratch") < text.index("FROM ${SITE} AS site") < text.index("FROM ${BASE}")
    assert text.index("RUN python3 -m venv /opt/venv") < text.index("COPY --from=site / /opt/venv/")
    assert text.index("COPY --from=site / /opt/venv/") < text.index("pip install torch==2.5.1")
    # a complete tree skips pip entirely; else pip installs what is left, or everything
    assert text.index("if [ -f /opt/venv/.lab-freeze.txt ]") < text.index("pip install torch==2.5.1")
    assert "With SITE left at scratch" in text and "installs everything in" in text
    assert "/root" not in text and "cache" not in text  # nothing of the host


def test_gpu_scenarios_render_here():
    text = render_dockerfile(case("dlpack-cuda"))
    assert "ARG BASE=nvidia/cuda:" in text and "NVIDIA_VISIBLE_DEVICES=all" in text


@pytest.mark.parametrize("name", [p.stem for p in SCENARIOS.glob("*.yaml")])
def test_every_shipped_scenario_renders(name):
    s = load_scenario(name, SCENARIOS)
    for torch in s.torch:
        for arch in s.arch:
            assert "FROM ${BASE}" in render_dockerfile(resolve(s, torch=torch, arch=arch.value))


def test_layers_before_the_script_do_not_depend_on_scenario_or_torch():
    """The apt layer is shared by every scenario with the same packages (it is slow under QEMU)."""
    a = render_dockerfile(case("libgomp-aarch64"))
    b = render_dockerfile(case("dlpack-cpu"))
    upto = " && pip install"
    body = lambda t: t[t.index("ARG BASE"):t.index(upto)]  # noqa: E731
    assert body(a) == body(b)


def test_the_dockerfile_splits_where_it_copies_the_site_image():
    """The lab builds its Dockerfile in two parts around `COPY --from=site`, with the tree stacked on
    the first part's image as one layer (lab.image.builder); the two parts are the whole, less that line."""
    from lab.image.render import STACK_ARG, render_parts
    text = render_dockerfile(case("libgomp-aarch64"))
    prefix, suffix, venv = render_parts(case("libgomp-aarch64"))  # rendered apart, never cut out of `text`
    assert venv == "/opt/venv"
    assert prefix.rstrip().endswith("PATH=/opt/venv/bin:$PATH") and "RUN python3 -m venv /opt/venv" in prefix
    assert suffix.startswith(f"ARG {STACK_ARG}\nFROM ${{{STACK_ARG}}}\nCOPY wheels/ /lab/wheels/\n")
    copy = "COPY --from=site / /opt/venv/\n"
    assert prefix + copy + suffix.split("\n", 2)[2] == text
    gpu_prefix, gpu_suffix, _ = render_parts(case("dlpack-cuda"))  # the CUDA template's parts, the same way
    assert gpu_prefix + copy + gpu_suffix.split("\n", 2)[2] == render_dockerfile(case("dlpack-cuda"))


def test_a_replays_rerender_builds_as_rendered_but_another_dockerfile_does_not():
    """A replay's re-render carries the bundle's provenance comment (the original run's scenario
    file): it builds what this lab renders, so a run on this host may mount the tree for it; one
    changed step is another Dockerfile."""
    case = resolve(load_scenario(SCENARIOS / "libgomp-aarch64.yaml"), torch="2.5.1")
    ours = render_dockerfile(case)
    lines = ours.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("# Rendered by torch-repro-lab"))
    other = "# Rendered by torch-repro-lab 0.0.9 from other-name.yaml."
    theirs = "\n".join([*lines[:first], other, *lines[first + 1:]])
    assert theirs != ours and builds_as_rendered(theirs, case) and builds_as_rendered(ours, case)
    assert not builds_as_rendered(ours.replace("python3 -m venv /opt/venv", "python3 -m venv /opt/venv && true"), case)
    assert not builds_as_rendered(ours.replace("# Rendered by", "# rendered by"), case)
