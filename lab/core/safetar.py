"""Extract an untrusted gzip'd tar archive (a bundle someone sent) without trusting anything in it.

`safe_extract` reads the archive as a stream, once, front to back, and refuses the whole archive
with a `BundleError` naming the archive and the member at the first thing it does not accept:

- a member path that is absolute, has an empty, `.` or `..` component, a backslash, a NUL, or is
  not UTF-8;
- any link: symbolic and hard links are refused whatever they point at (a run folder has none, so
  telling safe links from unsafe ones is not worth the risk); device files, fifos and sparse files;
- a name given twice, or a file where a folder is needed (`a` as a file and `a/b`);
- more members than `max_files`, or more file bytes than `max_total_bytes` in all;
- with `expected` (a manifest: path -> (size, sha256)): a file the manifest does not list, a size
  that differs from it (checked from the header, before any byte is written), a sha256 that
  differs (computed while the file is written, in 1 MiB pieces), or a listed file that is absent.

Python's own `tarfile.data_filter` checks every member as well, after these checks.

Gzip bombs: the decompressed stream is counted as it is read, with no trust in the headers' sizes.
The whole stream may hold at most `max_total_bytes` plus 4 KiB of headers per member plus 1 MiB,
and reading the headers of any one member (which is where tar keeps long names and pax records,
read whole into memory) may take at most 1 MiB.

Nothing half-done is left behind: members go into a hidden temporary folder next to `dest`, which
is renamed to `dest` only when the whole archive has been checked, and removed on any failure.

`extract_outputs` copies a run container's /out (the engine's archive stream) into the run
folder with the same member checks, but as evidence rather than as a whole to refuse: a link,
fifo, device or unsafe name is skipped and noted, never made, and the copy stops with a note at
its size or file cap, keeping what it copied so far.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lab.core.errors import LabError
from lab.core.records import OutputCopy, Skipped, format_bytes

__all__ = ["BundleError", "HEADER_BUDGET", "extract_outputs", "member_kind", "safe_extract"]

HEADER_BUDGET = 1 << 20          # decompressed bytes one member's headers may take
_PER_MEMBER_OVERHEAD = 4096      # header blocks and padding allowed per member in the stream total
_CHUNK = 1 << 20
_TAIL = 64 << 10                 # more than tarfile buffers ahead (one 10 KiB record)
_HINT = ("It was not made by `lab bundle`, or it was damaged or tampered with on the way; "
         "ask for the bundle again, and do not unpack it by hand.")


class BundleError(LabError):
    """A bundle (or another archive) is unreadable, malformed or refused as unsafe."""


class TooMuch(Exception):
    """The decompressed stream ran past its allowance."""


class CountingReader(io.RawIOBase):
    """Reads through `inner`, refusing to hand out more than `limit` bytes in all, or more than
    the current `window` while one is open. Reads are cut short so nothing past a limit is ever
    decompressed into memory."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit
        self.count = 0
        self.window_end: int | None = None
        self.tail = bytearray()  # the last _TAIL bytes handed out: what tarfile may hold unparsed

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        end = self.limit if self.window_end is None else min(self.limit, self.window_end)
        allowed = end - self.count + 1  # one byte past the end proves the stream is too long
        if size is None or size < 0 or size > allowed:
            size = allowed
        data = self.inner.read(size)
        self.count += len(data)
        if self.count > end:
            raise TooMuch
        self.tail += data[-_TAIL:]
        del self.tail[:-_TAIL]
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    @contextmanager
    def window(self, size: int) -> Iterator[None]:
        self.window_end = self.count + size
        try:
            yield
        finally:
            self.window_end = None


def _refuse(archive: Path, member: str | None, why: str, hint: str | None = _HINT) -> BundleError:
    where = f"{archive}: " + (f"member {member!r}: " if member is not None else "")
    return BundleError(f"{where}{why}", hint=hint)


def check_name(name: str) -> str | None:
    """Why a member name is refused, or None when it is acceptable."""
    if not name:
        return "its name is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if "\x00" in name:
        return "its name contains a NUL character"
    if len(name) > 1024:
        return "its name is longer than 1024 characters"
    if name.startswith("/"):
        return "its path is absolute"
    if "\\" in name:
        return "its name contains a backslash"
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        return "its path has a '..' component, which would leave the folder"
    if "" in parts or "." in parts:
        return "its path has an empty or '.' component"
    if any(len(part.encode()) > 255 for part in parts):
        return "a component of its path is longer than 255 bytes"
    return None


