"""Loader-log parse throughput and peak memory, against a bare line read of the same file.

A real captured LD_DEBUG log (tests/data) is concatenated to SIZE_MB (default 500) in a
temporary folder, then read twice in this one run, each in its own child process: once
line by line doing nothing (the floor), once through lab.loader.parse_dir. Prints MB/s
for both, their ratio, and each child's peak resident memory (ru_maxrss), which for the
parser must stay flat as the log grows (compare SIZE_MB 50 with 500).

    python bench/loader_parse.py [SIZE_MB]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def child(kind: str, folder: Path) -> None:
    from lab.analyze.loader import find_duplicate_runtimes, parse_dir
    start = time.perf_counter()
    if kind == "read":
        bare_read(folder)
        found = None
    else:
        found = len(find_duplicate_runtimes(parse_dir(folder)))
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": elapsed, "peak_mib": peak_kib / 1024, "duplicates": found}))


def measure(kind: str, folder: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(folder)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log = make_log(folder, size_mb)
        mb = log.stat().st_size / 2**20
        read = measure("read", folder)
        parse = measure("parse", folder)
    print(f"loader log: {mb:.0f} MB (real log {SOURCE.relative_to(ROOT)} repeated)")
    print(f"bare line read : {mb / read['seconds']:8.1f} MB/s  peak RSS {read['peak_mib']:6.1f} MiB")
    print(f"parse_dir      : {mb / parse['seconds']:8.1f} MB/s  peak RSS {parse['peak_mib']:6.1f} MiB")
    print(f"ratio parse/read time: {parse['seconds'] / read['seconds']:.2f}x")
    print(f"RESULT loader_parse_mb_per_s={mb / parse['seconds']:.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
