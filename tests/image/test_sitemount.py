"""Which Docker engines and cases get the cross-installed tree mounted read-only (lab.image.sitemount),
the mounts it makes, and the in-use marking that keeps a mounted cache entry from eviction."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from lab.cache_policy import inventory as inv
from lab.core.cache import entry_in_use, in_use_by_a_run, unless_in_use
from lab.core.records import BuiltImage, MountedImage
from lab.engine.docker_containers import site_mounts
from lab.image.builder import image_tag
from lab.image.crossinstall import Pending, Site, Target
from lab.image.render import Sealed, render_dockerfile, render_mounted
from lab.image.resolve import resolve
from lab.image.sitemount import host_path, mount_decision, site_binds
from lab.scenario.lookup import load_scenario
from tests.conftest import SCENARIOS

TARGET = Target("amd64", "x86_64", "3.11", (2, 36))
SP = "lib/python3.11/site-packages"


def tree(root: Path, complete: bool = True, needs_setuptools: bool = False) -> Path:
    """A cache entry laid out as lab.image.crossinstall makes it."""
    for rel, text in {
        "bin/torchrun": "#!/opt/venv/bin/python\n",
        f"{SP}/torch/__init__.py": "", f"{SP}/torch/version.py": "__version__ = '2.13.0+cpu'\n",
        f"{SP}/typing_extensions.py": "",
        f"{SP}/torch-2.13.0+cpu.dist-info/METADATA":
            "Name: torch\nVersion: 2.13.0+cpu\n" + ("Requires-Dist: setuptools>=77.0.3\n" if needs_setuptools else ""),
        "share/man/man1/isympy.1": "", ".lab-lock.txt": "torch==2.13.0+cpu\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if complete:
        (root / ".lab-freeze.txt").write_text("torch==2.13.0+cpu\n")
    return root


@pytest.fixture
def case():
    return resolve(load_scenario("libgomp-amd64", SCENARIOS), torch="2.13.0+cpu", arch="amd64")


@dataclasses.dataclass
class Plan:
    """What mount_decision reads of a BuildPlan."""

    site: Site | None
    sealed: Sealed | None = None


def site_at(root: Path, **kw) -> Site:
    return Site(target=TARGET, root=root, **kw)


@pytest.fixture(autouse=True)
def _mount_on(monkeypatch):
    monkeypatch.delenv("LAB_SITE_MOUNT", raising=False)


def test_a_docker_engine_on_this_host_mounts_a_complete_tree(tmp_path):
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t"))), on_this_host=True, own_dockerfile=True)
    assert decision.mount and decision.venv_pip == () and "read-only" in decision.why


def test_a_remote_engine_keeps_the_layer(tmp_path):
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t"))), on_this_host=False, own_dockerfile=True)
    assert not decision.mount and "not on this host" in decision.why


def test_a_bundles_own_dockerfile_keeps_the_layer(tmp_path):
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t"))), on_this_host=True, own_dockerfile=False)
    assert not decision.mount and "not the lab's own" in decision.why


def test_a_replays_rerender_mounts_unless_the_venv_needs_an_index(tmp_path):
    """A sealed replay has no index: it mounts a complete tree (the original run's very image), but
    cannot upgrade the venv's own setuptools, so such a tree stays a layer."""
    assert mount_decision(Plan(site_at(tree(tmp_path / "t")), sealed=Sealed()), True, True).mount
    needy = site_at(tree(tmp_path / "u", complete=False, needs_setuptools=True))
    decision = mount_decision(Plan(needy, sealed=Sealed()), on_this_host=True, own_dockerfile=True)
    assert not decision.mount and "replay" in decision.why


def test_a_tree_that_leaves_a_requirement_to_pip_keeps_the_layer(tmp_path):
    site = site_at(tree(tmp_path / "t", complete=False), pending=(Pending("oldpkg==0.1", "only an sdist", "no_wheel"),))
    decision = mount_decision(Plan(site), on_this_host=True, own_dockerfile=True)
    assert not decision.mount and "pip installs the rest" in decision.why


def test_nothing_cross_installed_or_the_setting_off_keeps_the_image_as_it_was(tmp_path, monkeypatch):
    assert not mount_decision(Plan(Site(target=TARGET, root=None)), True, True).mount
    assert not mount_decision(Plan(None), True, True).mount
    monkeypatch.setenv("LAB_SITE_MOUNT", "0")
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t"))), True, True)
    assert not decision.mount and "LAB_SITE_MOUNT=0" in decision.why


def test_a_need_of_the_venvs_own_setuptools_mounts_and_upgrades_it_in_the_image(tmp_path, case):
    """torch >= 2.10 needs setuptools>=77.0.3, which the venv seeds itself: the tree has no pip freeze
    then, yet it holds every requirement; the image's only pip step upgrades the venv's setuptools."""
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t", complete=False, needs_setuptools=True))), True, True)
    assert decision.mount and decision.venv_pip == ("setuptools>=77.0.3",)
    prefix, suffix = render_mounted(case, decision.venv_pip)
    assert "pip install 'setuptools>=77.0.3'" in suffix and "COPY --from=site" not in prefix + suffix
    assert "pip install torch" not in suffix and "COPY site/.lab-freeze.txt /lab/pip-freeze.txt" in suffix
    assert suffix.index("pip install") < suffix.index("COPY site/.lab-freeze.txt") < suffix.index("COPY repro/")
    assert "python3 -m venv /opt/venv" in prefix and "FROM ${LAB_STACKED}" in suffix
    assert "pip install" not in render_mounted(case)[1]
    # the run folder's Dockerfile is the whole one, unchanged: `docker build .` there still works alone
    assert "COPY --from=site / /opt/venv/" in render_dockerfile(case)


def test_an_engine_that_cannot_bind_the_cache_folder_keeps_the_layer(tmp_path):
    """The lab in a container with the host's socket (compose.yaml): its cache is not on the engine's host."""
    decision = mount_decision(Plan(site_at(tree(tmp_path / "t"))), True, True, engine_sees=lambda path: False)
    assert not decision.mount and "cannot bind" in decision.why


def test_a_link_where_a_mount_would_go_keeps_the_layer(tmp_path):
    root = tree(tmp_path / "t")
    (root / SP / "escape").symlink_to("/etc")
    decision = mount_decision(Plan(site_at(root)), True, True)
    assert not decision.mount and "escape is a link" in decision.why


def test_each_entry_is_mounted_at_its_path_in_the_venv_beside_the_venvs_own_files(tmp_path):
    root = tree(tmp_path / "t")
    binds = {b.target: b.source for b in site_binds(root, "3.11")}
    assert binds == {
        "/opt/venv/.lab-freeze.txt": root / ".lab-freeze.txt", "/opt/venv/.lab-lock.txt": root / ".lab-lock.txt",
        "/opt/venv/bin/torchrun": root / "bin/torchrun", "/opt/venv/share": root / "share",
        f"/opt/venv/{SP}/torch": root / SP / "torch",
        f"/opt/venv/{SP}/torch-2.13.0+cpu.dist-info": root / SP / "torch-2.13.0+cpu.dist-info",
        f"/opt/venv/{SP}/typing_extensions.py": root / SP / "typing_extensions.py",
    }  # never /opt/venv itself, bin/ or site-packages/: python, pip and setuptools of the venv stay
    mounts = site_mounts(MountedImage("t", root, "3.11"))
    assert {m["Type"] for m in mounts} == {"bind"} and all(m["ReadOnly"] for m in mounts)
    assert all(Path(m["Source"]).is_relative_to(root) for m in mounts)


def test_a_file_of_the_image_is_read_from_the_tree_and_never_outside_it(tmp_path):
    root = tree(tmp_path / "t")
    (tmp_path / "secret").write_text("no")
    (root / SP / "torch" / "out").symlink_to(tmp_path / "secret")
    assert host_path(root, "3.11", f"/opt/venv/{SP}/torch/version.py") == (root / SP / "torch/version.py").resolve()
    assert host_path(root, "3.11", f"/opt/venv/{SP}/torch/out") is None
    assert host_path(root, "3.11", f"/opt/venv/{SP}/../../../../secret") is None
    assert host_path(root, "3.11", "/etc/passwd") is None


def test_the_mounted_image_has_a_tag_of_its_own_and_runs_with_its_tree(tmp_path):
    class P:
        digest = "d" * 64
        case = type("C", (), {"scenario": type("S", (), {"name": "x"})()})()
    assert image_tag(P(), "sha256:b") != image_tag(P(), "sha256:b", mounted=True)
    mounted = MountedImage("torch-repro-lab/case:x-1", tmp_path, "3.11")
    image = BuiltImage("torch-repro-lab/case:x-1", "sha256:1", None, cached=True, build_seconds=0, mounted=mounted)
    assert image.ref is mounted and str(image.ref) == image.tag


def test_a_mounted_entry_is_in_use_until_the_run_lets_go(tmp_path):
    entry = tree(tmp_path / "site" / "k")
    assert not in_use_by_a_run(entry)
    with entry_in_use(entry), entry_in_use(entry):  # two runs may share one tree
        assert in_use_by_a_run(entry)
        with unless_in_use(entry) as free:
            assert not free
    with unless_in_use(entry) as free:
        assert free
    assert not in_use_by_a_run(entry)


def test_eviction_leaves_a_mounted_tree_alone(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LAB_CACHE_DIR", str(root))
    monkeypatch.setenv("LAB_CACHE_CAP", "0")
    old = time.time() - 30 * 86400
    entries = {}
    for key in ("mounted", "idle"):
        entries[key] = tree(root / "site" / key)
        (root / "site" / f"{key}.json").write_text("{}")
        for p in [entries[key], *entries[key].rglob("*"), root / "site" / f"{key}.json"]:
            os.utime(p, (old, old), follow_symlinks=False)
    with entry_in_use(entries["mounted"]):
        pruned = inv.prune(None, now=time.time())
        kept = next(e for e in pruned.before.entries if e.name == "mounted")
        assert kept.in_use == "mounted into a running container"
        assert entries["mounted"].is_dir() and not entries["idle"].exists()
        assert [e.name for e in pruned.removed] == ["idle"]
        assert inv._remove(dataclasses.replace(kept, in_use=None), None) == "mounted into a running container"
    assert (entries["mounted"] / SP / "torch" / "version.py").is_file()


class Store:
    """An ImageStore where only which builds and loads happen matters."""

    engine_id = "fake-engine"

    def __init__(self, local: bool) -> None:
        self.on_this_host = local
        self.built: list[tuple[str, str]] = []
        self.stacked: list[str] = []

    def image_id(self, ref, arch=None):
        return None

    def build(self, write_context, arch, base_ref, tag, buildargs, on_line, network_mode=None):
        import io
        import tarfile
        buf = io.BytesIO()
        write_context(buf)
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            dockerfile = tar.extractfile("Dockerfile").read().decode()
        self.built.append((tag, dockerfile))
        return f"sha256:{len(self.built)}"

    def sees_host_folder(self, path, image):
        return True

    def stack_layer(self, parent, write_layer, tag, arch, created_by, known=None):
        self.stacked.append(tag)
        return "sha256:stacked"


@pytest.mark.parametrize("local", [True, False])
def test_a_local_engine_builds_no_site_layer_and_a_remote_one_stacks_it(tmp_path, monkeypatch, case, local):
    from lab.core.records import BaseImage
    from lab.image import builder
    from lab.image.hostpip import HostPip
    from lab.image.render import plan_build
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(builder, "ensure_base",
                        lambda engine, ref, arch, events, packages=(): BaseImage(ref, ref, "sha256:base", "local"))
    plan = plan_build(case, HostPip(), installer=None)
    plan = dataclasses.replace(plan, site=site_at(tree(tmp_path / "t"), digest="ab" * 32))
    store = Store(local)
    image = builder.build_image(plan, store, HostPip())
    if local:
        assert store.stacked == [] and image.mounted == MountedImage(image.tag, tmp_path / "t", "3.11")
        (prefix_tag, prefix), (tag, suffix) = store.built
        assert prefix_tag.startswith("torch-repro-lab/layers:venv-") and tag == image.tag
        assert "COPY --from" not in prefix + suffix and "pip install" not in suffix
    else:
        assert len(store.stacked) == 1 and image.mounted is None and image.ref == image.tag
        assert "pip install" in store.built[-1][1]
    # `lab build`: an image to `docker run` on its own, with torch in it, on any engine
    standalone = Store(local)
    image = builder.build_image(plan, standalone, HostPip(), for_runs=False)
    assert len(standalone.stacked) == 1 and image.mounted is None
