"""The scenario model (pydantic v2): field validators and the frozen `Scenario`.

A scenario is one YAML file describing a PyTorch bug reproduction: which torch versions and
architectures to try, the base image, extra packages, the script to run and what output means
"reproduced". This module checks values; reading the file (lab.scenario.loader) and finding a
scenario by name (lab.scenario.lookup) live apart. A validator raises `InvalidValue`, which the
loader turns into a `ScenarioError` naming file, line and field. `network` and `limits` say what the
run's container may use.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lab.core.arch import Arch
from lab.core.errors import ScenarioError
from lab.core.results import FailureSignature
from lab.core.runtimes import RUNTIME_FAMILIES
from lab.core.sizes import parse_size  # the one size grammar (lab.core.sizes)
from lab.scenario.errors import display_path, is_file, scenario_error, show_value

# The runtime families the loader-log analysis can tell apart (one table, in lab.loader).
KNOWN_RUNTIME_FAMILIES: frozenset[str] = frozenset(RUNTIME_FAMILIES)
RESERVED_ENV_KEYS: frozenset[str] = frozenset({"LD_DEBUG", "LD_DEBUG_OUTPUT"})

_SLUG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEB_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_URL_RE = re.compile(r"https?://[^\s/?#]+[^\s]*")
_IMAGE_RE = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?"  # registry host, or first path component
    r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"  # repository path
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@sha256:[0-9a-f]{64})?"  # digest
)
# Control characters and Unicode line/paragraph separators: a line break in a value that reaches a
# Dockerfile would start a new instruction, so no file name or version the lab renders may hold one.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MAX_PIP_LEN = 300

FIELD_HELP: dict[str, str] = {
    "name": "must be a slug of lowercase letters, digits, '.', '_' or '-' (at most 64 characters, "
    "starting with a letter or digit), such as libgomp-aarch64",
    "title": "must be a one-line text",
    "upstream": "must be the http(s) URL of the upstream issue, such as "
    "https://github.com/pytorch/pytorch/issues/166087",
    "description": "must be free text",
    "torch": 'must be a quoted PyTorch version such as "2.5.1", or a list of them',
    "arch": "must be amd64 or arm64, or a list of them",
    "base": "must be a Docker image reference such as debian:bookworm or "
    "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
    "gpu": "must be true or false",
    "cpu_variant": "must be the name (slug) of the CPU variant scenario",
    "system_packages": "must be a list of Debian package names such as [g++, python3-dev]",
    "pip": 'must be a list of PEP 508 requirement strings such as ["numpy>=1.26"]',
    "env": 'must be a mapping of environment variable names to values, such as {OMP_NUM_THREADS: "4"}',
    "vars": "must be a mapping of variable names to values, such as {N: 512}",
    "script": "must be the file name of the reproduction script, relative to this YAML file",
    "args": "must be a list of command-line arguments for the script, such as [--size, 512]",
    "timeout": "must be a whole number of seconds between 1 and 86400",
    "expect": "must be a mapping with at least one of duplicate_runtime, traceback_contains, "
    "stdout_contains, stderr_contains, stdout_contains_normalized, exit_code, graph_breaks",
    "expect.duplicate_runtime": "must be one of: " + ", ".join(sorted(KNOWN_RUNTIME_FAMILIES)),
    "expect.traceback_contains": "must be a non-empty text to find in the final exception's type and message",
    "expect.stdout_contains": "must be a non-empty text to find in the script's standard output",
    "expect.stderr_contains": "must be a non-empty text to find in the script's standard error",
    "expect.stdout_contains_normalized": "must be a non-empty text to find in the script's standard output "
    "once every run of whitespace in both is one space (for output pasted from a page)",
    "expect.exit_code": "must be a whole number between 0 and 255, or a list of them (any one counts), "
    "such as 139 or [134, 139]",
    "expect.graph_breaks_min": "must be a whole number of graph breaks, at least 1: reproduced when "
    "torch._dynamo.explain counts that many or more",
    "deps": "must be `latest` (today's index, the default), `era` (as of the torch release's upload date "
    'plus a week) or a date such as "2024-04-01"',
    "network": "must be true or false (true: the script needs network access at run time)",
    "limits": "must be a mapping with any of memory, pids, cpus, output, logs, such as "
    "{memory: 8g, pids: 4096, cpus: 2, output: 1g, logs: 64m}",
    "limits.memory": "must be a memory size such as 512m, 8g or 8GiB (binary units, at least 6 MiB), "
    "or a whole number of bytes",
    "limits.pids": "must be a whole number of processes between 16 and 4194304",
    "limits.cpus": "must be a number of CPUs greater than 0 and at most 1024, such as 2 or 0.5",
    "limits.output": "must be a size such as 256m or 1g (binary units, from 1 MiB to 1 TiB): the most the "
    "lab copies out of /out",
    "limits.logs": "must be a size such as 16m or 64m (binary units, from 64 KiB to 16 GiB): the most the "
    "lab keeps of stdout, and of stderr",
}



class InvalidValue(ValueError):
    """A validation failure with a ready-made message and an optional fix-it hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint




# --------------------------------------------------------------------------- architecture


# --------------------------------------------------------------------------- field validators


def _check_slug(value: str) -> str:
    if not _SLUG_RE.fullmatch(value):
        raise InvalidValue(f"{FIELD_HELP['name']}, got {show_value(value)}")
    return value


def _check_one_line(value: str) -> str:
    if "\n" in value.strip():
        raise InvalidValue("must be a single line of text", hint="Put longer text under `description`.")
    return value.strip()


def _check_url(value: str) -> str:
    if not _URL_RE.fullmatch(value.strip()):
        raise InvalidValue(f"{FIELD_HELP['upstream']}, got {show_value(value)}")
    return value.strip()


def _check_image(value: str) -> str:
    if len(value) > 255 or not _IMAGE_RE.fullmatch(value):
        raise InvalidValue(f"{FIELD_HELP['base']}, got {show_value(value)}")
    return value


def _one_or_many(value: Any) -> Any:
    """Let a single scalar stand for a one-element list (`torch: "2.5.1"`, `arch: arm64`)."""
    if isinstance(value, (str, int, float, Arch)):
        return [value]
    return value


def _exit_codes(value: Any) -> Any:
    """`exit_code: 139`, or a list of codes any one of which counts (`[134, 139]`: a page that
    shows an abort or a segfault, as memory corruption ends in either). A list becomes a tuple."""
    codes = list(value) if isinstance(value, list | tuple) else [value]
    if not codes or any(isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 255 for c in codes):
        raise InvalidValue(f"{FIELD_HELP['expect.exit_code']}, got {show_value(value)}")
    if len(set(codes)) != len(codes):
        raise InvalidValue(f"lists an exit code twice, got {show_value(value)}", hint="Write each code once.")
    return value if isinstance(value, int) else tuple(codes)


def _none_to_list(value: Any) -> Any:
    return [] if value is None else value


def _none_to_dict(value: Any) -> Any:
    return {} if value is None else value


class BareNumber(str):
    """The text of a number written unquoted where a version belongs (kept so errors can quote it)."""


def _version_item(value: Any) -> Any:
    if isinstance(value, BareNumber):
        raise InvalidValue(
            f"the version {value} is written as a bare number, which YAML reads as a number, not a "
            "version (2.10 would silently become 2.1)",
            hint=f'Quote every version: torch: "{value}" or torch: ["2.5.1", "2.6.0"].',
        )
    if isinstance(value, bool):
        raise InvalidValue(f"{FIELD_HELP['torch']}, got {value!r}")
    if isinstance(value, (int, float)):
        raise InvalidValue(
            f"the version {value!r} is written as a bare number, which YAML reads as a float "
            "(2.10 would silently become 2.1)",
            hint='Quote every version: torch: "2.10" or torch: ["2.5.1", "2.6.0"].',
        )
    return value


def _check_version(value: str) -> str:
    text = value.strip()
    try:
        if len(text) > 64 or not text.isascii():
            raise InvalidVersion(text)
        Version(text)
    except InvalidVersion:
        raise InvalidValue(
            f"{show_value(value)} is not a valid PEP 440 version",
            hint='Use a release such as "2.5.1" or "2.13.0+cpu".',
        ) from None
    return text


def check_version(value: str, field: str = "--torch") -> str:
    """A torch version given outside a scenario file (`--torch`, `--from`, a bundle's `resolved`
    block), checked as the loader checks the `torch` key: a PEP 440 version of at most 64 ASCII
    characters, returned stripped. Anything else is a ScenarioError naming `field`."""
    if not isinstance(value, str):
        raise scenario_error(f"{FIELD_HELP['torch']}, got {show_value(value)}", field=field)
    try:
        return _check_version(value)
    except InvalidValue as exc:
        raise scenario_error(exc.message, field=field, hint=exc.hint) from None