def member_kind(member: tarfile.TarInfo) -> str | None:
    """What refused kind of member this is ("symbolic link", "hard link", "device file", "fifo",
    "sparse file", "unsupported type 'X'"), or None for a regular file or a folder."""
    if member.issym():
        return "symbolic link"
    if member.islnk():
        return "hard link"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "fifo"
    if member.issparse() or getattr(member, "sparse", None):
        return "sparse file"
    if not (member.isreg() or member.isdir()):
        return f"unsupported type {member.type.decode('latin-1')!r}"
    return None


def _kind(member: tarfile.TarInfo) -> str | None:
    """Why a member's type is refused, or None for a regular file or folder."""
    kind = member_kind(member)
    if kind in ("symbolic link", "hard link"):
        return f"it is a {kind} (to {member.linkname!r}); links are refused"
    if kind == "fifo":
        return "it is a fifo (named pipe)"
    if kind is not None:
        return f"it {'has an' if kind.startswith('unsupported') else 'is a'} {kind}"
    return None


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class _Extraction:
    """The state of one extraction: what was seen, where it goes, how much it took."""

    def __init__(self, archive: Path, root: Path, max_total_bytes: int, max_files: int,
                 expected: Mapping[str, tuple[int, str]] | None) -> None:
        self.archive = archive
        self.root = root
        self.max_total_bytes = max_total_bytes
        self.max_files = max_files
        self.expected = dict(expected) if expected is not None else None
        self.expected_dirs = ({p for path in self.expected for p in _parents(path)}
                              if self.expected is not None else set())
        self.files: set[str] = set()
        self.dirs: set[str] = set()          # named by a folder member
        self.implicit_dirs: set[str] = set()  # parents of anything seen
        self.members = 0
        self.total = 0

    def refuse(self, member: str | None, why: str) -> BundleError:
        return _refuse(self.archive, member, why)

    def check(self, member: tarfile.TarInfo) -> str:
        why = check_name(member.name) or _kind(member)
        if why:
            raise self.refuse(member.name, why)
        name = member.name.rstrip("/")
        if name in self.files or name in self.dirs:
            raise self.refuse(name, "the archive holds this name twice")
        if member.isreg() and name in self.implicit_dirs:
            raise self.refuse(name, "it is a file, but an earlier member uses it as a folder")
        clash = next((p for p in _parents(name) if p in self.files), None)
        if clash is not None:
            raise self.refuse(name, f"it lies under {clash!r}, which is a file")
        if self.expected is not None:
            self._check_expected(member, name)
        self.members += 1
        if self.members > self.max_files:
            raise self.refuse(name, f"the archive has more than {self.max_files} members, the limit")
        if member.isreg():
            if self.total + member.size > self.max_total_bytes:
                raise self.refuse(name, f"unpacking it would exceed {self.max_total_bytes} bytes in all, "
                                        "the limit")
            self.total += member.size
        try:
            tarfile.data_filter(member, str(self.root))
        except tarfile.FilterError as exc:
            raise self.refuse(name, f"Python's tar data filter refuses it ({exc})") from None
        self.implicit_dirs.update(_parents(name))
        (self.files if member.isreg() else self.dirs).add(name)
        return name

    def _check_expected(self, member: tarfile.TarInfo, name: str) -> None:
        assert self.expected is not None
        if member.isdir():
            if name not in self.expected_dirs:
                raise self.refuse(name, "this folder holds nothing the manifest lists")
            return
        if name not in self.expected:
            raise self.refuse(name, "the manifest does not list this file")
        size = self.expected[name][0]
        if member.size != size:
            raise self.refuse(name, f"its size is {member.size} bytes, but the manifest says {size}")

    def write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        target = self.root / name
        if member.isdir():
            target.mkdir(mode=0o755, parents=True, exist_ok=True)
            return
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None
        digest = hashlib.sha256()
        written = 0
        mode = 0o755 if member.mode & 0o100 else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(target, flags, mode), "wb") as out:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                written += len(chunk)
                out.write(chunk)
        if written != member.size:
            raise self.refuse(name, f"the archive ends inside it ({written} of {member.size} bytes)")
        if self.expected is not None and digest.hexdigest() != self.expected[name][1]:
            raise self.refuse(name, f"its sha256 is {digest.hexdigest()}, but the manifest says "
                                    f"{self.expected[name][1]}")

    def finish(self) -> None:
        if self.expected is not None:
            missing = sorted(set(self.expected) - self.files)
            if missing:
                more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
                raise self.refuse(missing[0], f"the manifest lists it, but the archive lacks it{more}")


def _prepare_dest(dest: Path, archive: Path) -> None:
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise BundleError(f"{archive}: cannot unpack into {dest}: it already exists",
                          hint="Choose a new folder, or remove that one first.")
    dest.parent.mkdir(parents=True, exist_ok=True)


