"""The cross-installed tree as read-only mounts instead of an image layer (a Docker engine on this host).

A probe on a Docker engine used to write its release's site tree (4 to 7 GB with CUDA wheels) into the
engine as a layer before its first run. An engine that runs on this machine can read the lab's cache
entry where it is, so there the case image holds only the base, the lab's layout (lab.image.layout:
user, /out, CA, pip.conf, the venv that `python3 -m venv` makes) and the script, and each container
gets the tree read-only, mounted at its paths in the venv:

- one bind mount per entry of the tree's `bin/`, `include/`, `lib/pythonX.Y/site-packages/` and of its
  top folder (torch/, numpy/, *.dist-info, .lab-lock.txt ...), each at the same path under /opt/venv,
  so every file has the path it has in a layered image, and the venv's own files (python, pip and
  setuptools, which `python3 -m venv` seeds and the tree leaves out) stay beside them;
- every mount is read-only: the container cannot change the tree it sees (its root filesystem is
  read-only too, and it has no capability to remount anything), and the host reads nothing from these
  mounts after a run: what a run leaves comes out of /out through the checked extractor only;
- no host path but the tree's entries is mounted, and none that is a link (the engine would follow a
  link on the host): a tree with a link where a mount would go keeps the layers.

Why bind mounts and not a named volume made once per tree: a volume has to be filled by copying the
tree into it (the 4 to 7 GB write this avoids, once per release, which is what a bisection pays), and
it would be one more thing that holds the tree's bytes for the cache to count; a bind mount costs
nothing and the cache entry it shows is the one the cache already accounts for. While a container has
it mounted, the run holds a shared lock on `<entry>.inuse` (lab.core.cache.entry_in_use): eviction
and remaking leave the entry alone meanwhile.

Who mounts (`mount_decision`): a Docker engine on this host (its socket, or TCP to this host's
loopback) that can bind the lab's cache folder (not so where the lab itself runs in a container with
the host's socket, as compose.yaml does: its cache is not on the engine's host). Remote engines
(ssh://, tcp:// to another machine) cannot see the host's folders and keep the layers. Only a tree
that holds every requirement (nothing left to pip in the image but, where a package needs it, an
upgrade of the venv's own setuptools or pip, which a replay's sealed build, having no index, cannot
make), built from the lab's own Dockerfile (a replay's re-render is one; a bundle's own Dockerfile is
not), and only when the `site_mount` setting is on. A replay of a run that mounted its tree mounts it
too, so it gets the very image of the original run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lab.core.config import current as current_settings
from lab.image import layout
from lab.image.crossinstall import FREEZE_FILE, _seeded_lines, freeze_text, seeded_needs, seeded_requirements

MOUNTED_LABEL = "org.torch-repro-lab.site-mount"  # on a mounted case image: the tree's digest


@dataclass(frozen=True, slots=True)
class SiteBind:
    """One read-only bind mount: a path of the tree on the host, at its path in the container."""

    source: Path
    target: str


def _descended(python: str) -> frozenset[str]:
    """The tree's folders that the image's venv has too: their entries are mounted one by one, so
    that what the venv holds there itself (bin/python, pip, setuptools) stays visible."""
    return frozenset({"", "bin", "include", "lib", f"lib/python{python}", f"lib/python{python}/site-packages"})


def site_binds(root: Path, python: str) -> list[SiteBind]:
    """The mounts that show the tree at `root` under the venv, sorted by target. Raises ValueError
    when an entry that would be a mount's source is a link (the engine would follow it on the host)."""
    descend = _descended(python)
    binds: list[SiteBind] = []

    def walk(rel: str) -> None:
        folder = root / rel if rel else root
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                raise ValueError(f"{sub} is a link")
            if entry.is_dir(follow_symlinks=False) and sub in descend:
                walk(sub)
            else:
                binds.append(SiteBind(Path(entry.path), str(PurePosixPath(layout.VENV) / sub)))

    walk("")
    return binds