def _unique_versions(values: tuple[str, ...]) -> tuple[str, ...]:
    if not values:
        raise InvalidValue("must list at least one version", hint='Write e.g. torch: "2.5.1".')
    seen: dict[Version, str] = {}
    for text in values:
        version = Version(text)
        if version in seen:
            raise InvalidValue(f"lists the version {text!r} twice (same as {seen[version]!r}); remove one")
        seen[version] = text
    return values


def _arch_item(value: Any) -> Arch:
    if isinstance(value, str):
        return Arch.parse(value)
    raise InvalidValue(f"{FIELD_HELP['arch']}, got {show_value(value)}")


def _unique_arches(values: tuple[Arch, ...]) -> tuple[Arch, ...]:
    if not values:
        raise InvalidValue("must list at least one architecture", hint="Write e.g. arch: amd64.")
    if len(set(values)) != len(values):
        raise InvalidValue("lists the same architecture twice (aliases count); remove one")
    return values


def is_debian_package(name: str) -> bool:
    """A Debian package name as `system_packages` accepts it (no version, no shell syntax)."""
    return len(name) <= 128 and _DEB_RE.fullmatch(name) is not None


def _check_deb(value: str) -> str:
    if not is_debian_package(value):
        raise InvalidValue(
            f"{show_value(value)} is not a Debian package name; names use only lowercase letters, digits, "
            "'+', '.' and '-' (no spaces, versions or shell syntax)"
        )
    return value


def _check_pip(value: str) -> str:
    text = value.strip()
    if not text or len(text) > _MAX_PIP_LEN or any(ch in text for ch in "\r\n\x00"):
        raise InvalidValue(
            f"{show_value(value)} is not a usable pip requirement; give one PEP 508 requirement of at most "
            f"{_MAX_PIP_LEN} characters on a single line, such as \"numpy>=1.26\""
        )
    try:
        req = Requirement(text)
    except (InvalidRequirement, RecursionError) as exc:
        reason = (str(exc).splitlines() or ["nesting too deep"])[0]
        raise InvalidValue(
            f"{show_value(value)} is not a valid PEP 508 requirement ({reason})",
            hint='Write a requirement such as "numpy>=1.26"; pip options (-e, --index-url) are not allowed.',
        ) from None
    if canonicalize_name(req.name) == "torch":
        raise InvalidValue(
            "must not name torch: the torch version comes from the `torch` key",
            hint='Remove it from `pip` and set torch: "2.5.1" (or a list of versions) instead.',
        )
    return text


def _check_env_key(key: str) -> str:
    if not _ENV_KEY_RE.fullmatch(key):
        raise InvalidValue(
            f"{show_value(key)} is not a valid variable name; use letters, digits and underscores, "
            "not starting with a digit"
        )
    if key in RESERVED_ENV_KEYS or key.startswith("LAB_"):
        raise InvalidValue(
            f"{key!r} is reserved: LD_DEBUG, LD_DEBUG_OUTPUT and LAB_* are set by the lab itself",
            hint="Rename the variable.",
        )
    return key


