"""Scenario schema (pydantic v2) and a YAML loader whose every error names file, line and field.

A scenario is one YAML file describing a PyTorch bug reproduction: which torch versions and
architectures to try, the base image, extra packages, the script to run and what output means
"reproduced".  `load_scenario` turns such a file into a frozen `Scenario`; anything wrong with the
file (YAML syntax, duplicate keys, aliases, unknown keys, wrong types, missing script...) becomes a
single-paragraph `ScenarioError` that points at the file, the line and the dotted field path.

The loader is bounded, so a hostile file fails fast: at most 1 MiB, at most MAX_DEPTH levels of
nesting, and no YAML anchors or aliases at all (a "billion laughs" file is refused at its first
anchor, before anything is expanded).  `network` and `limits` say what the run's container may use.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lab.core.arch import Arch
from lab.core.config import current
from lab.core.errors import ScenarioError
from lab.core.resources import shipped_scenarios_dir
from lab.core.results import FailureSignature
from lab.core.runtimes import RUNTIME_FAMILIES
from lab.core.sizes import parse_size  # the one size grammar (lab.core.sizes)

__all__ = [
    "CONTROL_CHARS",
    "KNOWN_RUNTIME_FAMILIES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "SCENARIOS_DIR",
    "Arch",
    "Ablation",
    "Expect",
    "Limits",
    "Scenario",
    "Signature",
    "check_version",
    "default_scenarios_dir",
    "is_debian_package",
    "find_by_name",
    "list_scenarios",
    "load_scenario",
    "parse_size",
    "read_yaml",
    "validate_scenario",
]

# The runtime families the loader-log analysis can tell apart (one table, in lab.loader).
KNOWN_RUNTIME_FAMILIES: frozenset[str] = frozenset(RUNTIME_FAMILIES)
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 20
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

_FIELD_HELP: dict[str, str] = {
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


class _Invalid(ValueError):
    """A validation failure with a ready-made message and an optional fix-it hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def _show(value: Any, limit: int = 60) -> str:
    """A short, single-line repr of a user value for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _sentence(text: str) -> str:
    """One line, ending with a full stop."""
    text = _one_line(text)
    return text if not text or text[-1] in ".?!" else text + "."


def _err(message: str, *, file: str | None = None, line: int | None = None, field: str | None = None,
         hint: str | None = None) -> ScenarioError:
    """A ScenarioError whose message and hint are single sentences."""
    return ScenarioError(_sentence(message), file=file, line=line, field=field,
                         hint=_sentence(hint) if hint else None)


# --------------------------------------------------------------------------- architecture


# --------------------------------------------------------------------------- field validators


def _check_slug(value: str) -> str:
    if not _SLUG_RE.fullmatch(value):
        raise _Invalid(f"{_FIELD_HELP['name']}, got {_show(value)}")
    return value


def _check_one_line(value: str) -> str:
    if "\n" in value.strip():
        raise _Invalid("must be a single line of text", hint="Put longer text under `description`.")
    return value.strip()


def _check_url(value: str) -> str:
    if not _URL_RE.fullmatch(value.strip()):
        raise _Invalid(f"{_FIELD_HELP['upstream']}, got {_show(value)}")
    return value.strip()


def _check_image(value: str) -> str:
    if len(value) > 255 or not _IMAGE_RE.fullmatch(value):
        raise _Invalid(f"{_FIELD_HELP['base']}, got {_show(value)}")
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
        raise _Invalid(f"{_FIELD_HELP['expect.exit_code']}, got {_show(value)}")
    if len(set(codes)) != len(codes):
        raise _Invalid(f"lists an exit code twice, got {_show(value)}", hint="Write each code once.")
    return value if isinstance(value, int) else tuple(codes)


def _none_to_list(value: Any) -> Any:
    return [] if value is None else value


def _none_to_dict(value: Any) -> Any:
    return {} if value is None else value


class _BareNumber(str):
    """The text of a number written unquoted where a version belongs (kept so errors can quote it)."""


def _version_item(value: Any) -> Any:
    if isinstance(value, _BareNumber):
        raise _Invalid(
            f"the version {value} is written as a bare number, which YAML reads as a number, not a "
            "version (2.10 would silently become 2.1)",
            hint=f'Quote every version: torch: "{value}" or torch: ["2.5.1", "2.6.0"].',
        )
    if isinstance(value, bool):
        raise _Invalid(f"{_FIELD_HELP['torch']}, got {value!r}")
    if isinstance(value, (int, float)):
        raise _Invalid(
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
        raise _Invalid(
            f"{_show(value)} is not a valid PEP 440 version",
            hint='Use a release such as "2.5.1" or "2.13.0+cpu".',
        ) from None
    return text


def check_version(value: str, field: str = "--torch") -> str:
    """A torch version given outside a scenario file (`--torch`, `--from`, a bundle's `resolved`
    block), checked as the loader checks the `torch` key: a PEP 440 version of at most 64 ASCII
    characters, returned stripped. Anything else is a ScenarioError naming `field`."""
    if not isinstance(value, str):
        raise _err(f"{_FIELD_HELP['torch']}, got {_show(value)}", field=field)
    try:
        return _check_version(value)
    except _Invalid as exc:
        raise _err(exc.message, field=field, hint=exc.hint) from None


def _unique_versions(values: tuple[str, ...]) -> tuple[str, ...]:
    if not values:
        raise _Invalid("must list at least one version", hint='Write e.g. torch: "2.5.1".')
    seen: dict[Version, str] = {}
    for text in values:
        version = Version(text)
        if version in seen:
            raise _Invalid(f"lists the version {text!r} twice (same as {seen[version]!r}); remove one")
        seen[version] = text
    return values


def _arch_item(value: Any) -> Arch:
    if isinstance(value, str):
        return Arch.parse(value)
    raise _Invalid(f"{_FIELD_HELP['arch']}, got {_show(value)}")


def _unique_arches(values: tuple[Arch, ...]) -> tuple[Arch, ...]:
    if not values:
        raise _Invalid("must list at least one architecture", hint="Write e.g. arch: amd64.")
    if len(set(values)) != len(values):
        raise _Invalid("lists the same architecture twice (aliases count); remove one")
    return values


def is_debian_package(name: str) -> bool:
    """A Debian package name as `system_packages` accepts it (no version, no shell syntax)."""
    return len(name) <= 128 and _DEB_RE.fullmatch(name) is not None


def _check_deb(value: str) -> str:
    if not is_debian_package(value):
        raise _Invalid(
            f"{_show(value)} is not a Debian package name; names use only lowercase letters, digits, "
            "'+', '.' and '-' (no spaces, versions or shell syntax)"
        )
    return value


def _check_pip(value: str) -> str:
    text = value.strip()
    if not text or len(text) > _MAX_PIP_LEN or any(ch in text for ch in "\r\n\x00"):
        raise _Invalid(
            f"{_show(value)} is not a usable pip requirement; give one PEP 508 requirement of at most "
            f"{_MAX_PIP_LEN} characters on a single line, such as \"numpy>=1.26\""
        )
    try:
        req = Requirement(text)
    except (InvalidRequirement, RecursionError) as exc:
        reason = (str(exc).splitlines() or ["nesting too deep"])[0]
        raise _Invalid(
            f"{_show(value)} is not a valid PEP 508 requirement ({reason})",
            hint='Write a requirement such as "numpy>=1.26"; pip options (-e, --index-url) are not allowed.',
        ) from None
    if canonicalize_name(req.name) == "torch":
        raise _Invalid(
            "must not name torch: the torch version comes from the `torch` key",
            hint='Remove it from `pip` and set torch: "2.5.1" (or a list of versions) instead.',
        )
    return text


def _check_env_key(key: str) -> str:
    if not _ENV_KEY_RE.fullmatch(key):
        raise _Invalid(
            f"{_show(key)} is not a valid variable name; use letters, digits and underscores, "
            "not starting with a digit"
        )
    if key in RESERVED_ENV_KEYS or key.startswith("LAB_"):
        raise _Invalid(
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
            raise _Invalid("contains a NUL character, which cannot be passed to a process")
        return value
    hint = 'Write "" for an empty value.' if value is None else None
    raise _Invalid(f"must be a text, number or boolean value, got {_show(value)}", hint=hint)


def _check_runtime(value: str) -> str:
    if value not in KNOWN_RUNTIME_FAMILIES:
        close = difflib.get_close_matches(value, sorted(KNOWN_RUNTIME_FAMILIES), n=1)
        raise _Invalid(
            f"{_FIELD_HELP['expect.duplicate_runtime']}, got {_show(value)}",
            hint=f"Did you mean {close[0]}?" if close else None,
        )
    return value


MIN_MEMORY_BYTES = 6 << 20  # Docker refuses less than 6 MiB
MAX_MEMORY_BYTES = 1 << 50  # 1 PiB: anything above is a typo


def _check_memory(value: Any) -> str:
    try:
        size = parse_size(value)
    except ValueError:
        raise _Invalid(f"{_FIELD_HELP['limits.memory']}, got {_show(value)}") from None
    if not MIN_MEMORY_BYTES <= size <= MAX_MEMORY_BYTES:
        bytes_note = f" ({size} bytes)" if size < MAX_MEMORY_BYTES and isinstance(value, str) else ""
        raise _Invalid(
            f"{_FIELD_HELP['limits.memory']}, got {_show(value)}{bytes_note}",
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
            raise _Invalid(f"{_FIELD_HELP[field]}, got {_show(value)}") from None
        if not low <= size <= high:
            raise _Invalid(f"{_FIELD_HELP[field]}, got {_show(value)} ({size} bytes)")
        return str(value).strip()
    return check


def _check_non_empty(value: str) -> str:
    if not value:
        raise _Invalid("must not be empty: an empty text is found in any output")
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
        raise _Invalid(f"{_FIELD_HELP['deps']}, got {_show(value)}") from None


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
            raise _Invalid("gives an `exception` (a type, e.g. RuntimeError) or a `signal` (e.g. SIGSEGV), "
                           "exactly one of them",
                           hint="For example: signature: {exception: RuntimeError, frame: "
                                "torch/_inductor/graph.py in run_node}, or signature: {signal: SIGSEGV}.")
        if self.frame is not None and self.exception is None:
            raise _Invalid("`frame` goes with `exception`, not with `signal`")
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
            raise _Invalid(
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
    deps: DepsSetting = "latest"   # how everything but torch resolves (lab.build.era)
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
            raise _Invalid("only applies to gpu: true scenarios", hint="Remove it, or set gpu: true.")
        if value == info.data.get("name"):
            raise _Invalid("must name a different scenario than this one")
        return value

    @field_validator("script", mode="before")
    @classmethod
    def _resolve_script(cls, value: Any, info: ValidationInfo) -> Path:
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise _Invalid(f"{_FIELD_HELP['script']}, got {_show(value)}")
        base = (info.context or {}).get("base_dir")
        path = Path(value)
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        path = Path(os.path.normpath(os.path.abspath(path)))
        if CONTROL_CHARS.search(path.name):
            raise _Invalid(
                f"the script's file name {_show(path.name)} holds a line break or another control character",
                hint="Rename the file: its name goes into the image's CMD and the report.",
            )
        if not _is_file(path):
            raise _Invalid(
                f"the script {_show(str(value))} was not found (looked for {_show(str(path), 120)[1:-1]})",
                hint="Create it, or fix the path; it is relative to the folder of the YAML file.",
            )
        return path

    def with_vars(self, overrides: Mapping[str, str]) -> Scenario:
        """A copy with some `vars` replaced (from `--set NAME=VALUE`); unknown names are refused."""
        file = _display(self.source) if self.source else None
        for key in overrides:
            if key not in self.vars:
                raise _unknown_var(key, sorted(self.vars), file)
        values: dict[str, str] = {}
        for key, value in overrides.items():
            try:
                values[key] = _to_text(value)
            except _Invalid as exc:
                raise _err(exc.message, file=file, field=f"vars.{key}", hint=exc.hint) from None
        return self.model_copy(update={"vars": {**self.vars, **values}})


def _unknown_var(key: str, known: list[str], file: str | None) -> ScenarioError:
    by_lower = {name.lower(): name for name in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
    defined = ", ".join(known) if known else "no variables"
    hint = f"Did you mean {by_lower[close[0]]}? " if close else ""
    return _err(
        f"unknown variable {key!r} in --set; this scenario defines: {defined}",
        file=file,
        field=f"vars.{key}",
        hint=hint + "Only variables listed under `vars:` in the scenario can be overridden.",
    )


# --------------------------------------------------------------------------- YAML reading
# Why PyYAML's composer and not ruamel.yaml: both keep every node's position, and this loader
# only walks PyYAML's node tree (its marks give the line of each field path). What is ours is
# the policy, which neither library has: refusing anchors and aliases at the first one (before
# anything expands), a depth limit, unknown tags refused, and versions written as bare numbers
# kept as text so `2.10` can be refused instead of read as 2.1. ruamel.yaml would add a
# dependency and a round-trip model the lab never writes back.

_Path = tuple[str | int, ...]
_STR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "timestamp", "merge", "value")
)
_NUMERIC_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "float"))
_NULL_TAG = "tag:yaml.org,2002:null"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
# Scalars directly under these are kept as written (`N: 010` stays "010", not the YAML 1.1 octal 8).
_RAW_TEXT_PARENTS: frozenset[_Path] = frozenset({("env",), ("vars",), ("args",)})


class _Refused(Exception):
    """A YAML construct the loader refuses (alias, anchor, deep nesting), with its position."""

    def __init__(self, message: str, mark: Any, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = mark.line + 1 if mark is not None else None
        self.hint = hint


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases and nesting deeper than MAX_DEPTH while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(
                "YAML anchors and aliases (&name, *name, <<: *name) are not allowed in scenario files",
                event.start_mark,
                hint="Write the value out in full; this keeps a small file from expanding into a huge one.",
            )
        if self._depth >= MAX_DEPTH:
            raise _Refused(
                f"the YAML is nested more than {MAX_DEPTH} levels deep",
                event.start_mark,
                hint="Scenario files only need a few levels; flatten the structure.",
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    """Turns a composed node tree into plain data, recording the line of every field path."""

    def __init__(self, loader: _Loader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.lines: dict[_Path, int] = {}

    def build(self, node: yaml.Node, path: _Path = ()) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return self._sequence(node, path)
        return self._scalar(node, path)

    def _fail(self, message: str, node: yaml.Node, path: _Path, hint: str | None = None) -> ScenarioError:
        line = node.start_mark.line + 1
        return _err(message, file=self.file, line=line, field=_format_path(path) or None, hint=hint)

    def _check_tag(self, node: yaml.Node, expected: str, path: _Path) -> None:
        if node.tag != expected:
            raise self._fail(f"unsupported YAML tag {_tag(node.tag)}", node, path, hint="Remove the tag.")

    def _mapping(self, node: yaml.MappingNode, path: _Path) -> dict[str, Any]:
        self._check_tag(node, _MAP_TAG, path)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self._fail("keys must be plain names, not lists or mappings", key_node, path)
            key = key_node.value
            child = (*path, key)
            if key in result:
                first = self.lines[child]
                raise self._fail(
                    f"duplicate key {key!r} (first given at line {first}); YAML would silently keep only "
                    "the last one",
                    key_node,
                    child,
                    hint="Remove or rename one of them.",
                )
            self.lines[child] = key_node.start_mark.line + 1
            result[key] = self.build(value_node, child)
        return result

    def _sequence(self, node: yaml.SequenceNode, path: _Path) -> list[Any]:
        self._check_tag(node, _SEQ_TAG, path)
        items = []
        for index, item in enumerate(node.value):
            self.lines[(*path, index)] = item.start_mark.line + 1
            items.append(self.build(item, (*path, index)))
        return items

    def _scalar(self, node: yaml.ScalarNode, path: _Path) -> Any:
        tag = node.tag
        if tag in _STR_TAGS:
            return node.value
        if tag == _NULL_TAG:
            return None
        if tag not in _NUMERIC_TAGS:
            raise self._fail(f"unsupported YAML tag {_tag(tag)}", node, path, hint="Remove the tag.")
        if path[:-1] in _RAW_TEXT_PARENTS:
            return node.value
        if path[:1] == ("torch",) and not tag.endswith(":bool"):
            return _BareNumber(node.value)
        try:
            return self.loader.construct_object(node, deep=True)
        except (ValueError, LookupError, TypeError, ArithmeticError, yaml.YAMLError):
            kind = tag.rsplit(":", 1)[-1]
            message = f"{_show(node.value)} cannot be read as {kind} (it is tagged {_tag(tag)})"
            raise self._fail(message, node, path, hint="Fix the value or remove the tag.") from None


def _tag(tag: str) -> str:
    """A YAML tag as written in a file: `!!int` rather than `tag:yaml.org,2002:int`."""
    return _show(tag.replace("tag:yaml.org,2002:", "!!"))[1:-1]


def _display(path: Path) -> str:
    """The file name to show: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):
        return str(path)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _read_text(path: Path, file: str) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _err(f"cannot read the file: {exc.strerror or exc}", file=file) from None
    if len(data) > MAX_FILE_BYTES:
        raise _err(
            "the file is larger than 1 MiB, the limit for scenario files",
            file=file,
            hint="Keep data in the script's folder, not in the YAML.",
        )
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _err(
            f"the file is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            file=file,
            line=line,
            hint="Save it as UTF-8.",
        ) from None


