from pathlib import Path

from packaging.tags import Tag

from lab.image.hostpip import HostPip, discover, local_wheels

TAGS_X86 = frozenset({Tag("cp311", "cp311", "manylinux_2_28_x86_64"), Tag("py3", "none", "any")})
TAGS_ARM = frozenset({Tag("cp311", "cp311", "manylinux_2_28_aarch64"), Tag("py3", "none", "any")})


def test_discover_reads_pip_conf_and_env_overrides(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("CERT")
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n"
                    "extra-index-url = https://a.example/simple file:///opt/local/simple\n"
                    "find-links = /opt/wheels\n")
    host = discover({"HOME": str(tmp_path / "nohome"), "PIP_CONFIG_FILE": str(conf),
                     "PIP_CERT": str(ca), "PIP_INDEX_URL": "https://override.example/simple",
                     "HTTPS_PROXY": "http://proxy:3128"})
    assert host.index_url == "https://override.example/simple"
    assert host.extra_index_urls == ("https://a.example/simple", "file:///opt/local/simple")
    assert host.remote_indexes == ("https://a.example/simple",)
    assert host.local_sources == ("/opt/wheels", "file:///opt/local/simple")
    assert host.ca_bundle == ca
    assert host.proxies == (("HTTPS_PROXY", "http://proxy:3128"),)


def test_ca_bundle_from_ssl_cert_file_and_missing_file_ignored(tmp_path: Path):
    ca = tmp_path / "bundle.crt"
    ca.write_text("x")
    assert discover({"HOME": str(tmp_path), "SSL_CERT_FILE": str(ca)}).ca_bundle == ca
    assert discover({"HOME": str(tmp_path), "PIP_CERT": str(tmp_path / "nope")}).ca_bundle is None


def test_pip_conf_for_the_image_keeps_public_remote_settings_and_replaces_local_ones():
    host = HostPip(index_url="https://pypi.org/simple",
                   extra_index_urls=("https://download.pytorch.org/whl/cpu", "https://a.example/simple",
                                     "file:///opt/pypi/simple"),
                   find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    conf = host.pip_conf("/etc/lab/ca.crt", "/lab/wheels")
    assert "cert = /etc/lab/ca.crt" in conf
    assert "index-url = https://pypi.org/simple" in conf
    assert "extra-index-url = https://download.pytorch.org/whl/cpu\n" in conf  # a.example's URL is a secret
    assert "a.example" not in conf
    assert "find-links = /lab/wheels\n" in conf
    assert "/opt/" not in conf
    assert "cert" not in HostPip().pip_conf(None, "/lab/wheels")


def _touch(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"wheel")
    return path


def test_local_wheels_from_find_links_pick_newest_matching_version_and_platform(tmp_path: Path):
    links = tmp_path / "wheels"
    cpu = _touch(links, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    _touch(links, "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    _touch(links, "torch-2.13.0-cp310-cp310-manylinux_2_28_x86_64.whl")
    _touch(links, "numpy-2.0.0-cp311-cp311-manylinux_2_28_aarch64.whl")
    host = HostPip(find_links=(str(links),))
    assert local_wheels(host, ["torch==2.13.0"], TAGS_X86) == [cpu]
    assert local_wheels(host, ["torch==2.13.0+cpu"], TAGS_X86) == [cpu]
    assert local_wheels(host, ["torch==2.5.1"], TAGS_X86) == []
    assert local_wheels(host, ["torch==2.13.0"], TAGS_ARM) == []
    assert [p.name for p in local_wheels(host, ["numpy"], TAGS_ARM)] == [
        "numpy-2.0.0-cp311-cp311-manylinux_2_28_aarch64.whl"]


def test_local_wheels_from_a_file_simple_index(tmp_path: Path):
    files = tmp_path / "files"
    whl = _touch(files, "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    _touch(files, "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    page = tmp_path / "simple" / "numpy" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text('<a href="../../files/numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl'
                    '#sha256=00">x</a><a href="../../files/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.'
                    'manylinux2014_x86_64.whl">y</a>')
    host = HostPip(extra_index_urls=((tmp_path / "simple").as_uri(),))
    tags = frozenset({Tag("cp311", "cp311", "manylinux_2_17_x86_64")})
    assert local_wheels(host, ["numpy<3"], tags) == [whl]
    assert [p.name for p in local_wheels(host, ["numpy<2"], tags)] == [
        "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]


def test_uv_gets_the_same_sources_explicitly_and_sees_every_index():
    host = HostPip(index_url="https://mirror.example/simple",
                   extra_index_urls=("https://a.example/simple", "file:///opt/pypi/simple"),
                   find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    args = host.uv_args()
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's behaviour, not uv's first-index
    pairs = list(zip(args[2::2], args[3::2], strict=True))
    assert pairs == [("--index-url", "https://mirror.example/simple"),
                     ("--extra-index-url", "https://a.example/simple"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--find-links", "/opt/wheels"), ("--allow-insecure-host", "mirror.example")]
    assert HostPip().uv_args() == ["--index-strategy", "unsafe-best-match"]


def test_uv_env_carries_the_ca_and_proxies_and_drops_uv_settings(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("CERT")
    host = HostPip(ca_bundle=ca, proxies=(("HTTPS_PROXY", "http://proxy:3128"),))
    env = host.uv_env({"PATH": "/bin", "UV_INDEX_URL": "https://elsewhere.example/simple", "UV_TORCH_BACKEND": "cu126"})
    assert env == {"PATH": "/bin", "SSL_CERT_FILE": str(ca), "HTTPS_PROXY": "http://proxy:3128"}
    assert host.index_settings() == HostPip(ca_bundle=None).index_settings()  # the CA decides no wheel