def _to_text(value: Any) -> str:
    """Accept text, or a number/boolean written without quotes, as a string value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidValue("contains a NUL character, which cannot be passed to a process")
        return value
    hint = 'Write "" for an empty value.' if value is None else None
    raise InvalidValue(f"must be a text, number or boolean value, got {show_value(value)}", hint=hint)


def _check_runtime(value: str) -> str:
    if value not in KNOWN_RUNTIME_FAMILIES:
        close = difflib.get_close_matches(value, sorted(KNOWN_RUNTIME_FAMILIES), n=1)
        raise InvalidValue(
            f"{FIELD_HELP['expect.duplicate_runtime']}, got {show_value(value)}",
            hint=f"Did you mean {close[0]}?" if close else None,
        )
    return value


MIN_MEMORY_BYTES = 6 << 20  # Docker refuses less than 6 MiB
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: anything above is a typo


def _check_memory(value: Any) -> str:
    try:
        size = parse_size(value)
    except ValueError:
        raise InvalidValue(f"{FIELD_HELP['limits.memory']}, got {show_value(value)}") from None
    if not MIN_MEMORY_BYTES <= size <= MAX_MEMORY_BYTES:
        bytes_note = f" ({size} bytes)" if size < MAX_MEMORY_BYTES and isinstance(value, str) else ""
        raise InvalidValue(
            f"{FIELD_HELP['limits.memory']}, got {show_value(value)}{bytes_note}",
            hint="Docker refuses less than 6 MiB; 8g is the default." if size < MIN_MEMORY_BYTES
            else "That is more than 1 PiB; 8g is the default.",
        )
    return str(value).strip()


def _size_check(field: str, low: int, high: int):
    """A validator of a size field (`limits.output`, `limits.logs`): kept as written, within bounds."""
    def check(value: Any) -> str:
        try:
            size = parse_size(value)
        except ValueError:
            raise InvalidValue(f"{FIELD_HELP[field]}, got {show_value(value)}") from None
        if not low <= size <= high:
            raise InvalidValue(f"{FIELD_HELP[field]}, got {show_value(value)} ({size} bytes)")
        return str(value).strip()
    return check


def _check_non_empty(value: str) -> str:
    if not value:
        raise InvalidValue("must not be empty: an empty text is found in any output")
    return value


Slug = Annotated[str, AfterValidator(_check_slug)]
OneLine = Annotated[str, AfterValidator(_check_one_line)]
Url = Annotated[str, AfterValidator(_check_url)]
ImageRef = Annotated[str, AfterValidator(_check_image)]


LATEST = "latest"
ERA = "era"
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
DEPS_HELP = ("must be `latest` (today's index), `era` (as of the torch release's upload date plus a week) "
             'or a date such as "2024-04-01"')


def parse_deps(value: object) -> str:
    """The canonical spelling of a deps setting: `latest`, `era`, `YYYY-MM-DD` or an RFC 3339 time
    in UTC (`2024-04-01T12:00:00Z`). Raises ValueError with DEPS_HELP."""
    if hasattr(value, "isoformat") and not isinstance(value, str):  # YAML reads 2024-04-01 as a date
        value = value.isoformat()
    if not isinstance(value, str):
        raise ValueError(f"{DEPS_HELP}, got {value!r}")
    text = value.strip()
    if text.lower() in (LATEST, ERA):
        return text.lower()
    if _DATE_RE.fullmatch(text):
        try:
            datetime.strptime(text, "%Y-%m-%d")
        except ValueError:
            raise ValueError(f"{DEPS_HELP}, got {value!r}") from None
        return text
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{DEPS_HELP}, got {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return rfc3339(when)


def rfc3339(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_deps(value: Any) -> str:
    try:
        return parse_deps(value)
    except ValueError:
        raise InvalidValue(f"{FIELD_HELP['deps']}, got {show_value(value)}") from None


DepsSetting = Annotated[str, BeforeValidator(_check_deps)]
TorchVersion = Annotated[str, BeforeValidator(_version_item), AfterValidator(_check_version)]
ArchItem = Annotated[Arch, BeforeValidator(_arch_item)]
DebPackage = Annotated[str, AfterValidator(_check_deb)]
PipRequirement = Annotated[str, AfterValidator(_check_pip)]
VarName = Annotated[str, AfterValidator(_check_env_key)]
Text = Annotated[str, BeforeValidator(_to_text)]
NonEmptyText = Annotated[str, AfterValidator(_check_non_empty)]
RuntimeFamily = Annotated[str, AfterValidator(_check_runtime)]


# --------------------------------------------------------------------------- models


class Signature(BaseModel):
    """The failure a scenario's run must show (`expect.signature`), as PyTorch's minifier checks that a
    candidate fails with the same error (`check_str`): an exception type, with the innermost torch frame
    it went through if wanted, or a signal. `lab run` proposes one for a scenario that expects only an
    exit code (report.md, result.json `signature`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exception: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*$", max_length=200)] | None = None
    frame: Annotated[str, Field(pattern=r"^torch/\S+( in \S+)?$", max_length=300)] | None = None
    signal: Annotated[str, Field(pattern=r"^SIG[A-Z0-9]+$", max_length=20)] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Signature:
        if (self.exception is None) == (self.signal is None):
            raise InvalidValue("gives an `exception` (a type, e.g. RuntimeError) or a `signal` (e.g. SIGSEGV), "
                           "exactly one of them",
                           hint="For example: signature: {exception: RuntimeError, frame: "
                                "torch/_inductor/graph.py in run_node}, or signature: {signal: SIGSEGV}.")
        if self.frame is not None and self.exception is None:
            raise InvalidValue("`frame` goes with `exception`, not with `signal`")
        return self

    def as_failure(self) -> FailureSignature:
        return FailureSignature(exception=None if self.exception is None else self.exception.rsplit(".", 1)[-1],
                                frame=self.frame, signal=self.signal)


class Expect(BaseModel):
    """What "reproduced" means: every key that is given must hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    duplicate_runtime: RuntimeFamily | None = None
    traceback_contains: NonEmptyText | None = None
    stdout_contains: NonEmptyText | None = None
    stderr_contains: NonEmptyText | None = None
    stdout_contains_normalized: NonEmptyText | None = None
    exit_code: Annotated[int | tuple[int, ...], BeforeValidator(_exit_codes)] | None = None
    graph_breaks: int | None = Field(default=None, ge=0, le=100000, strict=True)
    graph_breaks_min: int | None = Field(default=None, ge=1, le=100000, strict=True)
    signature: Signature | None = None

    @property
    def exit_codes(self) -> tuple[int, ...]:
        """The exit codes that count (any one of them); empty when exit_code is not given."""
        code = self.exit_code
        return () if code is None else (code,) if isinstance(code, int) else code

    @property
    def exit_code_only(self) -> bool:
        """Whether the scenario says nothing of its failure but the exit code: a run that fails for any
        reason would hold. A bisection or matrix then holds every run to its first failure's signature."""
        return self.exit_code is not None and all(
            getattr(self, name) is None for name in type(self).model_fields if name != "exit_code")

    @property
    def needs_graph_breaks(self) -> bool:
        """Whether judging needs torch._dynamo.explain's count (the diagnose step)."""
        return self.graph_breaks is not None or self.graph_breaks_min is not None

    @model_validator(mode="after")
    def _at_least_one(self) -> Expect:
        if all(getattr(self, name) is None for name in type(self).model_fields):
            raise InvalidValue(
                "gives no condition, so nothing would count as reproduced",
                hint="Add at least one of: " + ", ".join(type(self).model_fields) + ".",
            )
        return self


class Ablation(BaseModel):
    """How the lab chooses a case's torch.compile backend and mode (`--backend`, `--ablate`).

    `via: env` (default): the script reads LAB_BACKEND and LAB_MODE itself.
    `via: hook`: the script hard-codes its torch.compile call; the lab's runner overrides the
    backend and mode of every torch.compile call from those variables.
    `via: none`: the script's backend is part of the bug: not ablatable, --backend is refused.
    `max_autotune`: --ablate also tries inductor with mode="max-autotune".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    via: Literal["env", "hook", "none"] = "env"
    max_autotune: bool = Field(default=False, strict=True)


class Limits(BaseModel):
    """What the run's container may use. Every key is optional.

    `memory`: a Docker-style size (`512m`, `8g`, `8GiB`, `1.5g`, or bytes), default 8g, kept as written;
    give the engine `memory_bytes`, which reads it the way `docker run --memory` does.
    `pids`: the most processes and threads at once, default 4096 (a fork bomb stops there).
    `cpus`: a CPU quota such as 2 or 0.5; default None: every host core.
    `output`: the most the lab copies out of the run's /out into the run folder, default 1g (the
    run is also stopped when /out grows past it).
    `logs`: the most the lab keeps of stdout, and of stderr, default 64m (then only their last MiB).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory: Annotated[str, BeforeValidator(_check_memory)] = "8g"
    pids: int = Field(default=4096, ge=16, le=4194304, strict=True)
    cpus: float | None = Field(default=None, gt=0, le=1024, strict=True, allow_inf_nan=False)
    output: Annotated[str, BeforeValidator(_size_check("limits.output", 1 << 20, 1 << 40))] = "1g"
    logs: Annotated[str, BeforeValidator(_size_check("limits.logs", 64 << 10, 16 << 30))] = "64m"

    @property
    def memory_bytes(self) -> int:
        """`memory` in bytes, as Docker reads it."""
        return parse_size(self.memory)

    @property
    def output_bytes(self) -> int:
        return parse_size(self.output)

    @property
    def logs_bytes(self) -> int:
        return parse_size(self.logs)


