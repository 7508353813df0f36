"""lab.config: sources and their precedence, relative paths, scenario folders, and one-paragraph
errors that name the file, the line and the key (or the variable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.core import config
from lab.core.arch import Arch
from lab.core.errors import ConfigError
from lab.core.resources import shipped_scenarios_dir
from lab.image.base import bootstrap_command
from tests.conftest import last_json, run_lab


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A user config file, a project with lab.toml, and a folder inside the project."""
    user = tmp_path / "xdg" / "lab" / "config.toml"
    user.parent.mkdir(parents=True)
    project = tmp_path / "proj"
    inside = project / "a" / "b"
    inside.mkdir(parents=True)
    return {"user": user, "project": project, "inside": inside, "root": tmp_path}


def load(tree, env=None, cwd=None) -> config.Settings:
    return config.load(env=env or {}, cwd=cwd or tree["inside"], user=tree["user"])


def test_defaults_without_files_or_environment(tree):
    s = load(tree)
    assert s.runs_dir == Path("runs") and s.cross_install is True and s.default_arch is None
    assert s.debian_mirror == "http://deb.debian.org/debian" and s["engines"] == () and s["cache_cap"] is None
    assert all(str(o) == "default" for o in s.origins.values())
    assert s.project_file is None


def test_precedence_flag_env_project_user_default(tree):
    tree["user"].write_text('runs_dir = "/u/runs"\ncross_install = false\ndefault_arch = "arm64"\n'
                            '[mirrors]\ndebian = "http://user.example/debian"\n')
    (tree["project"] / "lab.toml").write_text('runs_dir = "/p/runs"\ndefault_arch = "amd64"\n')
    s = load(tree, env={"LAB_RUNS_DIR": "/e/runs"})
    assert s.runs_dir == Path("/e/runs") and str(s.origins["runs_dir"]) == "environment LAB_RUNS_DIR"
    assert s.default_arch is Arch.AMD64 and s.origins["default_arch"].kind == "project"
    assert s.cross_install is False and s.origins["cross_install"] == config.Origin("user", str(tree["user"]))
    assert s.debian_mirror == "http://user.example/debian"
    assert s.origins["cache_dir"].kind == "default"
    flagged = s.with_flag("runs_dir", Path("/f/runs"), "--out")
    assert flagged.runs_dir == Path("/f/runs") and str(flagged.origins["runs_dir"]) == "flag --out"
    assert s.with_flag("runs_dir", None, "--out") is s  # a flag not given changes nothing


def test_the_nearest_lab_toml_upward_is_the_project_file(tree):
    (tree["project"] / "lab.toml").write_text('runs_dir = "outer"\n')
    (tree["project"] / "a" / "lab.toml").write_text('runs_dir = "inner"\n')
    s = load(tree)
    assert s.project_file == tree["project"] / "a" / "lab.toml"
    assert s.runs_dir == tree["project"] / "a" / "inner"  # relative to the file's folder


def test_relative_paths_in_the_environment_stay_relative_to_the_current_folder(tree):
    s = load(tree, env={"LAB_RUNS_DIR": "here", "LAB_CACHE_DIR": "~/c"})
    assert s.runs_dir == Path("here") and s.cache_dir == Path("~/c").expanduser()


def test_empty_variables_count_as_unset(tree):
    s = load(tree, env={"LAB_RUNS_DIR": "", "LAB_CROSS_INSTALL": " "})
    assert s.runs_dir == Path("runs") and s.cross_install is True


@pytest.mark.parametrize("raw, expected", [("0", False), ("off", False), ("no", False), ("1", True),
                                           ("true", True)])
def test_cross_install_reads_the_usual_booleans(tree, raw, expected):
    assert load(tree, env={"LAB_CROSS_INSTALL": raw}).cross_install is expected