def _compose(text: str, file: str) -> tuple[Any, dict[_Path, int]]:
    try:
        loader = _Loader(text)  # the reader checks every character here
    except yaml.YAMLError as exc:
        raise _reader_error(exc, text, file) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise _err(
                "the file is empty",
                file=file,
                line=1,
                hint="A scenario needs at least name, torch, arch, base, script and expect.",
            )
        if not isinstance(root, yaml.MappingNode):
            raise _err(
                "the top level must be a mapping of keys such as `name:` and `torch:`, not a list or a text",
                file=file,
                line=root.start_mark.line + 1,
            )
        builder = _Builder(loader, file)
        return builder.build(root), builder.lines
    except _Refused as exc:
        raise _err(exc.message, file=file, line=exc.line, hint=exc.hint) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, file) from None
    except yaml.YAMLError as exc:
        raise _reader_error(exc, text, file) from None
    finally:
        loader.dispose()


def _reader_error(exc: yaml.YAMLError, text: str, file: str) -> ScenarioError:
    position = getattr(exc, "position", None)
    line = text[:position].count("\n") + 1 if isinstance(position, int) else None
    character = getattr(exc, "character", None)
    if isinstance(character, int):
        message = f"invalid YAML: the file contains the control character U+{character:04X}"
        hint = "YAML forbids it; remove it, or write it as an escape such as \\x07 in double quotes."
        return _err(message, file=file, line=line, hint=hint)
    return _err(f"invalid YAML: {getattr(exc, 'reason', '') or exc}", file=file, line=line)


