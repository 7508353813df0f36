"""lab.image.cacerts: ca-certificates' update done on the host during a bootstrap.

The image's own update-ca-certificates is Debian's script; here the host's copy of it stands in
(the CI machines are Debian), run on a small tree, as the customize hook runs it; the diversion is
dpkg's file, edited on the host (lab.image.diversion). The bootstrap itself, and the comparison
with the tool run inside the image, are in tests/test_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lab.core.arch import Arch
from lab.image import cacerts
from lab.image.base import bootstrap_command

HOST_TOOL = Path(cacerts.TOOL)
MOZILLA = Path("/usr/share/ca-certificates/mozilla")
pytestmark = pytest.mark.skipif(not (HOST_TOOL.is_file() and shutil.which("openssl") and MOZILLA.is_dir()),
                                reason="needs Debian's ca-certificates and openssl on the host")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree as the bootstrap leaves it before the customize hook: the certificates unpacked, the
    conf written by the postinst (one certificate deselected), the tool diverted (where dpkg put
    the package's copy), a no-op in its place."""
    certs = sorted(MOZILLA.glob("*.crt"))[:3]
    (tmp_path / "usr/share/ca-certificates/mozilla").mkdir(parents=True)
    for crt in certs:
        shutil.copy(crt, tmp_path / "usr/share/ca-certificates/mozilla" / crt.name)
    (tmp_path / "etc/ssl/certs").mkdir(parents=True)
    (tmp_path / "etc/ca-certificates.conf").write_text(
        "# comment\n" + "".join(f"mozilla/{c.name}\n" for c in certs[:2]) + f"!mozilla/{certs[2].name}\n")
    (tmp_path / "usr/sbin").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/diversions").write_text(DASH)
    (tmp_path / "var/lib/dpkg/diversions-old").write_text("before\n")
    cacerts.divert(tmp_path)
    shutil.copy(HOST_TOOL, tmp_path / cacerts.DIVERTED.lstrip("/"))  # dpkg unpacks ca-certificates
    return tmp_path


DASH = "/bin/sh\n/bin/sh.distrib\ndash\n"


def test_during_the_bootstrap_the_tool_is_a_no_op(tree):
    root = tree
    stub = root / cacerts.TOOL.lstrip("/")
    assert subprocess.run(["sh", str(stub), "--fresh"]).returncode == 0 and "exit 0" in stub.read_text()
    assert (root / cacerts.DIVERTED.lstrip("/")).read_bytes() == HOST_TOOL.read_bytes()
    assert (root / "var/lib/dpkg/diversions").read_text() == f"{DASH}{cacerts.TOOL}\n{cacerts.DIVERTED}\n:\n"


def test_the_update_on_the_host_leaves_what_the_tool_leaves_in_the_image(tree):
    root = tree
    said = cacerts.update(root)
    certs = root / "etc/ssl/certs"
    enabled = sorted(MOZILLA.glob("*.crt"))[:2]
    assert said == "ca-certificates: 2 certificates linked in /etc/ssl/certs on the host"
    for crt in enabled:  # links as the image sees them, not through the host's folder
        assert os.readlink(certs / crt.name.replace(".crt", ".pem").replace(" ", "_")) == \
            f"/usr/share/ca-certificates/mozilla/{crt.name}"
    bundle = (certs / "ca-certificates.crt").read_bytes()
    assert bundle == b"".join(c.read_bytes() if c.read_bytes().endswith(b"\n") else c.read_bytes() + b"\n"
                              for c in enabled)
    hashes = [p for p in certs.iterdir() if p.name.endswith(".0")]
    assert len(hashes) == 2 and all(os.readlink(h).endswith(".pem") for h in hashes)  # openssl rehash's
    # the tool is Debian's again, and dpkg's diversions and dpkg-divert's backup are as before
    assert (root / cacerts.TOOL.lstrip("/")).read_bytes() == HOST_TOOL.read_bytes()
    assert not (root / cacerts.DIVERTED.lstrip("/")).exists()
    assert (root / "var/lib/dpkg/diversions").read_text() == DASH
    assert (root / "var/lib/dpkg/diversions-old").read_text() == "before\n"


def test_with_update_hooks_in_the_image_the_tool_runs_there(tree, monkeypatch):
    root = tree
    calls = []
    monkeypatch.setattr(cacerts, "_chroot", lambda root, *cmd: calls.append(cmd))  # needs an arm64 chroot
    (root / "etc/ca-certificates/update.d").mkdir(parents=True)
    (root / "etc/ca-certificates/update.d/jks-keystore").write_text("#!/bin/sh\n")
    assert "emulated" in cacerts.update(root)
    assert calls == [(cacerts.TOOL,)]
    assert not (root / "etc/ssl/certs/ca-certificates.crt").exists()  # left to the image's own run


def test_the_bootstrap_uses_the_hooks_only_with_ca_certificates():
    with_ca = bootstrap_command("bookworm", Arch.ARM64, Path("r.tar"), ("ca-certificates", "python3"))
    assert [a.split("=", 1)[0] for a in with_ca if a.startswith("--") and "cacerts" in a] == \
        ["--essential-hook", "--customize-hook"]
    assert not [a for a in bootstrap_command("bookworm", Arch.ARM64, Path("r.tar"), ("python3",)) if "cacerts" in a]
