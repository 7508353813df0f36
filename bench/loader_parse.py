"""Loader-log parse throughput and peak memory, against a bare line read of the same file.

A real captured LD_DEBUG log (tests/data) is concatenated to SIZE_MB (default 500) in a
temporary folder, then read twice in this one run: once line by line doing nothing
(the floor), once through lab.loader.parse_dir. Prints MB/s for both, their ratio, and
the parser's peak memory (tracemalloc), which must stay flat as the log grows.

    python bench/loader_parse.py [SIZE_MB]
"""

from __future__ import annotations

import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.loader import parse_dir  # noqa: E402

SOURCE = ROOT / "tests" / "data" / "ld_debug" / "host-x86_64-torch2.13-inductor" / "ld.5818"


def make_log(folder: Path, size_mb: int) -> Path:
    chunk = SOURCE.read_bytes()
    target = folder / "ld.1"
    with target.open("wb") as fh:
        while fh.tell() < size_mb * 2**20:
            fh.write(chunk)
    return target


def bare_read(folder: Path) -> None:
    for path in folder.iterdir():
        with path.open(encoding="utf-8", errors="replace") as fh:
            for _ in fh:
                pass


def timed(fn, folder: Path) -> tuple[float, int]:
    tracemalloc.start()
    start = time.perf_counter()
    fn(folder)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return elapsed, peak


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log = make_log(folder, size_mb)
        mb = log.stat().st_size / 2**20
        read_s, read_peak = timed(bare_read, folder)
        parse_s, parse_peak = timed(parse_dir, folder)
    print(f"loader log: {mb:.0f} MB (real log {SOURCE.name} repeated)")
    print(f"bare line read : {mb / read_s:8.1f} MB/s  peak {read_peak / 2**20:6.1f} MiB")
    print(f"parse_dir      : {mb / parse_s:8.1f} MB/s  peak {parse_peak / 2**20:6.1f} MiB")
    print(f"ratio parse/read time: {parse_s / read_s:.2f}x")


if __name__ == "__main__":
    main()
