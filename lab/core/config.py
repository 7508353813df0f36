"""The lab's settings in one place, and where each value came from.

Each key is read from these sources; the first that sets it wins:

    1. a command-line flag           (`--out` for runs_dir)
    2. the environment               (LAB_RUNS_DIR, ...: the `env` of each key below)
    3. the project file              `lab.toml`, the first one found walking up from the current folder
    4. the user file                 `config.toml` in the user config folder (platformdirs, app `lab`:
                                     ~/.config/lab/config.toml on Linux, or under $XDG_CONFIG_HOME)
    5. the default

A relative path in a file is relative to that file's folder; in the environment or a flag, to the
current folder. The rest of the lab reads its settings through `current()`; nothing else reads
LAB_* variables of the host. Values are validated with pydantic, and a bad one is a ConfigError
that names the file, the line and the key (or the variable).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import platformdirs
from pydantic import AfterValidator, BeforeValidator, TypeAdapter, ValidationError

from lab.core.arch import Arch
from lab.core.errors import ConfigError
from lab.core.resources import shipped_scenarios_dir
from lab.core.secreturls import redact_url
from lab.core.sizes import Size, as_size, to_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP = "lab"
PROJECT_FILE = "lab.toml"
USER_FILE = "config.toml"
CACHE_APP = "torch-repro-lab"  # the cache folder's name predates this module; kept so caches survive


# ----------------------------------------------------------------------------- value types

def _split_list(value: Any) -> Any:
    """A list in TOML, or a comma-separated string in the environment."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


_ENGINE = re.compile(r"^(?:(?:unix|tcp|ssh|npipe|http|https)://\S+|[A-Za-z0-9][A-Za-z0-9_.+-]*)$")


def _engine(value: str) -> str:
    if not _ENGINE.match(value):
        raise ValueError(f"{value!r} is neither a Docker context name nor an engine URL "
                         "(unix://, tcp://, ssh://)")
    return value


def _mirror(value: str) -> str:
    if not re.match(r"^(?:https?|file|ftp)://\S+$", value):
        raise ValueError(f"{value!r} is not a mirror URL (http://, https://, file://)")
    return value


def _arch(value: Any) -> Any:
    if isinstance(value, str):
        return Arch.parse(value)  # ValueError names the accepted values
    return value


def _path(value: Any) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("is empty")
        return Path(value).expanduser()
    return value


PathValue = Annotated[Path, BeforeValidator(_path)]
EngineList = Annotated[tuple[Annotated[str, AfterValidator(_engine)], ...], BeforeValidator(_split_list)]


@dataclass(frozen=True)
class Key:
    """One setting: its name in TOML (dotted for tables), its variable, type, default and meaning."""

    name: str
    env: str
    kind: Any
    default: Any
    help: str
    is_path: bool = False
    later: str | None = None  # the later feature that will read it; None when the lab uses it today

    @cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.kind)


