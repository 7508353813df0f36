"""What the image-making modules (`image`, `base`) need of an engine that stores images: Docker's
build, import, load and pull (lab.engine.docker_engine.DockerEngine implements it). Typed here, in
the stage that makes images, so that this stage does not import the engine that runs them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from lab.core.arch import Arch

WriteTar = Callable[[BinaryIO], object]


class ImageStore(Protocol):
    """An engine that builds and keeps images, addressed by tag."""

    name: str

    @property
    def arch(self) -> Arch:
        """The engine host's native architecture."""
        ...

    @property
    def engine_id(self) -> str:
        """A stable ID of the engine: keys what the lab caches per engine."""
        ...

    @property
    def on_this_host(self) -> bool:
        """Whether the engine runs on this machine, so that a build with the host's network reaches
        a server the lab listens with on 127.0.0.1."""
        ...

    def sees_host_folder(self, path: Path, image: str) -> bool:
        """Whether the engine's bind mounts of `path` show this process's folder (False when the lab
        itself runs in a container whose folders the engine's host does not have); `image` is one it
        holds, to make the test container from (never started)."""
        ...

    def image_id(self, ref: str, arch: Arch | None = None) -> str | None:
        """The ID of an image present on the engine (and of `arch`), or None."""
        ...

    def pull(self, ref: str, arch: Arch) -> str | None:
        """Pull `ref` for `arch`; its ID, or None when the registry has none."""
        ...

    def build_rootfs(self, rootfs: Path, tag: str, arch: Arch) -> str:
        """A one-layer image of the folder `rootfs` (a bootstrapped base), tagged `tag`; its ID."""
        ...

    def build(self, write_context: WriteTar, arch: Arch, base_ref: str, tag: str,
              buildargs: dict[str, str], on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        """Build the context that `write_context` writes (a tar) FROM `base_ref`; the image's ID."""
        ...

    def import_layer(self, write_tar: WriteTar, ref: str) -> str:
        """A one-layer image made from a tar stream (`docker import -`); its ID."""
        ...

    def stack_layer(self, parent: str, write_layer: WriteTar, tag: str, arch: Arch,
                    created_by: str, known: tuple[str, int] | None = None) -> str:
        """`parent` with one more layer, written by `write_layer`, tagged `tag`; its ID."""
        ...