def _syntax_error(exc: yaml.MarkedYAMLError, file: str) -> ScenarioError:
    mark = exc.problem_mark or exc.context_mark
    problem = _one_line(exc.problem or "syntax error")
    context = f" ({_one_line(exc.context)})" if exc.context else ""
    if exc.context and problem.startswith("but "):  # "expected a single document ..., but found ..."
        problem, context = f"{_one_line(exc.context)}, {problem}", ""
    opened = exc.context_mark
    if "<stream end>" in problem and opened is not None and mark is not None and opened.line != mark.line:
        # An unclosed bracket or quote: the file ends before it closes; point at where it opened.
        mark = opened
        context = f" ({_one_line(exc.context or 'opened here')}, never closed)"
    return _err(
        f"invalid YAML: {problem}{context}",
        file=file,
        line=mark.line + 1 if mark is not None else None,
        hint="Check the indentation (spaces, not tabs), colons and quotes on this line and the one above.",
    )


# --------------------------------------------------------------------------- validation errors


def _format_path(path: _Path) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def _clean_loc(loc: tuple[Any, ...], lines: Mapping[_Path, int], kind: str = "") -> _Path:
    path: _Path = tuple(loc)
    if kind != "extra_forbidden" and len(path) >= 2 and path[-1] == "[key]":
        path = path[:-1]  # pydantic's marker for an invalid key, not a key the user wrote as "[key]"
    while path and isinstance(path[-1], int) and path not in lines:
        path = path[:-1]  # a scalar given for a list (`torch: "2.5.1"`) is the field itself
    return path


