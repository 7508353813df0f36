"""Which base a case gets (lab.image.base.ensure_base): present, bootstrapped with the case's
packages included, or the plain bootstrap when that fails. The engine and mmdebstrap are fakes
here; tests/test_e2e.py builds real bases."""

from __future__ import annotations

import pytest

from lab.core.arch import Arch
from lab.core.errors import BaseImageError, BuildError
from lab.image import base as base_mod
from lab.image.base import bootstrap_command, bootstrap_tag, ensure_base

PKGS = ("python3-dev", "g++", "python3", "ca-certificates", "python3-venv")


class FakeEngine:
    arch = Arch.AMD64  # the host's

    def __init__(self, images=()):
        self.images = {tag: f"sha256:{i}" for i, tag in enumerate(images)}
        self.built = []

    def image_id(self, ref, arch=None):
        return self.images.get(ref)

    def pull(self, ref, arch):
        return None  # no registry, as on these machines

    def build_rootfs(self, rootfs, tag, arch):
        self.built.append(tag)
        self.images[tag] = f"sha256:new{len(self.built)}"
        return self.images[tag]


@pytest.fixture
def mmdebstrap(monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(base_mod.shutil, "which", lambda name: "/usr/bin/" + name)
    calls = []

    def run(cmd, events, fail_with_include=False):
        calls.append(cmd)
        if run.fail and any(c.startswith("--include=") for c in cmd):
            if run.fail == "unknown":
                raise base_mod.UnknownPackageError("mmdebstrap failed (exit 100): no package lab-no-such",
                                                   ("lab-no-such",), "E: Unable to locate package lab-no-such\n")
            raise BaseImageError("mmdebstrap failed (exit 1): E: Sub-process /usr/bin/dpkg returned an error code (1)")
        (base_mod.Path(cmd[-2])).write_bytes(b"rootfs")

    run.fail = False
    run.calls = calls
    monkeypatch.setattr(base_mod, "_run_mmdebstrap", run)
    return run


def test_the_tag_and_command_name_the_package_set_in_any_order():
    tag = bootstrap_tag("bookworm", Arch.ARM64, PKGS)
    assert tag.startswith("torch-repro-lab/debian:bookworm-arm64-") and len(tag.rpartition("-")[2]) == 12
    assert tag == bootstrap_tag("bookworm", Arch.ARM64, tuple(reversed(PKGS)) + ("g++",))
    assert bootstrap_tag("bookworm", Arch.ARM64) == "torch-repro-lab/debian:bookworm-arm64"
    cmd = bootstrap_command("bookworm", Arch.ARM64, base_mod.Path("r.tar"), PKGS)
    assert "--include=ca-certificates,g++,python3,python3-dev,python3-venv" in cmd
    assert cmd.index("--include=ca-certificates,g++,python3,python3-dev,python3-venv") < cmd.index("bookworm")


def test_bookworm_and_later_get_a_merged_usr_as_the_official_images_have_it(monkeypatch, tmp_path):
    monkeypatch.setattr(base_mod, "MERGED_USR_HOOKS", tmp_path)  # mmdebstrap's hook folder
    hook = f"--hook-dir={tmp_path}"
    for suite in ("bookworm", "trixie"):
        assert hook in bootstrap_command(suite, Arch.ARM64, base_mod.Path("r.tar"), PKGS)
    assert hook not in bootstrap_command("bullseye", Arch.AMD64, base_mod.Path("r.tar"))
    monkeypatch.setattr(base_mod, "MERGED_USR_HOOKS", tmp_path / "absent")  # an mmdebstrap without it
    cmd = bootstrap_command("bookworm", Arch.ARM64, base_mod.Path("r.tar"))
    assert not any(a.startswith("--hook-dir") for a in cmd)


def test_an_emulated_bootstrap_decompresses_and_byte_compiles_natively_and_undoes_it_last(monkeypatch):
    """With a static busybox, a Debian python3.X and perl on the host, an arm64 bootstrap diverts
    dpkg-deb, py_compile.py and perl before the essential packages are installed; the customize
    hooks undo the diversions in the reverse order."""
    monkeypatch.setattr(base_mod.nativeunpack, "static_busybox", lambda: base_mod.Path("/bin/busybox"))
    monkeypatch.setattr(base_mod.nativepython, "host_pythons", lambda: [base_mod.Path("/usr/bin/python3.11")])
    monkeypatch.setattr(base_mod.nativeperl, "host_perl", lambda: base_mod.Path("/usr/bin/perl"))
    monkeypatch.setattr(base_mod, "host_arch", lambda: Arch.AMD64)
    monkeypatch.setattr(base_mod.shutil, "which", lambda name: f"/usr/bin/{name}")  # openssl, ldd
    hooks = [a for a in bootstrap_command("bookworm", Arch.ARM64, base_mod.Path("r.tar"), PKGS)
             if a.startswith(("--extract-hook", "--essential-hook", "--customize-hook"))]
    modules = ("nativeunpack", "nativepython", "nativeperl", "cacerts")
    assert [(h.split("=", 1)[0], [m for m in modules if m in h]) for h in hooks] == [
        ("--extract-hook", ["nativeunpack"]), ("--extract-hook", ["nativepython"]),
        ("--extract-hook", ["nativeperl"]), ("--essential-hook", ["cacerts"]), ("--customize-hook", ["cacerts"]),
        ("--customize-hook", ["nativeperl"]), ("--customize-hook", ["nativepython"]),
        ("--customize-hook", ["nativeunpack"])]
    assert hooks[0].endswith('divert "$1" /bin/busybox') and hooks[-1].endswith('restore "$1"')
    assert hooks[1].endswith('divert "$1" /usr/bin/python3.11') and hooks[2].endswith('divert "$1" /usr/bin/perl')
    native = bootstrap_command("bookworm", Arch.AMD64, base_mod.Path("r.tar"), PKGS)  # all are native there
    assert not [a for a in native if "nativeunpack" in a or "nativepython" in a or "nativeperl" in a]
    monkeypatch.setattr(base_mod.nativeunpack, "static_busybox", lambda: None)  # no busybox-static
    monkeypatch.setattr(base_mod.nativepython, "host_pythons", lambda: [])  # no Debian python3.X
    monkeypatch.setattr(base_mod.nativeperl, "host_perl", lambda: None)  # no ldd
    assert not [a for a in bootstrap_command("bookworm", Arch.ARM64, base_mod.Path("r.tar"), PKGS)
                if "nativeunpack" in a or "nativepython" in a or "nativeperl" in a]


def test_mmdebstrap_messages_are_progress_and_what_apt_says_in_a_hook_is_detail():
    said = []
    script = "echo 'I: installing essential packages...'; echo '(Reading database ... 5%'; " \
             "echo 'I: running --customize-hook in shell: sh -c x exec /tmp/mm'; " \
             "echo 'ca-certificates: updated on the host'; echo 'W: a warning' >&2"
    base_mod._run_mmdebstrap(["sh", "-c", script], lambda stage, text: said.append((stage, text)))
    assert said == [("base", "I: installing essential packages..."), ("bootstrap", "(Reading database ... 5%"),
                    ("bootstrap", "I: running --customize-hook in shell: sh -c x exec /tmp/mm"),
                    ("base", "ca-certificates: updated on the host"), ("base", "W: a warning")]


def test_a_bootstrapped_base_includes_the_cases_packages(mmdebstrap):
    engine = FakeEngine(images=["torch-repro-lab/debian:bookworm-arm64"])  # a plain one is not enough
    got = ensure_base(engine, "debian:bookworm", Arch.ARM64, lambda *a: None, PKGS)
    assert got.ref == bootstrap_tag("bookworm", Arch.ARM64, PKGS) and engine.built == [got.ref]
    assert "--include=" in got.recipe
    again = ensure_base(engine, "debian:bookworm", Arch.ARM64, lambda *a: None, PKGS)
    assert again.image_id == got.image_id and len(mmdebstrap.calls) == 1  # reused


def test_the_bootstrap_says_how_long_it_takes_emulated_or_not(mmdebstrap):
    said = []
    ensure_base(FakeEngine(), "debian:bookworm", Arch.ARM64, lambda stage, text: said.append(text), PKGS)
    ensure_base(FakeEngine(), "debian:bookworm", Arch.AMD64, lambda stage, text: said.append(text), PKGS)
    arm64, amd64 = (next(s for s in said if "mmdebstrap" in s and f"for {a}" in s) for a in ("arm64", "amd64"))
    assert "(about 60 s, emulated)" in arm64 and "(about a minute)" in amd64


def test_a_package_set_debian_cannot_include_falls_back_to_the_plain_base_once(mmdebstrap):
    mmdebstrap.fail = True
    engine, said = FakeEngine(), []
    pkgs = (*PKGS, "lab-no-such")
    got = ensure_base(engine, "debian:bookworm", Arch.AMD64, lambda stage, text: said.append(text), pkgs)
    assert got.ref == "torch-repro-lab/debian:bookworm-amd64"
    assert any("could not be made" in s and "apt step" in s for s in said)
    calls = len(mmdebstrap.calls)
    again = ensure_base(engine, "debian:bookworm", Arch.AMD64, lambda *a: None, pkgs)
    assert again.ref == got.ref and len(mmdebstrap.calls) == calls  # not tried again


def test_a_package_the_suite_does_not_have_fails_the_build_at_once_with_mmdebstraps_words(mmdebstrap):
    """No plain base and no apt step after it: they would fail the same way, minutes later."""
    mmdebstrap.fail = "unknown"
    engine = FakeEngine()
    with pytest.raises(BuildError) as err:
        ensure_base(engine, "debian:bookworm", Arch.AMD64, lambda *a: None, (*PKGS, "lab-no-such"))
    assert "Debian bookworm has no package named lab-no-such" in err.value.message
    assert "Unable to locate package lab-no-such" in err.value.log
    assert len(mmdebstrap.calls) == 1 and engine.built == []


def test_mmdebstrap_naming_an_unknown_package_is_told_apart_from_another_failure():
    script = ("echo 'I: installing remaining packages inside the chroot...'; "
              "echo 'E: Unable to locate package lab-typo'; "
              "echo \"E: Package 'python3-old' has no installation candidate\"; exit 1")
    with pytest.raises(base_mod.UnknownPackageError) as err:
        base_mod._run_mmdebstrap(["sh", "-c", script], lambda *a: None)
    assert err.value.packages == ("lab-typo", "python3-old") and "lab-typo" in err.value.log
    with pytest.raises(BaseImageError) as other:
        base_mod._run_mmdebstrap(["sh", "-c", "echo 'E: Sub-process returned an error code (1)'; exit 1"],
                                 lambda *a: None)
    assert not isinstance(other.value, base_mod.UnknownPackageError)


def test_a_base_the_engine_has_is_used_as_it_is(mmdebstrap):
    engine = FakeEngine(images=["debian:bookworm"])
    got = ensure_base(engine, "debian:bookworm", Arch.AMD64, lambda *a: None, PKGS)
    assert got.origin == "local" and got.ref == "debian:bookworm" and not mmdebstrap.calls


def test_a_secret_mirror_is_used_but_named_redacted_and_not_left_in_the_bases_sources(monkeypatch):
    """Issue 33: the recipe (scenario.yaml's resolved.base.recipe) names the mirror redacted, and the
    rootfs's sources.list names Debian's public archive; mmdebstrap alone gets the mirror."""
    mirror = "http://u:7f3aMIRRORtok9c@mirror.corp/7f3aMIRRORpath9c/debian"
    monkeypatch.setenv("LAB_DEBIAN_MIRROR", mirror)
    cmd = bootstrap_command("bookworm", Arch.AMD64, base_mod.Path("r.tar"), PKGS)
    assert cmd[-1] == mirror
    [hook] = [c for c in cmd if c.startswith("--customize-hook=") and "sources.list" in c]
    assert "deb http://deb.debian.org/debian bookworm main" in hook and '"$1/etc/apt/sources.list"' in hook
    recipe = base_mod._recipe("bookworm", Arch.AMD64, PKGS)
    assert "7f3aMIRROR" not in recipe and "u:" not in recipe and "http://mirror.corp/…" in recipe
    monkeypatch.setenv("LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    assert not any("sources.list" in c for c in bootstrap_command("bookworm", Arch.AMD64,
                                                                                 base_mod.Path("r.tar"), PKGS))


def test_the_bootstrap_progress_names_a_secret_mirror_redacted(mmdebstrap, monkeypatch):
    monkeypatch.setenv("LAB_DEBIAN_MIRROR", "https://mirror.corp/debian?key=7f3aMIRRORtok9c")
    said = []
    ensure_base(FakeEngine(), "debian:bookworm", Arch.AMD64, lambda stage, m: said.append(m))
    assert any("https://mirror.corp/…" in m for m in said) and not any("7f3aMIRROR" in m for m in said)
