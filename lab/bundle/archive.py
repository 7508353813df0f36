"""Bundles: one run folder as a `.tar.gz` that another person can inspect, unpack and replay.

Format (format_version 1)
-------------------------
A gzip'd (level 6) tar, PAX format, whose members are regular files only, all under one folder
named after the run folder (`<root>/`, e.g. `20261122T120958Z-torch2.5.1-arm64/`):

1. `<root>/bundle.json`, always the first member: the manifest (below);
2. the metadata files (`kind: "meta"`): everything but `out/` and `diagnose/`: result.json,
   report.md, scenario.yaml, Dockerfile, .dockerignore, repro/*, tools/*, lab/pip.conf,
   evidence.json, pip-freeze.txt, collect_env.txt, build.log, stdout.txt, stderr.txt, wheels/README...
   sorted by path;
3. the bulky data (`kind: "data"`): `out/**` (raw loader logs) and `diagnose/**`, sorted by path.

So `inspect_bundle` reads the first few KiB of the stream and stops. Members have mtime = the
bundle's `created` time, uid/gid 0, no owner names, and mode 0644 (0755 when the file was
executable), so the same run folder bundled with the same `created` gives the same bytes.

bundle.json::

    {"format": "torch-repro-lab-bundle", "format_version": 1,
     "created": "2026-11-22T12:30:00+00:00", "lab_version": "0.1.0",
     "scenario", "case", "torch", "arch", "verdict", "reason": from result.json (or null),
     "summary": [plain-words findings from result.json],
     "slim": false,
     "files":    [{"path": "result.json", "size": 1549, "sha256": "<64 hex>", "kind": "meta"}, ...],
     "left_out": [{"path": "lab/ca.crt", "size": 219597, "sha256": "<64 hex>",
                   "why": "host CA bundle; the replaying host's CA bundle is used"}, ...]}

Paths are relative to `<root>/`, POSIX, without `.`/`..`; sizes and sha256 are those of the bytes
stored, which are the scrubbed bytes for text files.  bundle.json is not listed in `files`.

What never goes in (each listed in `left_out` with its reason): `wheels/*.whl` (host-local wheels;
a replay installs from the replaying host's pip sources; `wheels/LEFT-OUT.txt` lists them too),
`lab/ca.crt` (the host's CA bundle), `site/**` but its README.md (packages the lab installed
on the host for the image, should a run folder hold them), symbolic links and anything else that is not a regular file
(so nothing outside the run folder), binary files that contain a secret value, text files too
large to scrub; with `slim`, also the raw loader logs `out/ld/*`.

Text files (valid UTF-8 without NUL bytes) go through `lab.scrub.scrub_text` (secrets, URL
credentials, home path).  The stored report.md ends with a "How to replay" section
(`replay_instructions`), added when the run's report.md lacks one.

`unpack_bundle` (and `open_bundle`, its folder only) checks bundle.json (size capped, strict
pydantic model), then unpacks through `lab.safetar.safe_extract` with the manifest's sizes and
sha256 as the only files allowed. It returns the manifest with the folder: `Unpacked.read_checked`
reads a file again and checks it against the manifest, so what a replay shows and builds from a
bundle is exactly what the manifest lists. The manifest is no signature: whoever edits a bundle
can update it, which is why `lab replay` builds this lab's re-render of the bundled scenario.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import yaml

from lab import __version__
from lab.bundle.instructions import REPLAY_HEADING, AnyResult, replay_instructions, verdict_text
from lab.bundle.manifest import (
    BUNDLE_FORMAT,
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ROOT_RE,
    BundleLimits,
    FileEntry,
    LeftOutEntry,
    Manifest,
    check_path,
    manifest_error,
    parse_manifest,
    validate_manifest,
)
from lab.core.results import RunResult, read_result
from lab.core.runmarker import MARKER
from lab.core.safetar import (
    HEADER_BUDGET,
    BundleError,
    CountingReader,
    TooMuch,
    read_problem,
    safe_extract,
)
from lab.core.scrub import is_secret_name, scrub_text, secret_values
from lab.core.tarwrite import gzipped_tar, tar_info

MAX_SCRUB_BYTES = 256 << 20     # a text file larger than this is left out rather than read whole
COMPRESSLEVEL = 6

WHY_WHEEL = "host-local wheel; replay takes it from the replaying host's pip sources"
WHY_CA = "host CA bundle; the replaying host's CA bundle is used"
WHY_SITE = "package installed on the host for the image (site/); replay installs it again"
WHY_SLIM = "raw loader log, left out by --slim (its findings are in evidence.json and report.md)"
WHY_LINK = "symbolic link; links are never bundled"
WHY_SPECIAL = "not a regular file"
WHY_BINARY_SECRET = "binary file that contains the value of a secret-named environment variable"

_DATA_DIRS = ("out", "diagnose")
_HASH_CHUNK = 1 << 20



@dataclass(frozen=True)
class BundleInfo:
    """What `write_bundle` made."""

    path: Path
    size: int                      # bytes of the .tar.gz
    file_count: int                # files from the run folder in it (bundle.json not counted)
    left_out: tuple[LeftOutEntry, ...]
    manifest: Manifest = field(repr=False)


# --------------------------------------------------------------------------- reading the head


@dataclass(frozen=True)
class BundleHead:
    """bundle.json as found at the start of a bundle."""

    manifest: Manifest
    root: str
    size: int
    sha256: str


def _source_name(source: Path | str | IO[bytes]) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return str(getattr(source, "name", "<bundle>"))


def read_head(source: Path | str | IO[bytes], limits: BundleLimits = DEFAULT_LIMITS) -> BundleHead:
    """Read and validate the first member, `<root>/bundle.json`, and stop there."""
    where = _source_name(source)
    if isinstance(source, (str, Path)):
        try:
            handle: IO[bytes] = open(source, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise BundleError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        try:
            return _read_head(handle, where, limits)
        finally:
            handle.close()
    return _read_head(source, where, limits)


def _read_head(handle: IO[bytes], where: str, limits: BundleLimits) -> BundleHead:
    unzipped = gzip.GzipFile(fileobj=handle, mode="rb")
    counter = CountingReader(unzipped, MAX_MANIFEST_BYTES + HEADER_BUDGET)
    member_name = None
    try:
        with counter.window(HEADER_BUDGET):
            # 512-byte reads: nothing much past bundle.json is decompressed, so a bundle cut short
            # after its head still shows its manifest.
            tar = tarfile.open(fileobj=counter, mode="r|", bufsize=512)  # type: ignore[call-overload]  # noqa: SIM115
        member = tar.next()
        if member is None:
            raise BundleError(f"{where}: the archive is empty", hint="It is not a bundle made by `lab bundle`.")
        member_name = member.name
        root, _, name = member.name.partition("/")
        if name == MANIFEST_NAME and ROOT_RE.fullmatch(root) and not member.isreg():
            raise manifest_error(where, f"the first member {member.name!r} is not a regular file")
        if name != MANIFEST_NAME or not ROOT_RE.fullmatch(root):
            raise BundleError(
                f"{where}: its first member is {member.name!r}, not <folder>/{MANIFEST_NAME}",
                hint="It is not a bundle made by `lab bundle` (or it was repacked); ask for the bundle again.")
        if member.size > MAX_MANIFEST_BYTES:
            raise manifest_error(where, f"is {member.size} bytes, more than the limit of {MAX_MANIFEST_BYTES}")
        extracted = tar.extractfile(member)
        assert extracted is not None
        raw = extracted.read()
        if len(raw) != member.size:
            raise BundleError(f"{where}: the archive is truncated inside {MANIFEST_NAME}")
    except TooMuch:
        raise BundleError(f"{where}: its first member unpacks to more data than a bundle head may "
                          "(a compression bomb?)") from None
    except gzip.BadGzipFile as exc:
        raise BundleError(f"{where}: it is not a gzip-compressed tar archive ({exc})",
                          hint="A bundle is the .tar.gz that `lab bundle` writes.") from None
    except (EOFError, tarfile.TarError, zlib.error, OSError) as exc:
        inside = f"member {member_name!r}: " if member_name else ""
        raise BundleError(f"{where}: {inside}{read_problem(exc)}", hint="Ask for the bundle again.") from None
    manifest = parse_manifest(raw, where, limits)
    return BundleHead(manifest, root, len(raw), hashlib.sha256(raw).hexdigest())


def inspect_bundle(source: Path | str | IO[bytes], limits: BundleLimits = DEFAULT_LIMITS) -> Manifest:
    """bundle.json of a bundle, validated, read without unpacking anything else (a path or an open
    binary file)."""
    return read_head(source, limits).manifest


@dataclass(frozen=True)
class Unpacked:
    """A bundle unpacked by `unpack_bundle`: its run folder and the manifest it was checked against."""

    folder: Path
    manifest: Manifest

    def entry(self, rel: str) -> FileEntry | None:
        return next((f for f in self.manifest.files if f.path == rel), None)

    def read_checked(self, rel: str, max_bytes: int = 64 << 20) -> bytes:
        """A file of the bundle, read again and checked against the manifest's size and sha256, so
        what the lab shows or builds is exactly what the manifest lists (BundleError otherwise)."""
        entry = self.entry(rel)
        if entry is None:
            raise BundleError(f"{self.folder}: {rel} is not listed in the bundle's manifest",
                              hint="Only the files bundle.json lists are used from a bundle.")
        path = self.folder / rel
        if entry.size > max_bytes:
            raise BundleError(f"{self.folder}: {rel} is {entry.size} bytes, more than the {max_bytes} bytes "
                              "the lab reads of it", hint="The bundle was not made by `lab bundle`.")
        try:
            if path.is_symlink() or not path.is_file():
                raise FileNotFoundError(rel)
            data = path.read_bytes()
        except OSError as exc:
            raise BundleError(f"{self.folder}: {rel} cannot be read ({exc})",
                              hint="Something changed the unpacked bundle; replay it again.") from None
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise BundleError(f"{self.folder}: {rel} no longer matches the manifest's size and sha256",
                              hint="Something changed the unpacked bundle; replay it again.")
        return data


def unpack_bundle(path: Path | str, dest: Path | str, limits: BundleLimits = DEFAULT_LIMITS) -> Unpacked:
    """Check a bundle's manifest, then unpack it safely into the new folder `dest`.

    Returns the run folder inside it, `dest/<root>`, with the manifest. Any problem is a
    BundleError, and leaves no `dest`.
    """
    head = read_head(path, limits)
    root = head.root
    expected = {f"{root}/{MANIFEST_NAME}": (head.size, head.sha256)}
    expected.update({f"{root}/{f.path}": (f.size, f.sha256) for f in head.manifest.files})
    safe_extract(path, dest, max_total_bytes=limits.max_total_bytes + head.size, max_files=len(expected),
                 expected=expected)
    return Unpacked(Path(dest) / root, head.manifest)


def open_bundle(path: Path | str, dest: Path | str, limits: BundleLimits = DEFAULT_LIMITS) -> Path:
    """`unpack_bundle`'s run folder: `dest/<root>`."""
    return unpack_bundle(path, dest, limits).folder