def _line_for(path: _Path, lines: Mapping[_Path, int]) -> int | None:
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _help_for(path: _Path) -> str | None:
    names = [part for part in path if isinstance(part, str)]
    while names:
        help_text = _FIELD_HELP.get(".".join(names))
        if help_text:
            return help_text
        names.pop()
    return None


_SUB_MODELS: dict[_Path, type[BaseModel]] = {("expect",): Expect, ("ablation",): Ablation, ("limits",): Limits}


def _allowed_keys(parent: _Path) -> list[str]:
    model = _SUB_MODELS.get(parent, Scenario)
    return [name for name in model.model_fields if name != "source"]


def _describe(error: Mapping[str, Any], path: _Path) -> tuple[str, str | None]:
    kind = error["type"]
    if kind == "missing":
        name = str(path[-1]) if path else "?"
        help_text = _help_for(path) or "see the scenario documentation"
        return f"the required key `{name}` is missing", f"Add it; it {help_text}."
    if kind == "extra_forbidden":
        return _unknown_key(str(path[-1]), _allowed_keys(path[:-1]))
    if kind in ("value_error", "assertion_error"):
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _Invalid):
            return cause.message, cause.hint
        return str(cause or error["msg"]), None
    help_text = _help_for(path)
    prefix = help_text if help_text else error["msg"][:1].lower() + error["msg"][1:]
    return f"{prefix}, got {_show(error.get('input'))}", None


