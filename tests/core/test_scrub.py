"""Tests for lab.scrub: each rule on its own, then scrub_text on real run-folder texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lab.core.scrub import (
    MASK,
    home_to_tilde,
    is_secret_name,
    is_secret_url,
    redact_secrets,
    redact_url,
    redact_urls,
    scrub_env,
    scrub_text,
    secret_urls,
    secret_values,
    strip_url_credentials,
)

RUN = Path(__file__).resolve().parents[1] / "data" / "run-folders" / "20261122T120958Z-torch2.5.1-arm64"  # a real run


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", [
    "GH_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "github_token", "TOKEN", "ACCESSTOKEN",
    "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "API_KEY", "apikey", "OPENAI_API_KEY", "SSH_PRIVATE_KEY",
    "DB_PASSWORD", "MYSQL_ROOT_PASSWD", "GPG_PASSPHRASE", "GOOGLE_APPLICATION_CREDENTIALS", "PIP_CREDENTIAL",
    "NPM_CONFIG__AUTH", "PIP_AUTH", "AUTH", "AUTH_HEADER", "HTTP_AUTHORIZATION", "CLIENT_SECRET",
    "KEYRING_PASSWORD", "KEYBOARD_TOKEN", "SSH_AUTH_SOCK",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "PATH", "HOME", "PWD", "OLDPWD", "OMP_NUM_THREADS", "PIP_INDEX_URL", "PIP_CERT", "LANG",
    # Whole words that only look like a secret: dropping them would cost the reproduction, and
    # masking their values ("subprocess", "false", a name) would blank out ordinary words in logs.
    "KEYBOARD_LAYOUT", "XKB_KEYMAP", "PIP_KEYRING_PROVIDER", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL", "AUTHOR", "OAUTHLIB_INSECURE_TRANSPORT_X", "MONOPASS",
])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_scrub_env() -> None:
    kept, dropped = scrub_env({
        "PATH": "/usr/bin", "GH_TOKEN": "ghp_x", "API_KEY": "k", "TOKENIZERS_PARALLELISM": "false",
        "PIP_INDEX_URL": "https://ana:hunter22@pypi.example/simple",
    })
    assert kept == {"PATH": "/usr/bin", "TOKENIZERS_PARALLELISM": "false",
                    "PIP_INDEX_URL": "https://pypi.example/simple"}
    assert dropped == ["API_KEY", "GH_TOKEN"]


def test_secret_values_skip_short_ones() -> None:
    env = {"A_TOKEN": "12345", "B_KEY": "123456", "C_PASSWORD": "longer-one", "PATH": "/usr/local/bin"}
    assert secret_values(env) == ["longer-one", "123456"]


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(("text", "expected"), [
    ("https://ana:hunter22@pypi.example/simple", "https://pypi.example/simple"),
    ("index-url = https://__token__:pypi-AgEI@upload.pypi.org/legacy/",
     "index-url = https://upload.pypi.org/legacy/"),
    ("git+https://ghp_abc@github.com/o/r.git@v1", "git+https://github.com/o/r.git@v1"),
    ("http://u:p@ss@proxy:3128", "http://proxy:3128"),  # an unencoded @ in the password
    ('{"url": "https://u:p@h/x"}', '{"url": "https://h/x"}'),
    ("see <https://u:p@h/x> and `https://t@h`", "see <https://h/x> and `https://h`"),
    ("two https://a@x/ https://b:c@y/", "two https://x/ https://y/"),
    ("https://pypi.org/simple/torch/ mail me@example.com", "https://pypi.org/simple/torch/ mail me@example.com"),
    ("https://h/path@v1?q=a@b#x@y", "https://h/path@v1?q=a@b#x@y"),  # @ after the host is not user info
    ("file:///root/wheels", "file:///root/wheels"),
    ("no url here", "no url here"),
])
def test_strip_url_credentials(text: str, expected: str) -> None:
    assert strip_url_credentials(text) == expected


def test_strip_url_credentials_in_pip_conf() -> None:
    conf = "[global]\nindex-url = https://ana:s3cr3t@mirror.example/simple\nextra-index-url =\n  https://tok@b/\n"
    out = strip_url_credentials(conf)
    assert "s3cr3t" not in out and "tok@" not in out
    assert "index-url = https://mirror.example/simple" in out and "  https://b/" in out


# --------------------------------------------------------------------------- home


@pytest.mark.parametrize(("text", "expected"), [
    ("/home/ana/x.py", "~/x.py"),
    ("/home/ana", "~"),
    ('"/home/ana/.cache"', '"~/.cache"'),
    ("cd /home/ana && ls", "cd ~ && ls"),
    ("PATH=/home/ana/bin:/usr/bin", "PATH=~/bin:/usr/bin"),
    ("x:/home/ana/bin", "x:~/bin"),
    ("/home/anabel/x", "/home/anabel/x"),
    ("/srv/home/ana/x", "/srv/home/ana/x"),
    ("/home/ana.bak/x", "/home/ana.bak/x"),
    ("/home/ana-old", "/home/ana-old"),
    ("~/home/ana", "~/home/ana"),
])
def test_home_to_tilde(text: str, expected: str) -> None:
    assert home_to_tilde(text, "/home/ana") == expected
    assert home_to_tilde(text, "/home/ana/") == expected


def test_home_to_tilde_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_to_tilde(f"at {tmp_path}/x") == "at ~/x"
    monkeypatch.setenv("HOME", "/")
    assert home_to_tilde("/usr/bin") == "/usr/bin"  # a home of / is never replaced


# --------------------------------------------------------------------------- assignments


@pytest.mark.parametrize(("text", "expected"), [
    ("GH_TOKEN=ghp_abc\n", f"GH_TOKEN={MASK}\n"),
    ("docker run -e HF_TOKEN=hf_x -e OMP_NUM_THREADS=2 img", f"docker run -e HF_TOKEN={MASK} -e OMP_NUM_THREADS=2 img"),
    ('export API_KEY="a b c"; echo', f"export API_KEY={MASK}; echo"),
    ("ENV DB_PASSWORD='x y' LANG=C", f"ENV DB_PASSWORD={MASK} LANG=C"),
    ("env:\n  HF_TOKEN: hf_abc\n  OMP_NUM_THREADS: '2'\n", f'env:\n  HF_TOKEN: "{MASK}"\n  OMP_NUM_THREADS: \'2\'\n'),
    ("- API_KEY: x # c\n", f'- API_KEY: "{MASK}"\n'),
    ('{"GH_TOKEN": "ghp_\\"q", "N": "1"}', f'{{"GH_TOKEN": "{MASK}", "N": "1"}}'),
    ("{'AWS_SECRET_ACCESS_KEY': 'abc'}", f"{{'AWS_SECRET_ACCESS_KEY': '{MASK}'}}"),
    ("Authorization: Basic YW5hOmh1bnRlcjI=\n", f"Authorization: {MASK}\n"),
    ("  proxy-authorization: Bearer t\n", f"  proxy-authorization: {MASK}\n"),
    # Program text and harmless names stay as they are.
    ("sorted(x, key=len)\napi_key = 'not an env var'\n", "sorted(x, key=len)\napi_key = 'not an env var'\n"),
    ("TOKENIZERS_PARALLELISM=false KEYBOARD: us", "TOKENIZERS_PARALLELISM=false KEYBOARD: us"),
    ("GH_TOKEN=\n", "GH_TOKEN=\n"),
])
def test_assignments(text: str, expected: str) -> None:
    assert scrub_text(text, env={}, home="/nonexistent-home") == expected


def test_masked_yaml_stays_yaml() -> None:
    text = "env:\n  HF_TOKEN: hf_abcdef\n  N: '1'\nlist:\n- API_KEY: zz\n"
    data = yaml.safe_load(scrub_text(text, env={}))
    assert data == {"env": {"HF_TOKEN": MASK, "N": "1"}, "list": [{"API_KEY": MASK}]}


def test_masked_json_stays_json() -> None:
    text = json.dumps({"env": {"GH_TOKEN": 'ghp_"x', "N": "1"}, "url": "https://a:b@h/"}, indent=2)
    assert json.loads(scrub_text(text, env={})) == {"env": {"GH_TOKEN": MASK, "N": "1"}, "url": "https://h/"}


# --------------------------------------------------------------------------- scrub_text


def test_scrub_text_all_rules() -> None:
    env = {"HOME": "/home/ana", "MY_TOKEN": "tok-123456789", "SHORT_KEY": "abc", "PATH": "/usr/bin"}
    text = ("pip: Looking in indexes: https://ana:pw@idx.example/simple\n"
            "File \"/home/ana/proj/repro.py\", line 3\n"
            "the token tok-123456789 leaked, and abc is an ordinary word\n")
    out = scrub_text(text, env=env)
    assert out == ("pip: Looking in indexes: https://idx.example/simple\n"
                   "File \"~/proj/repro.py\", line 3\n"
                   f"the token {MASK} leaked, and abc is an ordinary word\n")


def test_scrub_text_secret_recreated_by_a_removal() -> None:
    # Removing user info joins "https://" and "host": a secret spanning the join is masked anyway.
    env = {"X_TOKEN": "s://host"}
    assert "s://host" not in scrub_text("https://me@host/", env=env)


def test_scrub_text_default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_TEST_SECRET", "from-the-environment")
    assert scrub_text("x from-the-environment y") == f"x {MASK} y"


def test_scrub_text_keeps_real_run_texts() -> None:
    """Nothing to hide in the sample run: scrubbing leaves its texts as they are (no false positives)."""
    for name in ("result.json", "scenario.yaml", "report.md", "collect_env.txt", "build.log", "stderr.txt",
                 "Dockerfile", "lab/pip.conf", "repro/libgomp_aarch64.py", "out/ld/ld.1"):
        text = (RUN / name).read_text()
        assert scrub_text(text, env={}, home="/home/nobody-here") == text, name


name_chars = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789")


@settings(derandomize=True, database=None, deadline=None, max_examples=400)
@given(
    secret=st.text(min_size=6, max_size=40),
    prefix=st.text(max_size=60),
    suffix=st.text(max_size=60),
    name=st.tuples(st.text(name_chars, max_size=8), st.sampled_from(["TOKEN", "KEY", "SECRET", "PASSWORD"]),
                   st.text(name_chars, max_size=8)).map("".join),
    wrap=st.sampled_from(["{}", "https://{}@host/", "https://u:{}@h/", "X={}", '"{}"', "{}{}", "/home/ana/{}"]),
)
def test_planted_secret_never_survives(secret: str, prefix: str, suffix: str, name: str, wrap: str) -> None:
    assume(is_secret_name(name))  # e.g. not TOKEN + IZERS
    env = {name: secret, "HOME": "/home/ana", "PATH": "/usr/bin"}
    text = prefix + wrap.format(secret, secret) + suffix
    assert secret not in scrub_text(text, env=env)


# --------------------------------------------------------------------------- index and mirror URLs (issue 33)

USERINFO = "https://ana:7f3aUSERtok9c2e@pkgs.example.com/simple"
PATH = "https://pkgs.example.com:8443/7f3aPATHtok9c2e5b1d/simple/"           # Gemfury, Artifactory
QUERY = "https://links.example.org/wheels/?token=7f3aQUERYtok9c2e&x=1"


@pytest.mark.parametrize("url,redacted", [
    (USERINFO, "https://pkgs.example.com/…"),
    (PATH, "https://pkgs.example.com:8443/…"),
    (QUERY, "https://links.example.org/…"),
    ("http://mirror.corp/debian", "http://mirror.corp/…"),           # no token at all: still a secret
    ("https://[::1]:3141/root/pypi/+simple/", "https://[::1]:3141/…"),
    ("https://pypi.org/simple?token=x1", "https://pypi.org/…"),     # a public host with a query
    ("https://__token__:x@download.pytorch.org/whl/cpu", "https://download.pytorch.org/…"),
])
def test_a_whole_index_or_mirror_url_is_a_secret(url, redacted):
    assert is_secret_url(url)
    assert redact_url(url) == redacted


@pytest.mark.parametrize("url", ["https://pypi.org/simple", "https://download.pytorch.org/whl/cpu",
                                 "http://deb.debian.org/debian", "/opt/wheels", "file:///opt/pypi/simple",
                                 "not a url", ""])
def test_bare_public_urls_and_local_folders_are_not_secrets(url):
    assert not is_secret_url(url) and redact_url(url) == url


@pytest.mark.parametrize("secret", [USERINFO, PATH, QUERY])
def test_every_url_on_a_secret_urls_host_is_redacted_in_a_text(secret):
    text = ("Looking in indexes: https://ana:****@pkgs.example.com/simple, "
            "https://pkgs.example.com:8443/7f3aPATHtok9c2e5b1d/simple/\n"
            "  Fetched page https://pkgs.example.com:8443/7f3aPATHtok9c2e5b1d/simple/torch/ (as HTML)\n"
            "GET https://links.example.org/wheels/?token=7f3aQUERYtok9c2e&x=1.\n"
            "also https://pypi.org/simple/torch/ and https://pkgs.example.com.evil/x and http://links.example.org:81/y\n")
    out = redact_urls(text, [secret])
    host = secret.split("/")[2].rsplit("@", 1)[-1]
    assert host + "/…" in out
    for piece in ("7f3aUSERtok9c2e", "7f3aPATHtok9c2e5b1d", "7f3aQUERYtok9c2e", "ana:"):
        if piece.split(":")[0] in secret:
            assert piece not in out
    # other hosts, and another port of the same host, are left alone
    assert "https://pypi.org/simple/torch/" in out and "https://pkgs.example.com.evil/x" in out
    assert "http://links.example.org:81/y" in out


def test_a_secret_urls_pieces_are_masked_outside_a_url_too():
    text = ("apt list: pkgs.example.com:8443_7f3aPATHtok9c2e5b1d_simple_Packages; token 7f3aQUERYtok9c2e; "
            "ana 7f3aUSERtok9c2e")
    out = redact_urls(text, [USERINFO, PATH, QUERY])
    assert "7f3aPATHtok9c2e5b1d" not in out and "7f3aQUERYtok9c2e" not in out and "7f3aUSERtok9c2e" not in out
    assert "_simple_Packages" in out  # short, word-like segments stay


def test_secret_urls_come_from_pips_settings_and_the_debian_mirror(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {USERINFO}\nfind-links = /opt/wheels {QUERY}\n")
    env = {"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf),
           "PIP_EXTRA_INDEX_URL": f"https://pypi.org/simple {PATH}", "LAB_DEBIAN_MIRROR": "http://u:7f3aMIRRORtok9c@mirror.corp/debian"}
    assert set(secret_urls(env)) == {USERINFO, PATH, QUERY, "http://u:7f3aMIRRORtok9c@mirror.corp/debian"}
    text = f"{USERINFO} {PATH} {QUERY} http://mirror.corp/debian/dists/bookworm/InRelease"
    out = redact_secrets(text, env)
    assert out == ("https://pkgs.example.com/… https://pkgs.example.com:8443/… https://links.example.org/… "
                   "http://mirror.corp/…")
    assert scrub_text(text, env, home=str(tmp_path)) == out


def test_a_sentence_keeps_its_punctuation_after_a_redacted_url():
    assert redact_urls(f"could not read {PATH}.", [PATH]) == "could not read https://pkgs.example.com:8443/…."
    assert redact_urls(f"({PATH}), next", [PATH]) == "(https://pkgs.example.com:8443/…), next"