def test_list_and_size_values(tree):
    s = load(tree, env={"LAB_ENGINES": "default, ssh://me@arm-box ,tcp://10.0.0.2:2375", "LAB_CACHE_CAP": "50GiB"})
    assert s["engines"] == ("default", "ssh://me@arm-box", "tcp://10.0.0.2:2375")
    assert int(s["cache_cap"]) == 50 * 1024**3
    rows = {r["key"]: r for r in s.describe()}
    assert rows["cache_cap"]["display"] == "50.0 GiB" and rows["cache_cap"]["value"] == 50 * 1024**3
    assert rows["cache_cap"]["used"] is True and rows["cache_cap"]["later"] is None
    assert rows["engines"]["used"] is True and rows["runs_dir"]["used"] is True  # every key is read today
    assert all(r["later"] is None for r in rows.values())


@pytest.mark.parametrize("body, line, key, needle", [
    ('runs_dir = "r"\ncache_cap = "lots"\n', 2, "cache_cap", "could not parse"),
    ('[mirrors]\n\ndebian = "deb.debian.org"\n', 3, "mirrors.debian", "not a mirror URL"),
    ('default_arch = "sparc"\n', 1, "default_arch", "unknown architecture"),
    ('engines = ["ok", "not a name"]\n', 1, "engines", "neither a Docker context"),
    ('cross_install = "maybe"\n', 1, "cross_install", "valid boolean"),
    ('runs_dir = 3\n', 1, "runs_dir", "(got 3)"),
])
def test_a_bad_value_names_the_file_line_and_key(tree, body, line, key, needle):
    path = tree["project"] / "lab.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load(tree)
    e = caught.value
    assert (e.file, e.line, e.field) == (str(path), line, key)
    assert str(e).startswith(f"{path}, line {line}, key `{key}`: ") and needle in str(e)
    assert "\n" not in str(e)


def test_unknown_keys_suggest_the_right_one(tree):
    tree["user"].write_text('runs_dir = "r"\n\n[mirrors]\ndebain = "http://x/debian"\n')
    with pytest.raises(ConfigError, match=r"line 4, key `mirrors.debain`: unknown key. Did you mean `mirrors.debian`"):
        load(tree)
    tree["user"].write_text('run_dir = "r"\n')
    with pytest.raises(ConfigError, match=r"line 1, key `run_dir`: unknown key. Did you mean `runs_dir`"):
        load(tree)
    tree["user"].write_text('mirrors = "http://x"\n')
    with pytest.raises(ConfigError, match=r"`mirrors` is a table"):
        load(tree)


def test_bad_toml_names_the_line(tree):
    (tree["project"] / "lab.toml").write_text('runs_dir = "r"\n[mirrors\n')
    with pytest.raises(ConfigError, match=r"lab.toml, line 2: not valid TOML"):
        load(tree)


def test_a_bad_variable_names_it(tree):
    with pytest.raises(ConfigError, match=r"^environment variable LAB_DEFAULT_ARCH \(key `default_arch`\): "):
        load(tree, env={"LAB_DEFAULT_ARCH": "sparc"})


def test_scenario_folders_project_first_then_shipped(tree):
    shipped = shipped_scenarios_dir()
    assert [(d.origin, d.path) for d in load(tree).scenario_dirs()] == [("shipped", shipped)]
    (tree["project"] / "scenarios").mkdir()
    (tree["project"] / "lab.toml").write_text("")
    dirs = load(tree).scenario_dirs()
    assert [(d.origin, d.path) for d in dirs] == [("project", tree["project"] / "scenarios"), ("shipped", shipped)]
    nearer = tree["project"] / "a" / "scenarios"
    nearer.mkdir()
    assert load(tree).scenario_dirs()[0].path == nearer
    assert load(tree, env={"LAB_SCENARIOS_DIR": "/x/sc"}).scenario_dirs()[0].path == Path("/x/sc")


def test_the_search_for_scenarios_stops_at_the_project_root(tree):
    (tree["root"] / "scenarios").mkdir()  # above the project: not the project's
    (tree["project"] / "lab.toml").write_text("")
    assert [d.origin for d in load(tree).scenario_dirs()] == ["shipped"]
    (tree["project"] / "lab.toml").unlink()  # no project file: the nearest scenarios/ upward
    assert load(tree).scenario_dirs()[0].path == tree["root"] / "scenarios"