def _unknown_key(key: str, allowed: list[str]) -> tuple[str, str | None]:
    close = difflib.get_close_matches(key, allowed, n=1)
    message = f"unknown key {key!r}; the allowed keys are: {', '.join(allowed)}"
    return message, (f"Did you mean `{close[0]}`?" if close else None)


def _from_validation(exc: ValidationError, lines: Mapping[_Path, int], file: str) -> ScenarioError:
    found = []
    for index, error in enumerate(exc.errors()):
        path = _clean_loc(tuple(error["loc"]), lines, error["type"])
        found.append((_line_for(path, lines) or 0, index, path, error))
    # A misspelt key also shows up as a missing one: report what is written before what is absent.
    line, _, path, error = min(found, key=lambda item: (item[3]["type"] == "missing", item[0], item[1]))
    message, hint = _describe(error, path)
    if len(found) > 1:
        count = len(found) - 1
        more = f"This file has {count} more problem{'s' if count > 1 else ''} after this one."
        hint = f"{_sentence(hint)} {more}" if hint else more
    return _err(message, file=file, line=line or None, field=_format_path(path) or None, hint=hint)


# --------------------------------------------------------------------------- loading


def default_scenarios_dir() -> Path:
    """The shipped scenarios (package data, lab.scenarios). The CLI searches the project's
    `scenarios/` first (lab.config); library calls without a folder use this one."""
    return shipped_scenarios_dir(current().cache_dir)


