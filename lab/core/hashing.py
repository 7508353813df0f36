"""Hashing on the way: a writer (the SHA-256 of a tar while it is streamed), a reader (a file's
while a tar reads it), and a writer that only counts."""

from __future__ import annotations

import hashlib
import io
from typing import BinaryIO


class HashingWriter(io.RawIOBase):
    """Writes to `out` and keeps the SHA-256 and the count of every byte written."""

    def __init__(self, out: BinaryIO) -> None:
        super().__init__()
        self._out, self._sha = out, hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self._sha.update(b)
        self.size += len(b)
        return self._out.write(b)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class HashingReader:
    """Reads from `fh` and keeps the SHA-256 of every byte read."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh, self._sha = fh, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._sha.update(data)
        return data

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class CountingWriter(io.RawIOBase):
    """Writes to `out` (or nowhere) and counts the bytes, without hashing them."""

    def __init__(self, out: BinaryIO | None = None) -> None:
        super().__init__()
        self._out, self.size = out, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.size += len(b)
        return self._out.write(b) if self._out is not None else len(b)