# --------------------------------------------------------------------------- writing


@dataclass
class _Planned:
    path: str                   # relative to the run folder, POSIX
    kind: str                   # meta | data
    size: int
    sha256: str
    mode: int
    data: bytes | None = None   # the scrubbed text; None: stream `source`
    source: Path | None = None


def _sha256_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _contains_any(path: Path, needles: list[bytes]) -> bool:
    """Whether the file holds any of `needles`, read in pieces that overlap by the longest needle."""
    if not needles:
        return False
    overlap = max(len(n) for n in needles) - 1
    previous = b""
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            window = previous + chunk
            if any(n in window for n in needles):
                return True
            previous = window[-overlap:] if overlap else b""
    return False


def _as_text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _kind(rel: str) -> str:
    return "data" if rel.split("/", 1)[0] in _DATA_DIRS else "meta"


def _why_left_out(rel: str, slim: bool) -> str | None:
    parts = rel.split("/")
    if parts[0] == "wheels" and rel.endswith(".whl"):
        return WHY_WHEEL
    if rel == "lab/ca.crt":
        return WHY_CA
    if parts[0] == "site" and rel != "site/README.md":
        return WHY_SITE
    if slim and parts[:2] == ["out", "ld"]:
        return WHY_SLIM
    return None


def _walk(run_dir: Path) -> list[tuple[str, Path]]:
    """Every entry under run_dir, links not followed: (relative POSIX path, path), sorted."""
    entries: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(run_dir, followlinks=False):
        base = Path(folder)
        for name in dirs:
            if (base / name).is_symlink():
                entries.append(((base / name).relative_to(run_dir).as_posix(), base / name))
        for name in files:
            entries.append(((base / name).relative_to(run_dir).as_posix(), base / name))
    return sorted(entries)