SCENARIOS_DIR: Path = default_scenarios_dir()
ScenarioDirs = Path | Sequence[Path]


def read_yaml(path: Path, display: str | None = None) -> tuple[Any, dict[_Path, int]]:
    """A scenario file's mapping and the line of each key, read with the loader's limits (size,
    UTF-8, no anchors or aliases); any problem is a ScenarioError naming the file (or `display`)
    and line."""
    file = display or _display(path)
    return _compose(_read_text(path, file), file)


def validate_scenario(data: Mapping[str, Any], lines: Mapping[_Path, int], *, source: Path,
                      base_dir: Path | None = None, display: str | None = None) -> Scenario:
    """`read_yaml`'s mapping validated as a scenario file is: `script` relative to `base_dir`
    (default: the file's folder); every error names `display` (default: the file), line and field."""
    file = display or _display(source)
    if "source" in data:
        message, hint = _unknown_key("source", _allowed_keys(()))
        raise _err(
            message + " (`source` is set by the loader)", file=file, line=lines.get(("source",)),
            field="source", hint="Remove it.",
        )
    absolute = Path(os.path.abspath(source))
    try:
        return Scenario.model_validate(
            {**data, "source": absolute}, context={"base_dir": base_dir or absolute.parent}
        )
    except ValidationError as exc:
        raise _from_validation(exc, lines, file) from None