def host_path(root: Path, python: str, path: str) -> Path | None:
    """Where a file the image would have under the venv is in the mounted tree (None: not there,
    or outside it). Reading it reads the lab's own cache entry, which no container can write."""
    venv = PurePosixPath(layout.VENV)
    wanted = PurePosixPath(path)
    if not wanted.is_relative_to(venv) or ".." in wanted.parts:
        return None
    rel = wanted.relative_to(venv)
    candidate = root.joinpath(*rel.parts)
    try:
        resolved = candidate.resolve(strict=True)
    except OSError:
        return None
    return resolved if resolved.is_relative_to(root.resolve()) and resolved.is_file() else None


@dataclass(frozen=True, slots=True)
class MountDecision:
    """Whether each run of a plan gets the tree mounted, why (in words, for the build log), and what
    pip must still upgrade in the image's own venv (its pip or setuptools, which the tree leaves out)."""

    mount: bool
    why: str
    venv_pip: tuple[str, ...] = ()


def mount_decision(plan, on_this_host: bool, own_dockerfile: bool,
                   engine_sees: Callable[[Path], bool] = lambda path: True) -> MountDecision:
    """Whether each run of `plan` gets the tree mounted or the image carries it as a layer (see the
    module's docstring for who mounts). `engine_sees(folder)`: whether the engine's bind mounts of
    the folder show this process's own (asked last, as it may cost a request)."""
    site = plan.site
    if not current_settings().site_mount:
        return MountDecision(False, "site_mount is off (LAB_SITE_MOUNT=0): the tree is a layer of the image")
    if site is None or site.root is None:
        return MountDecision(False, "nothing was cross-installed: pip installs the requirements in the image")
    if not on_this_host:
        return MountDecision(False, "the engine is not on this host and cannot see its folders: the tree is a layer")
    if not own_dockerfile:
        return MountDecision(False, "the Dockerfile is not the lab's own rendering: the tree is a layer")
    if site.target is None:
        return MountDecision(False, "the image's Python is unknown: the tree is a layer")
    if site.pending:
        return MountDecision(False, "the tree does not hold every requirement (pip installs the rest in the image): "
                                    "the tree is a layer")
    venv_pip: tuple[str, ...] = ()
    if not (site.root / FREEZE_FILE).is_file():  # a package needs more of the venv's own pip or setuptools
        needs = seeded_needs(site.root, site.target)
        venv_pip = tuple(seeded_requirements(site.root, site.target))
        if not needs or not venv_pip or len(needs) != _readable(site.root, site.target):
            return MountDecision(False, "the tree is not complete (pip checks it in the image): the tree is a layer")
    if plan.sealed is not None and venv_pip:
        return MountDecision(False, "a replay's sealed build has no index for the venv's own setuptools or pip: "
                                    "the tree is a layer")
    try:
        site_binds(site.root, site.target.python)
    except (ValueError, OSError) as exc:
        return MountDecision(False, f"the tree cannot be mounted ({exc}): the tree is a layer")
    if not engine_sees(site.root):
        return MountDecision(False, "the engine cannot bind this process's cache folder (the lab runs in a "
                                    "container?): the tree is a layer")
    return MountDecision(True, "the engine is on this host: each run gets the tree read-only, mounted at the "
                               "venv's paths, and the image holds no copy of it", venv_pip)


def _readable(root: Path, target) -> int:
    """How many of the tree's needs of pip or setuptools are requirements pip can read."""
    return sum(1 for _, _, req in _seeded_lines(root, target) if req is not None)


def freeze_of(root: Path) -> bytes:
    """The image's pip freeze (lab.image.layout.FREEZE_FILE) for a mounted tree: the one written on the
    host when the tree is complete, else what `pip freeze` prints for it (which leaves out pip and
    setuptools, the only things pip in the image touches)."""
    written = root / FREEZE_FILE
    return written.read_bytes() if written.is_file() else freeze_text(root).encode()