def _left(rel: str, why: str, path: Path | None = None) -> dict[str, Any]:
    size = sha = None
    if path is not None:
        with contextlib.suppress(OSError):
            size, sha = _sha256_file(path)
    return {"path": rel, "size": size, "sha256": sha, "why": why}


def _scenario_secrets(scenario: Mapping[str, Any]) -> dict[str, str]:
    """Secret-named variables of the scenario's `env:` and `vars:`, as an environment for scrub_text."""
    found: dict[str, str] = {}
    for key in ("env", "vars"):
        block = scenario.get(key)
        if isinstance(block, dict):
            found.update({str(k): str(v) for k, v in block.items() if isinstance(k, str) and is_secret_name(k)
                          and isinstance(v, (str, int, float))})
    return found


def _read_scenario(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "scenario.yaml"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > (1 << 20):
            return {}
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: str | None, env: Mapping[str, str], limit: int = 200) -> str | None:
    return None if value is None else scrub_text(value, env)[:limit]


def _plan(run_dir: Path, *, slim: bool, env: Mapping[str, str], skip: set[Path], result: AnyResult,
          scenario: dict[str, Any], bundle_name: str) -> tuple[list[_Planned], list[dict[str, Any]]]:
    planned: list[_Planned] = []
    left_out: list[dict[str, Any]] = []
    secrets = [v.encode("utf-8", "surrogateescape") for v in secret_values(env)]
    has_report = False
    for rel, path in _walk(run_dir):
        if path in skip or rel == MARKER:  # this host's mark of its own run folders: meaningless elsewhere
            continue
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            left_out.append(_left(rel, WHY_LINK))
            continue
        if not stat.S_ISREG(st.st_mode):
            left_out.append(_left(rel, WHY_SPECIAL))
            continue
        why = _why_left_out(rel, slim)
        if why is None:
            try:
                check_path(rel)
            except ValueError as exc:
                why = f"its name cannot go into a bundle ({exc})"
        if why is not None:
            left_out.append(_left(rel, why, path))
            continue
        mode = 0o755 if st.st_mode & 0o100 else 0o644
        item = _plan_file(rel, path, st.st_size, mode, env, secrets)
        if isinstance(item, str):
            left_out.append(_left(rel, item, path))
            continue
        if rel == "report.md":
            has_report = True
            item = _with_replay(item, bundle_name, result, scenario, run_dir.name, env)
        planned.append(item)
    if not has_report:
        text = f"# {result.case or run_dir.name}: {verdict_text(result) or 'no verdict'}\n\n" \
               "This run wrote no report.md.\n"
        item = _Planned("report.md", "meta", 0, "", 0o644, data=text.encode())
        planned.append(_with_replay(item, bundle_name, result, scenario, run_dir.name, env))
    wheels = [entry for entry in left_out if entry["why"] == WHY_WHEEL]
    if wheels:
        planned.append(_wheel_list(wheels))
    return planned, left_out


