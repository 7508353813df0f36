"""Every tar the lab writes, in one module: normalised entries (owner root, mtime 0), a tree
streamed file by file, raw members for a tar whose sizes are known ahead (the image load's),
a tar streamed to a request while it is written (`TarStream`), and a folder streamed as chunks
(`folder_chunks`, as an engine's archive API gives /out). What goes into each tar is decided by
its user (lab.image.render: the build context; lab.engine.docker_images: docker-save archives);
reading tars is lab.core.safetar's job."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import queue
import tarfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from lab.core.hashing import HashingReader

WriteTar = Callable[[BinaryIO], object]


def stream_tar(out: BinaryIO) -> tarfile.TarFile:
    """A tar written to `out` as a stream (no seeking), in the PAX format."""
    return tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)


@contextlib.contextmanager
def gzipped_tar(raw: BinaryIO, *, mtime: int, compresslevel: int) -> Iterator[tarfile.TarFile]:
    """A tar written into a gzip stream on `raw` (a bundle): PAX format, the gzip header's own time
    and name fixed, so the same entries give the same bytes."""
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=mtime) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        yield tar


def tar_info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "", mtime: int = 0) -> tarfile.TarInfo:
    """A tar entry with normalised metadata: owner root, no names, mtime 0 (or the one given)."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname, info.mtime = kind, mode, size, link, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    tar.addfile(tar_info(name, tarfile.DIRTYPE, mode))


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tar.addfile(tar_info(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))


def add_file(tar: tarfile.TarFile, name: str, source: Path, size: int, mode: int = 0o644) -> None:
    """A file of `size` bytes read from `source` while the tar is written."""
    with source.open("rb") as fh:
        tar.addfile(tar_info(name, tarfile.REGTYPE, mode, size), fh)


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry of a tree put into a tar, with the metadata the tar keeps."""

    path: str                 # relative, "/"-separated
    kind: str                 # "dir" | "file" | "symlink"
    mode: int                 # 0o755 or 0o644: only the executable bit survives
    size: int = 0
    link: str = ""            # a symlink's target (relative, inside the tree)
    source: Path = field(default=Path())


def write_tree(entries: Iterable[TreeEntry], out: BinaryIO, under: str = "",
               seen: Callable[[TreeEntry, str], None] | None = None) -> None:
    """A tree as a tar, streamed file by file in the order given, with normalised metadata: at the
    root, or `under` a folder (with the folders above it, as an image has them). `seen` gets each
    entry and its content's SHA-256 (a symlink: its target), hashed while the tar reads it."""
    prefix = under.strip("/") + "/" if under.strip("/") else ""
    with stream_tar(out) as tar:
        parts = prefix.rstrip("/").split("/") if prefix else []
        for i in range(len(parts)):
            add_dir(tar, "/".join(parts[:i + 1]))
        for e in entries:
            name, content = prefix + e.path, e.link
            if e.kind == "dir":
                tar.addfile(tar_info(name, tarfile.DIRTYPE, e.mode))
            elif e.kind == "symlink":
                tar.addfile(tar_info(name, tarfile.SYMTYPE, e.mode, link=e.link))
            else:
                with e.source.open("rb") as fh:
                    reader = HashingReader(fh)
                    tar.addfile(tar_info(name, tarfile.REGTYPE, e.mode, e.size), reader)
                content = reader.hexdigest()
            if seen is not None:
                seen(e, content)


def write_member(out: BinaryIO, name: str, size: int, write_data: Callable[[BinaryIO], object]) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    out.write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
    write_data(out)
    out.write(b"\0" * (-size % tarfile.BLOCKSIZE))


def end_archive(out: BinaryIO) -> None:
    """The two zero blocks that end a tar written member by member (`write_member`)."""
    out.write(b"\0" * 1024)


class TarStream:
    """A tar that `write_tar` writes in a thread, read in chunks as a request's body (chunked), so
    that the engine receives it while it is written, with no temp file. When writing fails, reading
    raises instead of ending, so the engine sees a broken upload, never a short tar."""

    def __init__(self, write_tar: Callable[[BinaryIO], object], join_s: float = 60.0) -> None:
        self.join_s = join_s  # how long the writer may take to end once the reader is closed
        self.failure: BaseException | None = None
        self._read_fd, write_fd = os.pipe()

        def produce() -> None:
            try:
                with open(write_fd, "wb", buffering=1 << 20) as out:
                    write_tar(out)
            except BrokenPipeError:
                pass  # the request ended first: its own error says why
            except BaseException as exc:  # noqa: BLE001 - handed to the request's thread
                self.failure = exc

        self._writer = threading.Thread(target=produce, name="tar-stream", daemon=True)
        self._writer.start()
        self._reader = open(self._read_fd, "rb", buffering=0)  # noqa: SIM115 - closed by __exit__

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self._reader.read(1 << 20):
            yield chunk
        self._writer.join()
        if self.failure is not None:
            raise OSError(f"the tar could not be written: {self.failure}")

    def why_broken(self, what: str, exc: BaseException, short: Callable[[BaseException], str]) -> str:
        """Why the upload to `what` broke: the tar's writer, else the receiver's error `exc` in
        the words `short` gives it."""
        if self.failure is not None:
            return f"the tar to {what} could not be written: {self.failure}"
        return f"the engine could not {what}: {short(exc)}"

    def __enter__(self) -> TarStream:
        return self

    def __exit__(self, *exc) -> None:
        self._reader.close()  # a writer still writing gets a broken pipe and ends
        self._writer.join(timeout=self.join_s)


class _QueueWriter(io.RawIOBase):
    """A write-only file whose writes become chunks on a bounded queue (a tar streamed to a reader)."""

    def __init__(self, q: queue.Queue, stop: threading.Event) -> None:
        self.q, self.stop = q, stop

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        data = bytes(b)
        while not self.stop.is_set():
            try:
                self.q.put(data, timeout=0.5)
                return len(data)
            except queue.Full:
                continue
        raise OSError("the reader stopped")


def folder_chunks(out: Path) -> Iterator[bytes]:
    """/out as an uncompressed tar stream, written as an engine's archive API would (links, fifos and
    hard links as tar members, never followed), for lab.core.safetar.extract_outputs. Every process
    of the run has ended: nothing changes the folder while it is read."""
    q: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()
    done = object()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with stream_tar(_QueueWriter(q, stop)) as tar:
                tar.add(str(out), arcname=".", recursive=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            failure.append(exc)
        finally:
            with contextlib.suppress(Exception):
                while not stop.is_set():
                    try:
                        q.put(done, timeout=0.5)
                        break
                    except queue.Full:
                        continue

    thread = threading.Thread(target=produce, daemon=True, name="lab-local-tar")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                break
            yield item
        if failure and not isinstance(failure[0], OSError):
            raise OSError(f"reading /out failed: {failure[0]}")
    finally:
        stop.set()
        thread.join(10)