KEYS: tuple[Key, ...] = (
    Key("runs_dir", "LAB_RUNS_DIR", PathValue, Path("runs"),
        "the folder where run folders are written (`--out` overrides it)", is_path=True),
    Key("scenarios_dir", "LAB_SCENARIOS_DIR", PathValue | None, None,
        "the project's scenarios folder, searched before the shipped scenarios (default: the nearest "
        "`scenarios/` folder from the current folder up to the project's root)", is_path=True),
    Key("templates_dir", "LAB_TEMPLATES_DIR", PathValue | None, None,
        "a folder of Dockerfile templates used instead of the shipped ones", is_path=True),
    Key("cache_dir", "LAB_CACHE_DIR", PathValue, Path(platformdirs.user_cache_dir(CACHE_APP)),
        "the folder of host-side caches (base rootfs, release lists, uv's wheels, cross-installed sites)",
        is_path=True),
    Key("cache_cap", "LAB_CACHE_CAP", Annotated[int | None, BeforeValidator(to_size), AfterValidator(as_size)], None,
        "the most the cache (the lab's images and everything under cache_dir) may hold, such as \"50GiB\"; "
        "enforced after each run and bisect probe, least recently used first (default: 30 GiB or a quarter "
        "of the free disk plus the cache, whichever is smaller)"),
    Key("disk_margin", "LAB_DISK_MARGIN", Annotated[int | None, BeforeValidator(to_size), AfterValidator(as_size)],
        None, "the free disk a run or bisect probe must leave where the cache lives, beyond what it is estimated to "
        "add; a run that would leave less is refused before it starts (default: 2 GiB)"),
    Key("default_arch", "LAB_DEFAULT_ARCH", Annotated[Arch, BeforeValidator(_arch)] | None, None,
        "the architecture (amd64 or arm64) picked when a scenario lists several and a command needs one "
        "(render, build, bisect, build-base); `--arch` overrides it"),
    Key("engines", "LAB_ENGINES", EngineList, (),
        "more Docker engines (context names or DOCKER_HOST URLs: unix://, tcp://, ssh://) that runs, matrices and "
        "bisections are routed to, besides the current one (`--engine` names the only ones for one command)"),
    Key("cross_install", "LAB_CROSS_INSTALL", bool, True,
        "whether the requirements are cross-installed on the host with uv (true or false; false: pip in "
        "the image installs everything)"),
    Key("site_mount", "LAB_SITE_MOUNT", bool, True,
        "whether a Docker engine on this host gets the cross-installed tree as read-only mounts in each "
        "run instead of a layer of the case image (true or false; remote engines always get the layer)"),
    Key("mirrors.debian", "LAB_DEBIAN_MIRROR", Annotated[str, AfterValidator(_mirror)],
        "http://deb.debian.org/debian", "the URL of the Debian mirror used to bootstrap base images"),
    Key("local.python", "LAB_LOCAL_PYTHON", PathValue | None, None,
        "the Python the local engine (`--engine local`) makes its venvs from, and runs with `--python-env "
        "current` (default: the Python that runs the lab)", is_path=True),
    Key("local.bwrap", "LAB_BWRAP", str, "bwrap",
        "the bubblewrap the local engine confines scripts with: a command on PATH or a path; `off` runs "
        "without it, which needs `--trust-script`"),
    Key("bisect.probe_details", "LAB_BISECT_PROBE_DETAILS", bool, False,
        "whether every bisection probe runs collect_env and the diagnose step's default (true or false; "
        "default false: collect_env only for the boundary's two releases; `--probe-details` asks for it once)"),
)
_BY_NAME = {k.name: k for k in KEYS}
_TABLES = {name.split(".")[0] for name in _BY_NAME if "." in name}


# ----------------------------------------------------------------------------- where a value came from

@dataclass(frozen=True)
class Origin:
    kind: str  # default | user | project | env | flag
    where: str = ""  # the file, the variable or the flag

    def __str__(self) -> str:
        return {"default": "default", "user": f"user file {self.where}", "project": f"project file {self.where}",
                "env": f"environment {self.where}", "flag": f"flag {self.where}"}[self.kind]


@dataclass(frozen=True)
class ScenarioDir:
    """A folder searched for scenario names: the project's (first) or the shipped ones."""

    origin: str  # project | shipped
    path: Path


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Any]
    origins: Mapping[str, Origin]
    user_file: Path
    project_file: Path | None
    cwd: Path = field(default_factory=Path.cwd)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def runs_dir(self) -> Path:
        return self.values["runs_dir"]

    @property
    def cache_dir(self) -> Path:
        return self.values["cache_dir"]

    @property
    def templates_dir(self) -> Path | None:
        return self.values["templates_dir"]

    @property
    def default_arch(self) -> Arch | None:
        return self.values["default_arch"]

    @property
    def cross_install(self) -> bool:
        return self.values["cross_install"]

    @property
    def site_mount(self) -> bool:
        return self.values["site_mount"]

    @property
    def debian_mirror(self) -> str:
        return self.values["mirrors.debian"]

    def with_flag(self, name: str, value: Any, flag: str) -> Settings:
        """These settings with a command-line flag's value on top (None: the flag was not given)."""
        if value is None:
            return self
        return replace(self, values={**self.values, name: value}, origins={**self.origins, name: Origin("flag", flag)})

    def project_root(self) -> Path | None:
        return self.project_file.parent if self.project_file else None

    def scenario_dirs(self) -> list[ScenarioDir]:
        """Where scenario names are looked up, in order: the project's folder, then the shipped one."""
        shipped = shipped_scenarios_dir(self.cache_dir)
        project = self.values["scenarios_dir"]
        if project is None:
            project = _find_upward(self.cwd, "scenarios", is_dir=True, stop=self.project_root())
        dirs = []
        if project is not None and not _same(project, shipped):
            dirs.append(ScenarioDir("project", project))
        dirs.append(ScenarioDir("shipped", shipped))
        return dirs

    def describe(self) -> list[dict[str, Any]]:
        """Every key with its value (as JSON), where it came from, its variable and what uses it."""
        rows = []
        for key in KEYS:
            value = self.values[key.name]
            dumped = key.adapter.dump_python(value, mode="json")
            if key.name == "mirrors.debian":  # a mirror's URL is a secret (lab.core.scrub)
                value = dumped = redact_url(value)
            rows.append({"key": key.name, "value": dumped,
                         "display": _display(value),
                         "source": str(self.origins[key.name]), "env": key.env, "help": key.help,
                         "used": key.later is None, "later": key.later})
        return rows