def _plan_file(rel: str, path: Path, size: int, mode: int, env: Mapping[str, str],
               secrets: list[bytes]) -> _Planned | str:
    """The file as it will be stored, or why it is left out."""
    kind = _kind(rel)
    if size <= MAX_SCRUB_BYTES:
        raw = path.read_bytes()
        text = _as_text(raw)
        if text is not None:
            data = scrub_text(text, env).encode("utf-8")
            return _Planned(rel, kind, len(data), hashlib.sha256(data).hexdigest(), mode, data=data)
        if any(secret in raw for secret in secrets):
            return WHY_BINARY_SECRET
        return _Planned(rel, kind, len(raw), hashlib.sha256(raw).hexdigest(), mode, source=path)
    with path.open("rb") as handle:
        head = handle.read(1 << 20)
    if _as_text(head[: len(head) - 4] if len(head) > 4 else head) is not None:
        return f"text file larger than {MAX_SCRUB_BYTES >> 20} MiB, too large to scrub of secrets"
    if _contains_any(path, secrets):
        return WHY_BINARY_SECRET
    real_size, sha = _sha256_file(path)
    return _Planned(rel, kind, real_size, sha, mode, source=path)


def _with_replay(item: _Planned, bundle_name: str, result: AnyResult, scenario: dict[str, Any],
                 folder: str, env: Mapping[str, str]) -> _Planned:
    text = item.data.decode("utf-8") if item.data is not None else ""
    if REPLAY_HEADING not in text:
        text = text.rstrip("\n") + "\n\n" + replay_instructions(bundle_name, result, scenario=scenario,
                                                                  folder=folder)
        text = scrub_text(text, env)
    data = text.encode("utf-8")
    return _Planned(item.path, item.kind, len(data), hashlib.sha256(data).hexdigest(), item.mode, data=data)