def test_the_shipped_folder_is_listed_once_in_a_checkout(tree):
    shipped = shipped_scenarios_dir()
    s = config.load(env={}, cwd=shipped.parent, user=tree["user"])  # the repository's root
    assert [d.origin for d in s.scenario_dirs()] == ["shipped"]


def test_the_debian_mirror_is_read_from_the_settings(tree, monkeypatch):
    monkeypatch.setenv("LAB_DEBIAN_MIRROR", "http://mirror.example/debian")
    assert bootstrap_command("bookworm", Arch.ARM64, Path("r.tar"))[-1] == "http://mirror.example/debian"
    monkeypatch.delenv("LAB_DEBIAN_MIRROR")
    monkeypatch.chdir(tree["project"])
    (tree["project"] / "lab.toml").write_text('[mirrors]\ndebian = "http://toml.example/debian"\n')
    assert bootstrap_command("bookworm", Arch.ARM64, Path("r.tar"))[-1] == "http://toml.example/debian"


def test_lab_config_prints_each_key_with_its_source(tmp_path):
    (tmp_path / "lab.toml").write_text('runs_dir = "r"\n')
    proc = run_lab("config", "--json", cwd=tmp_path,
                   env={"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "LAB_DEFAULT_ARCH": "aarch64"})
    assert proc.returncode == 0, proc.stderr
    data = last_json(proc.stdout)
    rows = {r["key"]: r for r in data["settings"]}
    assert set(rows) == {k.name for k in config.KEYS}
    assert rows["runs_dir"]["value"] == str(tmp_path / "r")
    assert rows["runs_dir"]["source"] == f"project file {tmp_path / 'lab.toml'}"
    assert rows["default_arch"]["value"] == "arm64" and rows["default_arch"]["source"] == "environment LAB_DEFAULT_ARCH"
    assert rows["mirrors.debian"]["source"] == "default" and rows["mirrors.debian"]["env"] == "LAB_DEBIAN_MIRROR"
    assert data["files"]["user"] == str(tmp_path / "xdg" / "lab" / "config.toml")
    text = run_lab("config", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert "runs_dir" in text.stdout and "project file" in text.stdout and "engines" in text.stdout


def test_lab_config_names_a_secret_mirror_redacted(tmp_path):
    mirror = "http://u:7f3aMIRRORtok9c@mirror.corp/7f3aMIRRORpath9c/debian"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "LAB_DEBIAN_MIRROR": mirror}
    data = last_json(run_lab("config", "--json", cwd=tmp_path, env=env).stdout)
    row = next(r for r in data["settings"] if r["key"] == "mirrors.debian")
    assert row["value"] == row["display"] == "http://mirror.corp/…"
    text = run_lab("config", cwd=tmp_path, env=env)
    assert text.returncode == 0 and "7f3aMIRROR" not in text.stdout + text.stderr


def test_a_bad_config_file_is_one_paragraph_and_exit_2(tmp_path):
    (tmp_path / "lab.toml").write_text('default_arch = "sparc"\n')
    proc = run_lab("render", "libgomp-amd64", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    flat = " ".join(proc.stderr.split())
    assert flat.startswith(f"error: {tmp_path / 'lab.toml'}, line 1, key `default_arch`: unknown architecture")


def test_default_arch_picks_among_a_scenarios_arches(tmp_path):
    (tmp_path / "s.py").write_text("")
    (tmp_path / "two.yaml").write_text('name: two\ntorch: "2.5.1"\narch: [amd64, arm64]\nbase: debian:bookworm\n'
                                       'script: s.py\nexpect: {exit_code: 0}\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    refused = run_lab("render", str(tmp_path / "two.yaml"), cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "choose one with --arch" in " ".join(refused.stderr.split())
    chosen = run_lab("render", str(tmp_path / "two.yaml"), cwd=tmp_path, env={**env, "LAB_DEFAULT_ARCH": "arm64"})
    assert chosen.returncode == 0 and "--platform linux/arm64" in chosen.stdout, chosen.stderr
    flag = run_lab("render", str(tmp_path / "two.yaml"), "--arch", "amd64", cwd=tmp_path,
                   env={**env, "LAB_DEFAULT_ARCH": "arm64"})
    assert "--platform linux/amd64" in flag.stdout