def safe_extract(archive_path: Path | str, dest: Path | str, *, max_total_bytes: int, max_files: int,
                 expected: Mapping[str, tuple[int, str]] | None = None) -> Path:
    """Unpack the gzip'd tar `archive_path` into the new folder `dest` (absent, or an empty folder),
    or refuse it whole with a BundleError (see the module docstring). Returns `dest`.

    `expected` maps member paths to (size, sha256 hex): every file must be listed there and match,
    and every listed file must be present.
    """
    archive, dest = Path(archive_path), Path(dest)
    _prepare_dest(dest, archive)
    stream_limit = max_total_bytes + max_files * _PER_MEMBER_OVERHEAD + HEADER_BUDGET
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        job = _Extraction(archive, tmp, max_total_bytes, max_files, expected)
        _extract_all(archive, job, stream_limit)
        job.finish()
        os.chmod(tmp, 0o755)
        if dest.is_dir():
            dest.rmdir()  # the empty folder the caller made; `rename` would replace it anyway
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _extract_all(archive: Path, job: _Extraction, stream_limit: int) -> None:
    try:
        raw = archive.open("rb")
    except OSError as exc:
        raise BundleError(f"{archive}: cannot read it: {exc.strerror or exc}") from None
    member_name: str | None = None
    with raw, gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
        counter = CountingReader(unzipped, stream_limit)
        try:
            with counter.window(HEADER_BUDGET):  # opening reads the first member's headers
                tar = tarfile.open(fileobj=counter, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
            with tar:
                while True:
                    with counter.window(HEADER_BUDGET):
                        member = tar.next()
                    if member is None:
                        break
                    member_name = member.name
                    name = job.check(member)
                    try:
                        job.write(tar, member, name)
                    except OSError as exc:
                        if isinstance(exc, (gzip.BadGzipFile, EOFError)):
                            raise
                        raise BundleError(f"{archive}: member {name!r}: cannot write it under "
                                          f"{job.root.parent}: {exc.strerror or exc}") from None
                    member_name = None
            _check_trailer(counter, job, tar.offset)
        except TooMuch:
            raise job.refuse(member_name, "the archive unpacks to more data than its limits allow "
                                          "(a compression bomb?)") from None
        except (EOFError, zlib.error, gzip.BadGzipFile, tarfile.ReadError) as exc:
            raise job.refuse(member_name, read_problem(exc)) from None
        except (tarfile.TarError, OSError) as exc:
            raise job.refuse(member_name, f"it cannot be read as a tar archive ({exc})") from None


def _check_trailer(counter: CountingReader, job: _Extraction, end: int) -> None:
    """Read the stream to its end: gzip checks its CRC only there, and tar stops quietly at a
    damaged header, so anything but zeros after the last member (from `end`, where tar stopped,
    including what tar read ahead) means a damaged archive."""
    why = "it holds data after the end of the tar archive (a damaged member header?)"
    ahead = counter.count - end
    if ahead < 0 or ahead > len(counter.tail) or any(counter.tail[len(counter.tail) - ahead:]):
        raise job.refuse(None, why)
    while chunk := counter.read(_CHUNK):
        if chunk.count(0) != len(chunk):
            raise job.refuse(None, why)


def read_problem(exc: BaseException) -> str:
    """One sentence saying why reading the archive failed with `exc` (bad gzip, truncated, corrupt)."""
    if isinstance(exc, gzip.BadGzipFile):
        return f"it is not a gzip-compressed tar archive ({exc})"
    if isinstance(exc, EOFError) or "unexpected end of data" in str(exc):
        return "the archive is truncated: it ends before its last member does"
    if isinstance(exc, zlib.error):
        return f"its compressed data is corrupt ({exc})"
    return f"it is not a valid tar archive ({exc or 'no tar header found'})"


# --- a container's outputs ---------------------------------------------------------------------


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream). Unbuffered:
    each read hands out at most what one chunk still holds, so when the stream breaks, everything
    before the break has been handed out (and whole files in it copied)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        super().__init__()
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = memoryview(bytes(chunk))
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _OutputCopy:
    """The state of one copy of a container's /out (see `extract_outputs`)."""

    def __init__(self, dest: Path, max_total_bytes: int, max_files: int, reserved: Collection[str]) -> None:
        self.dest = dest
        self.max_total_bytes = max_total_bytes
        self.max_files = max_files
        self.reserved = set(reserved)
        self.members = 0
        self.files = 0
        self.bytes = 0
        self.skipped: list[Skipped] = []
        self.seen: set[str] = set()

    def skip(self, name: str, kind: str, detail: str = "") -> None:
        self.skipped.append(Skipped(name[:300], kind, detail[:300]))

    def accept(self, member: tarfile.TarInfo) -> str | None:
        """The member's path under `dest` when it is to be written, else None (skipped, noted)."""
        name = member.name.removeprefix("./").rstrip("/")
        if name in ("", "."):
            return None
        why = check_name(name)
        if why:
            self.skip(name, "unsafe name", why)
            return None
        kind = member_kind(member)
        if kind is not None:
            linked = f"to {member.linkname!r}" if member.issym() or member.islnk() else ""
            self.skip(name, kind, linked)
            return None
        if name.split("/")[0] in self.reserved:
            self.skip(name, "reserved name", "the lab writes this file itself")
            return None
        if name in self.seen:
            self.skip(name, "duplicate", "the archive holds this name twice")
            return None
        try:
            tarfile.data_filter(member, str(self.dest))
        except tarfile.FilterError as exc:
            self.skip(name, "refused", f"Python's tar data filter: {exc}")
            return None
        self.seen.add(name)
        return name

    def write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        """Write one regular file; folders are made only for the files in them. Nothing here
        follows a link: the lab made every path under `dest`, and it never makes a link."""
        target = self.dest / name
        clash = next((p for p in _parents(name) if (self.dest / p).exists() and not (self.dest / p).is_dir()),
                     None)
        if clash is not None or target.exists():
            self.skip(name, "name clash", f"{clash or name!r} already exists")
            return
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None
        mode = 0o755 if member.mode & 0o100 else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        written = 0
        try:
            with os.fdopen(os.open(target, flags, mode), "wb") as out:
                while chunk := source.read(_CHUNK):
                    written += len(chunk)
                    out.write(chunk)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        if written != member.size:
            target.unlink(missing_ok=True)
            raise EOFError(f"the archive ends inside {name!r}")
        self.files += 1
        self.bytes += written

    def result(self, folder: str, stopped: str | None) -> OutputCopy:
        return OutputCopy(folder=folder, files=self.files, bytes=self.bytes, skipped=tuple(self.skipped),
                          stopped=stopped)