def _wheel_list(wheels: list[dict[str, Any]]) -> _Planned:
    lines = ["Wheels the original run took from its host's local pip sources. They are not in the bundle:",
             "`lab replay` installs the same requirements from the replaying host's pip sources.", ""]
    lines += [f"{w['sha256'] or '?'}  {w['size'] if w['size'] is not None else '?'}  {w['path']}" for w in wheels]
    data = ("\n".join(lines) + "\n").encode()
    return _Planned("wheels/LEFT-OUT.txt", "meta", len(data), hashlib.sha256(data).hexdigest(), 0o644, data=data)


def _order(planned: list[_Planned]) -> list[_Planned]:
    unique = {p.path: p for p in planned}  # a generated file replaces a same-named one
    return sorted(unique.values(), key=lambda p: (p.kind != "meta", p.path))


class _HashCheck(io.RawIOBase):
    """Reads a source file for the tar, checking it still has the sha256 planned for it."""

    def __init__(self, handle: IO[bytes], item: _Planned) -> None:
        super().__init__()
        self.handle, self.item = handle, item
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _write_archive(target: Path, root: str, manifest_bytes: bytes, items: list[_Planned], mtime: int) -> None:
    with target.open("wb") as raw, gzipped_tar(raw, mtime=mtime, compresslevel=COMPRESSLEVEL) as tar:
        tar.addfile(tar_info(f"{root}/{MANIFEST_NAME}", tarfile.REGTYPE, 0o644, len(manifest_bytes), mtime=mtime),
                    io.BytesIO(manifest_bytes))
        for item in items:
            info = tar_info(f"{root}/{item.path}", tarfile.REGTYPE, item.mode, item.size, mtime=mtime)
            if item.data is not None:
                tar.addfile(info, io.BytesIO(item.data))
                continue
            assert item.source is not None
            with item.source.open("rb") as handle:
                check = _HashCheck(handle, item)
                try:
                    tar.addfile(info, check)
                except (OSError, tarfile.TarError) as exc:
                    raise BundleError(f"{item.source} changed while it was being bundled ({exc})",
                                      hint="Bundle the run folder again once nothing writes to it.") from None
                if check.digest.hexdigest() != item.sha256 or handle.read(1):
                    raise BundleError(f"{item.source} changed while it was being bundled",
                                      hint="Bundle the run folder again once nothing writes to it.")


class BundleTargetError(BundleError):
    """`lab bundle -o` (or the current folder) points inside the run folder it packs."""


class BundleExistsError(BundleError):
    """`lab bundle -o` names a file that exists, and --force was not given."""


def _check_target(given: Path, run_path: Path, target: Path, force: bool) -> None:
    """Never write inside the run folder being packed (links resolved), nor over a file unless
    `force`; never over anything that is not a file."""
    real = Path(os.path.realpath(target))
    if real == run_path or run_path in real.parents:
        raise BundleTargetError(f"{target}: the bundle would be written inside the run folder it packs ({given}); "
                                "the lab never writes into a run folder it bundles.",
                                hint="Give -o a path outside the run folder (for example ../NAME.tar.gz), or run "
                                     "`lab bundle` from another folder.")
    if not os.path.lexists(target):
        return
    if target.is_dir() or (real.exists() and not real.is_file()):
        raise BundleExistsError(f"{target} exists and is not a file: the bundle cannot be written there.",
                                hint="Give -o the path of a .tar.gz file.")
    if not force:
        raise BundleExistsError(f"{target} exists already: `lab bundle` does not overwrite a file.",
                                hint="Pass --force to replace it, or give another -o.")


