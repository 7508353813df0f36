"""A Docker engine's images: present or pulled, built from a context, imported from a tar, and
loaded from a docker-save archive the lab writes itself (a bootstrapped base's rootfs as one
layer; a layer stacked on a parent without a build)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import BinaryIO

import docker
import docker.errors
import requests.exceptions

from lab.core.arch import Arch
from lab.core.errors import BuildError, EngineError
from lab.core.hashing import CountingWriter, HashingWriter
from lab.core.tarwrite import TarStream, add_bytes, add_file, end_archive, stream_tar, write_member
from lab.engine.docker_client import LABEL, LABELS, short

# The PATH a build FROM scratch gives an image (the base the lab loads from a rootfs gets it too)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class DockerImages:
    """The image half of lab.engine.docker_engine.DockerEngine (it implements
    lab.image.imagestore.ImageStore)."""

    client: docker.DockerClient
    stream_client: docker.DockerClient

    def image_id(self, ref: str, arch: Arch | None = None) -> str | None:
        """The id of a local image, if present (and of the wanted arch)."""
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine failed to inspect {ref}: {short(exc)}") from None
        if arch is not None and image.attrs.get("Architecture") != arch.value:
            return None
        return image.id

    def pull(self, ref: str, arch: Arch) -> str | None:
        """Pull `ref` for `arch`; None when no registry can provide it."""
        try:
            image = self.client.images.pull(ref, platform=arch.platform)
        except (docker.errors.APIError, docker.errors.DockerException,
                requests.exceptions.RequestException):
            return None
        return image.id

    def build_rootfs(self, rootfs: Path, tag: str, arch: Arch) -> str:
        """Turn a rootfs tarball into an image of `arch` (as `FROM scratch`, `ADD rootfs.tar /` and
        `CMD ["bash"]` would), through the engine's image load: a one-layer image whose config the
        lab writes, so the engine unpacks the tar once (a build would send it as a context, unpack
        it with ADD, then diff and commit it again)."""
        digest = hashlib.sha256()
        with rootfs.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        config = json.dumps({
            "architecture": arch.value, "os": "linux", **({"variant": "v8"} if arch is Arch.ARM64 else {}),
            "created": "1970-01-01T00:00:00Z",
            "config": {"Env": [f"PATH={DEFAULT_PATH}"], "Cmd": ["bash"], "Labels": dict(LABELS)},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest.hexdigest()}"]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"torch-repro-lab: {rootfs.name}"}],
        }, sort_keys=True).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["rootfs/layer.tar"]}]).encode()

        def write_tar(out: BinaryIO) -> None:
            with stream_tar(out) as tar:
                for name, data in (("manifest.json", manifest), (config_name, config)):
                    add_bytes(tar, name, data)
                add_file(tar, "rootfs/layer.tar", rootfs, rootfs.stat().st_size)

        self._load(write_tar, tag)
        image_id = self.image_id(tag, arch)
        if image_id is None:
            raise BuildError(f"the load of {tag} ended without an image of {arch.value}.")
        return image_id

    def stack_layer(self, parent: str, write_layer: Callable[[BinaryIO], object], tag: str, arch: Arch,
                    created_by: str, known: tuple[str, int] | None = None) -> str:
        """An image that is `parent` plus one layer, made through the engine's image load: the
        parent's layers are named by their digests and not sent again (the engine finds each by its
        chain and does not read the placeholder that stands for it), and the new layer crosses into
        the engine once, with no build context, no `COPY` and no commit. The load must name the
        layer's SHA-256 and size before it sends it: `known` gives them (counted when the tree was
        made), and the layer is streamed while it is written; without them, or when the engine
        finds that the layer no longer has that digest, it is written to a temporary file first."""
        try:
            attrs = self.client.api.inspect_image(parent)
        except docker.errors.DockerException as exc:
            raise BuildError(f"the engine could not inspect {parent}: {short(exc)}") from None
        if known is not None:
            with contextlib.suppress(BuildError):  # the tree changed since it was counted
                self._load(partial(_stacked_tar, attrs, arch, tag, created_by, known, write_layer), tag)
                image_id = self.image_id(tag)
                if image_id is not None:
                    return image_id
        with tempfile.TemporaryFile() as layer:
            digest = HashingWriter(layer)
            write_layer(digest)
            layer.seek(0)
            self._load(partial(_stacked_tar, attrs, arch, tag, created_by, (digest.hexdigest(), digest.size),
                               partial(shutil.copyfileobj, layer)), tag)
        image_id = self.image_id(tag)
        if image_id is None:
            raise BuildError(f"the load of {tag} ended without an image.")
        return image_id

    def _load(self, write_tar: Callable[[BinaryIO], object], tag: str) -> None:
        """The engine's image load of the tar `write_tar` writes, streamed while it is written."""
        with TarStream(write_tar) as body:
            try:
                for chunk in self.stream_client.api.load_image(body):
                    if chunk.get("error"):
                        raise BuildError(f"the engine could not load {tag}: {chunk['error'].strip()}")
            except OSError as exc:  # the engine's answer (APIError), the connection, or the tar's writer
                raise BuildError(body.why_broken(f"load {tag}", exc, short)) from None

    def build(self, write_context: Callable[[BinaryIO], object], arch: Arch, base_ref: str, tag: str,
              buildargs: dict[str, str], on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        """Build a context (`write_context` writes its tar, streamed through a temp file) for `arch`
        and tag it. `network_mode` is the build steps' network ("host" to reach a server on the
        host's loopback); None: the default. The engine knows nothing of plans or templates."""
        with tempfile.TemporaryFile() as ctx:
            write_context(ctx)
            ctx.seek(0)
            return self._build(ctx, tag, arch, {"BASE": base_ref, **buildargs}, on_line, network_mode)

    def _build(self, ctx, tag: str, arch: Arch, buildargs: dict[str, str],
               on_line: Callable[[str], None], network_mode: str | None = None) -> str:
        log: list[str] = []
        image_id = None
        try:
            stream = self.client.api.build(
                fileobj=ctx, custom_context=True, tag=tag, platform=arch.platform, network_mode=network_mode,
                buildargs=buildargs, labels=LABELS, rm=True, forcerm=True, pull=False, decode=True)
            for chunk in stream:
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        log.append(line)
                        on_line(line)
                if "error" in chunk:
                    log.append(chunk["error"])
                    raise BuildError(f"the image build failed: {chunk['error'].strip()}",
                                     log="\n".join(log))
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
        except docker.errors.APIError as exc:
            raise BuildError(f"the engine refused the build: {short(exc)}", log="\n".join(log)) from None
        except requests.exceptions.RequestException as exc:
            raise BuildError(f"the build connection broke: {short(exc)}", log="\n".join(log)) from None
        if image_id is None:
            image_id = self.image_id(tag)
        if image_id is None:
            raise BuildError("the build ended without an image.", log="\n".join(log))
        return image_id

    def import_layer(self, write_tar: Callable[[BinaryIO], object], ref: str) -> str:
        """A one-layer image made from a tar stream, as `docker import -` does: the tar goes to the
        engine once, while `write_tar` writes it, and the engine unpacks it straight into a layer,
        with no build context, no `COPY` and no commit. Import takes no platform (the engine
        records its own arch), so this serves images that are only a `COPY --from` source, whose
        tag names the arch. A tar that fails half-way makes no image."""
        repository, _, tag = ref.rpartition(":")
        with TarStream(write_tar) as body:
            try:
                answer = self.stream_client.api.import_image_from_stream(
                    body, repository=repository, tag=tag, changes=[f"LABEL {LABEL}=true"])
            except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
                raise BuildError(body.why_broken(f"import {ref}", exc, short)) from None
        for line in str(answer).splitlines():
            with contextlib.suppress(ValueError):
                error = json.loads(line).get("error")
                if error:
                    raise BuildError(f"the engine could not import {ref}: {error.strip()}")
        image_id = self.image_id(ref)
        if image_id is None:
            raise BuildError(f"the import of {ref} ended without an image.")
        return image_id


def _stacked_tar(attrs: dict, arch: Arch, tag: str, created_by: str, layer: tuple[str, int],
                 write_layer: Callable[[BinaryIO], object], out: BinaryIO) -> None:
    """The image load's tar for `DockerImages.stack_layer`: an empty placeholder for each of the parent's
    layers, the manifest, the config (the parent's, with the new layer's digest added), and the
    layer itself, which `write_layer` writes straight into the stream. A layer that turns out
    longer or shorter than its size breaks the tar, so the load fails rather than take it."""
    digest, size = layer
    parents = list(attrs.get("RootFS", {}).get("Layers") or [])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the cache's last use falls back on it
    config = json.dumps({
        "architecture": attrs.get("Architecture") or arch.value, "os": attrs.get("Os") or "linux",
        **({"variant": attrs["Variant"]} if attrs.get("Variant") else {}),
        "created": now, "config": attrs.get("Config") or {},
        "rootfs": {"type": "layers", "diff_ids": [*parents, f"sha256:{digest}"]},
        "history": [{"created": now, "created_by": created_by}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [f"parent{i}/layer.tar" for i in range(len(parents))] + ["stacked/layer.tar"]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode()
    for name, data in [(n, b"") for n in names[:-1]] + [("manifest.json", manifest), (config_name, config)]:
        write_member(out, name, len(data), lambda o, data=data: o.write(data))

    def write_counted(o: BinaryIO) -> None:
        counted = CountingWriter(o)  # the engine checks the digest itself
        write_layer(counted)
        if counted.size != size:
            raise OSError(f"the layer is {counted.size} bytes, not the {size} counted before")

    write_member(out, names[-1], size, write_counted)
    end_archive(out)
