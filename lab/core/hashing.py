"""A writer that hashes what passes through it (the SHA-256 of a tar while it is streamed)."""

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