def _commit(tmp: Path, target: Path, force: bool) -> None:
    """Move the finished archive to `target`: replacing it only when `force` (a link there is
    replaced, not written through), else failing if something appeared there meanwhile."""
    if force:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise BundleExistsError(f"{target} appeared while the bundle was written: `lab bundle` does not "
                                "overwrite a file.", hint="Pass --force to replace it, or give another -o.") from None
    except OSError:  # a file system without hard links: the check before the write stands
        if os.path.lexists(target):
            raise BundleExistsError(f"{target} exists already: `lab bundle` does not overwrite a file.",
                                    hint="Pass --force to replace it, or give another -o.") from None
        os.replace(tmp, target)
        return
    tmp.unlink()


def write_bundle(run_dir: Path | str, out: Path | str | None = None, *, slim: bool = False,
                 env: Mapping[str, str] | None = None, created: datetime | None = None,
                 force: bool = False) -> BundleInfo:
    """Write the run folder as a bundle (see the module docstring) and return what was written.

    `out` defaults to `<run folder name>.tar.gz` in the current directory. It may not lie inside
    the run folder (BundleTargetError), nor be an existing file unless `force` (BundleExistsError).
    `env` (default os.environ) supplies the secret values to scrub. `created` (default now) also
    sets every member's mtime, so a fixed one gives byte-identical bundles.
    """
    env = os.environ if env is None else env
    given = Path(run_dir)
    if given.is_symlink() or not given.is_dir():
        raise BundleError(f"{given} is not a run folder: it is not a folder",
                          hint="Pass a folder that `lab run` made, such as runs/<scenario>/<time>-torch<v>-<arch>.")
    run_path = Path(os.path.realpath(given))
    root = run_path.name
    if not ROOT_RE.fullmatch(root):
        raise BundleError(f"{given}: the folder name {root!r} cannot name a bundle's folder",
                          hint="Rename it to letters, digits, '.', '_', '+' and '-' only.")
    target = Path(out) if out is not None else Path.cwd() / f"{root}.tar.gz"
    created = (created or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(microsecond=0)
    result = read_result(run_path)
    _check_target(given, run_path, target, force)
    scenario = _read_scenario(run_path)
    env = {**_scenario_secrets(scenario), **env}  # a token in the scenario's env must not leak through stdout
    target_real = Path(os.path.realpath(target))
    planned, left_out = _plan(run_path, slim=slim, env=env, skip={target_real}, result=result, scenario=scenario,
                              bundle_name=target.name)
    items = _order(planned)
    summary = result.summary if isinstance(result, RunResult) else ()
    manifest = validate_manifest({
        "format": BUNDLE_FORMAT, "format_version": FORMAT_VERSION,
        "created": created.isoformat(), "lab_version": __version__,
        "scenario": _text(result.scenario, env), "case": _text(result.case, env, 1000),
        "torch": _text(result.torch, env), "arch": _text(result.arch, env),
        "verdict": verdict_text(result), "reason": _text(result.reason, env, 10_000),
        "summary": [scrub_text(s, env)[:10_000] for s in summary[:1000]],
        "slim": slim,
        "files": [{"path": i.path, "size": i.size, "sha256": i.sha256, "kind": i.kind} for i in items],
        "left_out": left_out,
    }, str(target), BundleLimits(max_total_bytes=1 << 50, max_files=10**9))
    manifest_bytes = (manifest.model_dump_json(indent=2) + "\n").encode("utf-8")
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{given}: the bundle's manifest would be larger than {MAX_MANIFEST_BYTES} bytes "
                          f"({len(items)} files)", hint="Bundle with --slim, or remove files from the run folder.")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write_archive(tmp, root, manifest_bytes, items, int(created.timestamp()))
        os.chmod(tmp, 0o644)
        _commit(tmp, target, force)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return BundleInfo(path=target, size=target.stat().st_size, file_count=len(items),
                      left_out=tuple(manifest.left_out), manifest=manifest)