def _load_file(path: Path) -> Scenario:
    data, lines = read_yaml(path)
    return validate_scenario(data, lines, source=path)


def _scenario_files(scenarios_dir: Path) -> list[Path]:
    files = [p for p in scenarios_dir.iterdir() if p.suffix in (".yaml", ".yml") and _is_file(p)]
    return sorted(files, key=lambda p: p.name)


def _available_names(scenarios_dirs: Sequence[Path]) -> list[str]:
    names: set[str] = set()
    for folder in scenarios_dirs:
        with contextlib.suppress(OSError):
            names |= {p.stem for p in _scenario_files(folder)}
    return sorted(names)


def _unknown_scenario(name: str, scenarios_dirs: Sequence[Path]) -> ScenarioError:
    folders = " and ".join(str(d) for d in scenarios_dirs)
    names = _available_names(scenarios_dirs)
    if not names:
        return _err(
            f"unknown scenario {name!r}: there are no scenario files in {folders}",
            hint="Pass the path of a YAML file, or set scenarios_dir (LAB_SCENARIOS_DIR) to the scenarios folder.",
        )
    ranked = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)
    close = difflib.get_close_matches(name, names, n=1)
    ranked += [n for n in names if n not in ranked]
    return _err(
        f"unknown scenario {name!r}; available in {folders}: {', '.join(ranked)}",
        hint=f"Did you mean {close[0]}?" if close else "Pass one of these names or the path of a YAML file.",
    )


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith((".yaml", ".yml"))


def _as_dirs(scenarios_dir: ScenarioDirs | None) -> list[Path]:
    if scenarios_dir is None:
        return [SCENARIOS_DIR]
    return [scenarios_dir] if isinstance(scenarios_dir, Path) else list(scenarios_dir)


def find_by_name(name: str, scenarios_dirs: Sequence[Path]) -> Path | None:
    """The file a scenario name stands for: `<name>.yaml`/`.yml` in the first folder that has one."""
    for folder in scenarios_dirs:
        for suffix in (".yaml", ".yml"):
            if _is_file(folder / f"{name}{suffix}"):
                return folder / f"{name}{suffix}"
    return None


def _resolve_ref(ref: str | Path, scenarios_dirs: Sequence[Path]) -> Path:
    text = str(ref)
    if isinstance(ref, Path) or _looks_like_path(text):
        path = Path(text).expanduser()
        if _is_file(path):
            return path
        if not isinstance(ref, Path) and "/" not in text:
            for folder in scenarios_dirs:
                if _is_file(folder / text):
                    return folder / text
        problem = "is not a file" if os.path.lexists(text) else "does not exist"
        raise _err(f"the scenario file {problem}", file=_display(path),
                            hint="Check the path, or pass a scenario name instead.")
    found = find_by_name(text, scenarios_dirs)
    if found is not None:
        return found
    raise _unknown_scenario(text, scenarios_dirs)


def load_scenario(ref: str | Path, scenarios_dir: ScenarioDirs | None = None) -> Scenario:
    """Load a scenario by name (`<name>.yaml`/`.yml` in the first of the folders that has it) or by
    path to a YAML file.

    `scenarios_dir` is one folder or a list searched in order (the CLI passes the project's, then
    the shipped one); it defaults to `SCENARIOS_DIR`.  Every failure is a `ScenarioError`.
    """
    return _load_file(_resolve_ref(ref, _as_dirs(scenarios_dir)))


def list_scenarios(scenarios_dir: Path | None = None) -> list[Scenario | ScenarioError]:
    """Every `*.yaml`/`*.yml` in the folder, sorted by file name; a broken file yields its error.

    Raises ScenarioError only when the folder itself cannot be read.
    """
    directory = SCENARIOS_DIR if scenarios_dir is None else scenarios_dir
    try:
        files = _scenario_files(directory)
    except OSError as exc:
        raise _err(
            f"cannot list the scenarios folder {directory}: {exc.strerror or exc}",
            hint="Create it, or set scenarios_dir (LAB_SCENARIOS_DIR) to the folder that holds the scenario files.",
        ) from None
    results: list[Scenario | ScenarioError] = []
    for path in files:
        try:
            results.append(_load_file(path))
        except ScenarioError as exc:
            results.append(exc)
    return results
