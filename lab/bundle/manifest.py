"""bundle.json, the manifest of a bundle: its pydantic models, parsing and validation.

The format is described in lab/bundle/archive.py."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from lab.core.results import validation_problem
from lab.core.safetar import (
    BundleError,
    check_name,
)

BUNDLE_FORMAT = "torch-repro-lab-bundle"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
MANIFEST_NAME = "bundle.json"
MAX_MANIFEST_BYTES = 4 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
ROOT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")



@dataclass(frozen=True)
class BundleLimits:
    """What `open_bundle` accepts: the unpacked size of all files, and how many there may be."""

    max_total_bytes: int = 2 << 30
    max_files: int = 20_000


DEFAULT_LIMITS = BundleLimits()


# --------------------------------------------------------------------------- manifest model


def check_path(value: str) -> str:
    """`value` if it is an acceptable file path of a bundle; ValueError saying why not otherwise."""
    why = check_name(value)
    if why is None and value.endswith("/"):
        why = "it ends with '/'"
    if why is None and any(ord(c) < 32 or ord(c) == 127 for c in value):
        why = "it contains a control character"
    if why:
        raise ValueError(f"must be a relative POSIX path inside the bundle, but {why}")
    return value


def _check_sha(value: str) -> str:
    if not _SHA256_RE.fullmatch(value):
        raise ValueError("must be a sha256 digest: 64 lowercase hexadecimal digits")
    return value


def _check_created(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO 8601 time such as 2026-11-22T12:30:00+00:00") from None
    return value


def _limits(info: ValidationInfo) -> BundleLimits:
    return (info.context or {}).get("limits", DEFAULT_LIMITS)


RelPath = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(check_path)]
Sha256 = Annotated[str, AfterValidator(_check_sha)]
ShortText = Annotated[str, Field(max_length=200)]
LongText = Annotated[str, Field(max_length=10_000)]
Size = Annotated[int, Field(ge=0, le=1 << 50)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FileEntry(_Strict):
    path: RelPath
    size: Size
    sha256: Sha256
    kind: Literal["meta", "data"]


class LeftOutEntry(_Strict):
    path: RelPath
    size: Size | None
    sha256: Sha256 | None
    why: Annotated[str, Field(min_length=1, max_length=1000)]


class Manifest(_Strict):
    """bundle.json (see the module docstring)."""

    format: Literal["torch-repro-lab-bundle"]
    format_version: int
    created: Annotated[str, Field(max_length=64), AfterValidator(_check_created)]
    lab_version: ShortText
    scenario: ShortText | None
    case: Annotated[str, Field(max_length=1000)] | None
    torch: ShortText | None
    arch: ShortText | None
    verdict: ShortText | None
    reason: LongText | None
    summary: Annotated[list[LongText], Field(max_length=1000)]
    slim: bool
    files: Annotated[list[FileEntry], Field(max_length=1_000_000)]
    left_out: Annotated[list[LeftOutEntry], Field(max_length=1_000_000)]

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Manifest:
        limits = _limits(info)
        if len(self.files) > limits.max_files:
            raise ValueError(f"files: lists {len(self.files)} files, more than the limit of {limits.max_files}")
        total = sum(f.size for f in self.files)
        if total > limits.max_total_bytes:
            raise ValueError(f"files: adds up to {total} bytes, more than the limit of {limits.max_total_bytes}")
        seen: set[str] = set()
        for entry in self.files:
            if entry.path == MANIFEST_NAME:
                raise ValueError(f"files: lists {MANIFEST_NAME} itself, which the manifest cannot describe")
            if entry.path in seen:
                raise ValueError(f"files: lists {entry.path!r} twice")
            seen.add(entry.path)
        return self


def manifest_error(where: str, message: str, hint: str | None = None) -> BundleError:
    """A BundleError about bundle.json in the bundle named `where`."""
    return BundleError(f"{where}: {MANIFEST_NAME}: {message}",
                       hint=hint or "The bundle was not made by `lab bundle`, or was damaged; ask for it again.")


def validate_manifest(data: Any, where: str, limits: BundleLimits = DEFAULT_LIMITS) -> Manifest:
    """bundle.json's parsed JSON as a Manifest, or one BundleError naming `where` and the field."""
    if not isinstance(data, dict):
        raise manifest_error(where, f"must be a JSON object, got {type(data).__name__}")
    version = data.get("format_version")
    if data.get("format") == BUNDLE_FORMAT and isinstance(version, int) and not isinstance(version, bool) \
            and version not in SUPPORTED_VERSIONS:
        readable = ", ".join(map(str, sorted(SUPPORTED_VERSIONS)))
        raise manifest_error(
            where, f"field `format_version`: this lab reads bundle format {readable}, but the bundle is format "
                   f"{version}",
            hint="Upgrade torch-repro-lab (or ask for a bundle made by this version).")
    try:
        return Manifest.model_validate(data, context={"limits": limits})
    except ValidationError as exc:
        text = validation_problem(exc)
        more = len(exc.errors()) - 1
        hint = (f"{more} more problem{'s' if more > 1 else ''} after this one. " if more else "") + \
            "The bundle was not made by `lab bundle`, or was damaged; ask for it again."
        raise manifest_error(where, text, hint) from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_manifest(raw: bytes, where: str, limits: BundleLimits = DEFAULT_LIMITS) -> Manifest:
    """Parse and validate bundle.json's bytes (at most MAX_MANIFEST_BYTES)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise manifest_error(where, f"is larger than {MAX_MANIFEST_BYTES} bytes, the limit")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise manifest_error(where, f"is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise manifest_error(where, f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") \
            from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "nested too deeply"
        raise manifest_error(where, f"is not usable JSON ({reason[:200]})") from None
    return validate_manifest(data, where, limits)