class Scenario(BaseModel):
    """One reproduction scenario, as read from a YAML file (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Slug
    title: OneLine | None = None
    upstream: Url | None = None
    description: str | None = None
    torch: Annotated[
        tuple[TorchVersion, ...], BeforeValidator(_one_or_many), AfterValidator(_unique_versions)
    ]
    arch: Annotated[tuple[ArchItem, ...], BeforeValidator(_one_or_many), AfterValidator(_unique_arches)]
    base: ImageRef
    gpu: bool = Field(default=False, strict=True)
    cpu_variant: Slug | None = None
    system_packages: Annotated[tuple[DebPackage, ...], BeforeValidator(_none_to_list)] = ()
    pip: Annotated[tuple[PipRequirement, ...], BeforeValidator(_none_to_list)] = ()
    deps: DepsSetting = "latest"   # how everything but torch resolves (lab.image.era)
    env: Annotated[dict[VarName, Text], BeforeValidator(_none_to_dict)] = Field(default_factory=dict)
    vars: Annotated[dict[VarName, Text], BeforeValidator(_none_to_dict)] = Field(default_factory=dict)
    script: Path
    args: Annotated[tuple[Text, ...], BeforeValidator(_none_to_list)] = ()
    timeout: int = Field(default=1200, ge=1, le=86400, strict=True)
    expect: Expect
    ablation: Ablation = Field(default_factory=Ablation)
    network: bool = Field(default=False, strict=True)
    limits: Annotated[Limits, BeforeValidator(_none_to_dict)] = Field(default_factory=Limits)
    source: Path | None = None

    @field_validator("cpu_variant")
    @classmethod
    def _cpu_variant_for_gpu(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if "gpu" in info.data and not info.data["gpu"]:
            raise InvalidValue("only applies to gpu: true scenarios", hint="Remove it, or set gpu: true.")
        if value == info.data.get("name"):
            raise InvalidValue("must name a different scenario than this one")
        return value

    @field_validator("script", mode="before")
    @classmethod
    def _resolve_script(cls, value: Any, info: ValidationInfo) -> Path:
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise InvalidValue(f"{FIELD_HELP['script']}, got {show_value(value)}")
        base = (info.context or {}).get("base_dir")
        path = Path(value)
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        path = Path(os.path.normpath(os.path.abspath(path)))
        if CONTROL_CHARS.search(path.name):
            raise InvalidValue(
                f"the script's file name {show_value(path.name)} holds a line break or another control character",
                hint="Rename the file: its name goes into the image's CMD and the report.",
            )
        if not is_file(path):
            raise InvalidValue(
                f"the script {show_value(str(value))} was not found (looked for {show_value(str(path), 120)[1:-1]})",
                hint="Create it, or fix the path; it is relative to the folder of the YAML file.",
            )
        return path

    def with_vars(self, overrides: Mapping[str, str]) -> Scenario:
        """A copy with some `vars` replaced (from `--set NAME=VALUE`); unknown names are refused."""
        file = display_path(self.source) if self.source else None
        for key in overrides:
            if key not in self.vars:
                raise _unknown_var(key, sorted(self.vars), file)
        values: dict[str, str] = {}
        for key, value in overrides.items():
            try:
                values[key] = _to_text(value)
            except InvalidValue as exc:
                raise scenario_error(exc.message, file=file, field=f"vars.{key}", hint=exc.hint) from None
        return self.model_copy(update={"vars": {**self.vars, **values}})


def _unknown_var(key: str, known: list[str], file: str | None) -> ScenarioError:
    by_lower = {name.lower(): name for name in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
    defined = ", ".join(known) if known else "no variables"
    hint = f"Did you mean {by_lower[close[0]]}? " if close else ""
    return scenario_error(
        f"unknown variable {key!r} in --set; this scenario defines: {defined}",
        file=file,
        field=f"vars.{key}",
        hint=hint + "Only variables listed under `vars:` in the scenario can be overridden.",
    )



def allowed_keys(parent: tuple[str | int, ...]) -> list[str]:
    """The keys a mapping at `parent` (() for the top level, ("expect",) ...) accepts."""
    sub_models: dict[tuple[str | int, ...], type[BaseModel]] = {
        ("expect",): Expect, ("ablation",): Ablation, ("limits",): Limits}
    model = sub_models.get(parent, Scenario)
    return [name for name in model.model_fields if name != "source"]


def unknown_key(key: str, allowed: list[str]) -> tuple[str, str | None]:
    """The message and hint for a key the model does not know."""
    close = difflib.get_close_matches(key, allowed, n=1)
    message = f"unknown key {key!r}; the allowed keys are: {', '.join(allowed)}"
    return message, (f"Did you mean `{close[0]}`?" if close else None)