def extract_outputs(chunks: Iterable[bytes], dest: Path | str, *, max_total_bytes: int, max_files: int,
                    reserved: Collection[str] = ()) -> OutputCopy:
    """Copy a container's output folder, streamed as an uncompressed tar (the engine's archive of
    `/out/.`), into `dest`, the lab's own folder (made if absent), and say what was copied.

    Unlike `safe_extract`, nothing the tar holds makes this fail: the container's outputs are
    evidence, and a refused entry is noted in the result (`skipped`), never created. Links (symbolic
    and hard), fifos, devices and sparse files are never made; nor are unsafe names (the same
    checks as bundles), names given twice, or top-level names in `reserved` (files the lab writes
    itself into `dest`). Folders are made only as parents of the files copied. The copy stops,
    with a note in `stopped`, at the first file that would take it past `max_total_bytes`, after
    `max_files` entries, or when the stream breaks; what was copied by then stays.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    folder = dest.name
    job = _OutputCopy(dest, max_total_bytes, max_files, reserved)
    stream_limit = max_total_bytes + max_files * _PER_MEMBER_OVERHEAD + HEADER_BUDGET
    counter = CountingReader(_ChunkReader(chunks), stream_limit)
    stopped: str | None = None
    name: str | None = None
    try:
        with counter.window(HEADER_BUDGET):
            tar = tarfile.open(fileobj=counter, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
        with tar:
            while True:
                with counter.window(HEADER_BUDGET):
                    member = tar.next()
                if member is None:
                    break
                job.members += 1
                if job.members > max_files:
                    stopped = f"/out holds more than {max_files} entries, the cap; the rest was not copied"
                    break
                name = job.accept(member)
                if name is None or not member.isreg():
                    continue
                if job.bytes + member.size > max_total_bytes:
                    stopped = (f"{name!r} ({format_bytes(member.size)}) would take the copy past its cap of "
                               f"{format_bytes(max_total_bytes)}; it and the rest of /out were not copied")
                    break
                job.write(tar, member, name)
                name = None
    except TooMuch:
        stopped = "the archive of /out ran past its size cap (headers included); the rest was not copied"
    except (EOFError, zlib.error, tarfile.TarError) as exc:
        where = f" at {name!r}" if name else ""
        stopped = f"the archive of /out could not be read{where} ({exc or type(exc).__name__})"
    except OSError as exc:
        where = f" at {name!r}" if name else ""
        stopped = f"the copy of /out failed{where}: {exc.strerror or exc}"
    return job.result(folder, stopped)