def _display(value: Any) -> str:
    if value is None or value == ():
        return "(not set)"
    if isinstance(value, Size):
        return value.words()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(getattr(value, "value", value))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _find_upward(start: Path, name: str, *, is_dir: bool, stop: Path | None = None) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / name
        if candidate.is_dir() if is_dir else candidate.is_file():
            return candidate
        if stop is not None and folder == stop:
            return None
    return None


# ----------------------------------------------------------------------------- loading

def user_file() -> Path:
    return Path(platformdirs.user_config_dir(APP)) / USER_FILE


def find_project_file(cwd: Path) -> Path | None:
    return _find_upward(cwd, PROJECT_FILE, is_dir=False)


def load(env: Mapping[str, str] | None = None, cwd: Path | None = None, user: Path | None = None) -> Settings:
    """Read the files and the environment, validate every value, and say where each came from."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    user = user_file() if user is None else user
    project = find_project_file(cwd)
    values = {k.name: k.default for k in KEYS}
    origins = {k.name: Origin("default") for k in KEYS}
    layers = [("user", user), ("project", project)]
    for kind, path in layers:
        if path is not None and path.is_file():
            for name, value in _read_file(path).items():
                values[name], origins[name] = value, Origin(kind, str(path))
    for key in KEYS:
        raw = env.get(key.env)
        if raw is not None and raw.strip():
            values[key.name] = _validate(key, raw.strip(), variable=key.env)
            origins[key.name] = Origin("env", key.env)
    return Settings(values=values, origins=origins, user_file=user, project_file=project, cwd=cwd)


def current() -> Settings:
    """The settings now: read afresh each time (a few stat calls), so a changed environment counts."""
    return load()


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the configuration file: {exc}", file=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ConfigError(f"not valid TOML: {message}.", file=str(path), line=int(m.group(1)) if m else None,
                          hint="See docs/configuration.md for the format.") from None
    found: dict[str, Any] = {}
    for name, value in _flatten(data, path, text):
        key = _BY_NAME[name]
        if key.is_path and isinstance(value, str) and value.strip():
            value = str(path.parent / Path(value).expanduser())
        found[name] = _validate(key, value, file=str(path), line=_line_of(text, name))
    return found


def _flatten(data: dict[str, Any], path: Path, text: str):
    for top, value in data.items():
        if top in _TABLES:
            if not isinstance(value, dict):
                raise _unknown(path, text, top, f"`{top}` is a table: write [{top}] and its keys below it.")
            for sub, item in value.items():
                name = f"{top}.{sub}"
                if name not in _BY_NAME:
                    raise _unknown(path, text, name)
                yield name, item
        elif top in _BY_NAME:
            yield top, value
        else:
            raise _unknown(path, text, top)


def _unknown(path: Path, text: str, name: str, why: str | None = None) -> ConfigError:
    close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
    hint = f"Did you mean `{close[0]}`?" if close else f"Known keys: {', '.join(_BY_NAME)}."
    return ConfigError(why or "unknown key.", file=str(path), line=_line_of(text, name), field=name, hint=hint)


def _validate(key: Key, value: Any, *, file: str | None = None, line: int | None = None,
              variable: str | None = None) -> Any:
    try:
        return key.adapter.validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = str(error.get("ctx", {}).get("error") or error["msg"])
        raise ConfigError(f"{message} (got {value!r}).", file=file, line=line, variable=variable,
                          field=key.name, hint=_hint(key)) from None


def _hint(key: Key) -> str:
    return f"`{key.name}` is {key.help}."


def _line_of(text: str, name: str) -> int | None:
    """The line that sets `name` (`a.b` under [a], or written `a.b = ...`), or None."""
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([^\]\s]+)\s*\]", stripped)
        if header:
            current = header.group(1).strip("\"'")
            if current == name:
                return number
            continue
        m = re.match(r"^([A-Za-z0-9_.\"'-]+)\s*=", stripped)
        if not m:
            continue
        written = ".".join(part.strip("\"'") for part in m.group(1).split("."))
        full = f"{current}.{written}" if current else written
        if full == name:
            return number
    return None
