"""One captured stream of a run (stdout or stderr) into a file, capped: shared by the Docker engine and
the local engine."""

from __future__ import annotations

from pathlib import Path

from lab.core.records import STREAM_TAIL_BYTES, StreamCapture, format_bytes


class StreamFile:
    """One stream into one file: the first `cap` bytes, then (past the cap) only the last
    STREAM_TAIL_BYTES, written after a marker line when the stream ends."""

    def __init__(self, name: str, path: Path, cap: int) -> None:
        self.name, self.path, self.cap = name, path, cap
        self.fh = path.open("wb")
        self.total = 0
        self.head = 0
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.head < self.cap:
            part = data[: self.cap - self.head]
            self.fh.write(part)
            self.head += len(part)
            data = data[len(part):]
        if data:
            self.tail += data
            del self.tail[:-STREAM_TAIL_BYTES]

    def finish(self, note: str | None) -> StreamCapture:
        """Close the file (once; later calls only report)."""
        if not self.fh.closed:
            if self.total > self.head:
                dropped = self.total - self.head - len(self.tail)
                self.fh.write(f"\n[torch-repro-lab: {self.name} cut at {format_bytes(self.cap)}; "
                              f"{dropped} bytes dropped here; its last {len(self.tail)} bytes follow]\n".encode())
                self.fh.write(self.tail)
            self.fh.close()
        return StreamCapture(self.name, self.total, self.head + len(self.tail), self.cap, note)
