"""Engine.import_layer against the real engine: the site image's one pass into Docker."""

from __future__ import annotations

import hashlib
import io
import tarfile
import uuid

import pytest

from lab.core.arch import Arch
from lab.core.errors import BuildError
from lab.engine.docker_client import LABEL
from lab.engine.docker_engine import Engine

pytestmark = pytest.mark.docker


def _tar(out, files: dict[str, bytes], fail_after: int | None = None) -> None:
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for n, (name, data) in enumerate(files.items()):
            if fail_after is not None and n == fail_after:
                raise OSError(f"{name} vanished while the tar was written")
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def engine_and_ref():
    engine = Engine.connect()
    ref = f"torch-repro-lab/site:test-{uuid.uuid4().hex[:12]}-arm64"
    yield engine, ref
    engine.remove_image(ref)


def test_a_tree_streamed_into_the_engine_is_one_layer_with_the_files_at_its_root(engine_and_ref):
    engine, ref = engine_and_ref
    # larger than the pipe and the request's chunks, so the writer and the request run side by side
    files = {"bin/tool": b"#!/bin/sh\necho hi\n", "lib/big.bin": bytes(range(256)) * 12_000, ".lab-lock.txt": b"x\n"}
    image_id = engine.import_layer(lambda out: _tar(out, files), ref)
    image = engine.client.images.get(ref)
    assert image.id == image_id and image.labels.get(LABEL) == "true"  # the lab's own: cache info sees it
    assert len(image.attrs["RootFS"]["Layers"]) == 1
    # what `COPY --from=site /` copies: read back through a container made (never started) from it
    container = engine.client.containers.create(ref, command=["none"])
    try:
        stream, _ = container.get_archive("/lib/big.bin")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            assert tar.extractfile("big.bin").read() == files["lib/big.bin"]
    finally:
        container.remove()


def test_a_tar_that_fails_half_way_makes_no_image(engine_and_ref):
    engine, ref = engine_and_ref
    files = {f"lib/f{i}.bin": bytes(4096) * 64 for i in range(20)}
    with pytest.raises(BuildError) as err:
        engine.import_layer(lambda out: _tar(out, files, fail_after=10), ref)
    assert "could not be written" in err.value.message and "vanished while the tar was written" in err.value.message
    assert engine.image_id(ref) is None


def test_a_rootfs_is_loaded_as_a_base_of_its_arch_with_the_config_a_build_from_scratch_gives(tmp_path):
    """Engine.build_rootfs: the bootstrapped base, loaded in one pass with the lab's own config."""
    engine = Engine.connect()
    tag = f"torch-repro-lab/debian:test-{uuid.uuid4().hex[:12]}-arm64"
    rootfs = tmp_path / "rootfs.tar"
    with rootfs.open("wb") as out:
        _tar(out, {"etc/os-release": b'ID=debian\n', "bin/bash": b"not really\n"})
    try:
        image_id = engine.build_rootfs(rootfs, tag, Arch.ARM64)
        assert engine.image_id(tag, Arch.ARM64) == image_id  # the arch a run and the cache check ask for
        attrs = engine.client.images.get(tag).attrs
        assert (attrs["Os"], attrs["Architecture"], attrs.get("Variant")) == ("linux", "arm64", "v8")
        config = attrs["Config"]
        assert config["Cmd"] == ["bash"] and config["Labels"] == {LABEL: "true"}
        assert config["Env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        assert len(attrs["RootFS"]["Layers"]) == 1
        # loading it again (another engine, or after a prune) gives the same image
        engine.remove_image(tag)
        assert engine.build_rootfs(rootfs, tag, Arch.ARM64) == image_id
    finally:
        engine.remove_image(tag)


def _read(engine, ref: str, path: str) -> bytes:
    container = engine.client.containers.create(ref, command=["none"])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            return tar.extractfile(path.rsplit("/", 1)[-1]).read()
    finally:
        container.remove()


def test_a_layer_stacked_on_an_image_keeps_its_layers_and_config_and_adds_one(engine_and_ref):
    """Engine.stack_layer: the case's venv packages as one layer on the image's own steps, with no
    COPY: the parent's layers are the same ones (by digest), its config stays, the new files are there."""
    engine, parent = engine_and_ref
    engine.import_layer(lambda out: _tar(out, {"etc/base.txt": b"from the parent\n"}), parent)
    stacked = parent + "-stacked"
    try:
        image_id = engine.stack_layer(parent, lambda out: _tar(out, {"opt/venv/lib/pkg.py": b"X = 1\n"}),
                                      stacked, Arch.ARM64, "test: one more layer")
        before = engine.client.images.get(parent).attrs
        after = engine.client.images.get(stacked).attrs
        assert after["Id"] == image_id
        assert after["RootFS"]["Layers"][:-1] == before["RootFS"]["Layers"] and len(after["RootFS"]["Layers"]) == 2
        assert after["Config"]["Labels"].get(LABEL) == "true"  # the parent's config, its label included
        assert _read(engine, stacked, "/etc/base.txt") == b"from the parent\n"
        assert _read(engine, stacked, "/opt/venv/lib/pkg.py") == b"X = 1\n"
    finally:
        engine.remove_image(stacked)


@pytest.mark.parametrize("wrong", ["digest", "size"])
def test_a_layer_streamed_under_its_counted_digest_and_one_counted_wrong(engine_and_ref, wrong):
    """With the layer's digest and size counted before (when the site tree was made), it is
    streamed with no temporary file; when the tree no longer matches them (changed in the cache),
    the engine refuses that load and the lab counts the layer again, so the image is still right."""
    engine, parent = engine_and_ref
    engine.import_layer(lambda out: _tar(out, {"etc/base.txt": b"from the parent\n"}), parent)
    layer = io.BytesIO()
    files = {"opt/venv/lib/pkg.py": b"X = 1\n", "opt/venv/lib/big.bin": bytes(range(256)) * 9_000}
    _tar(layer, files)
    digest, size = hashlib.sha256(layer.getvalue()).hexdigest(), len(layer.getvalue())
    streamed, recounted = parent + "-streamed", parent + "-recounted"
    bad = ("0" * 64, size) if wrong == "digest" else (digest, size + 512)
    writes: list[str] = []

    def write(out, ref: str) -> None:
        writes.append(ref)
        _tar(out, files)

    try:
        engine.stack_layer(parent, lambda out: write(out, streamed), streamed, Arch.ARM64, "test",
                           known=(digest, size))
        engine.stack_layer(parent, lambda out: write(out, recounted), recounted, Arch.ARM64, "test", known=bad)
        assert writes == [streamed, recounted, recounted]  # streamed once; the wrong count: once more
        layers = [engine.client.images.get(ref).attrs["RootFS"]["Layers"] for ref in (streamed, recounted)]
        assert layers[0] == layers[1] and layers[0][-1] == f"sha256:{digest}"
        assert _read(engine, recounted, "/opt/venv/lib/big.bin") == files["opt/venv/lib/big.bin"]
    finally:
        engine.remove_image(streamed)
        engine.remove_image(recounted)
