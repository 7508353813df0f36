"""The lab's loader-log parser against a naive one, on the same file, in one run.

What it times: finding duplicate runtimes in an LD_DEBUG log. A real captured log with a real
duplicate (tests/data/ld_debug/arm64-torch2.5.1-libgomp: two libgomp in one process, every file
of that run, one after the other) is repeated to SIZE_MB (default 500) in a temporary folder,
then read three times, each in its own child process:

- `read`: every line read and dropped, nothing else (the floor: what reading the file costs);
- `naive`: the baseline a person would write by hand, as in the seed's pipeline (`grep 'calling
  init'` over the log): one regular expression per line for `calling init: PATH`, each path's
  basename matched against the runtime families, and a family with two paths in one pid reported;
- `lab`: lab.analyze.loader.parse_dir then find_duplicate_runtimes (the whole state machine:
  who needed each file, search paths, link maps, preloads, canonical paths).

Prints each side's MB/s and peak resident memory (ru_maxrss; the lab's must stay flat as the log
grows: compare SIZE_MB 50 with 500), what each found (they must agree), and the headline on the
last line, `RESULT loader_parse_lab_over_naive=`: the lab's time over the naive scan's.

    python bench/loader_parse.py [SIZE_MB]
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "tests" / "data" / "ld_debug" / "arm64-torch2.5.1-libgomp"
_INIT = re.compile(r"^\s*(\d+):\s+calling init: (\S+)")


def make_log(folder: Path, size_mb: int) -> Path:
    chunk = b"".join(p.read_bytes() for p in sorted(SOURCE.iterdir()))  # every line names its pid
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


def naive_scan(folder: Path) -> list[list]:
    """The hand-written baseline: a regex per line, the family table, two paths of a family in a pid."""
    from lab.core.runtimes import RUNTIME_FAMILIES
    seen: dict[tuple[int, str], set[str]] = {}
    for path in folder.iterdir():
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = _INIT.match(line)
                if m is None:
                    continue
                base = m.group(2).rsplit("/", 1)[-1]
                for family in RUNTIME_FAMILIES.values():
                    if family.pattern.match(base):
                        seen.setdefault((int(m.group(1)), family.name), set()).add(m.group(2))
    return sorted([pid, family] for (pid, family), paths in seen.items() if len(paths) > 1)


def child(kind: str, folder: Path) -> None:
    from lab.analyze.loader import find_duplicate_runtimes, parse_dir
    start = time.perf_counter()
    if kind == "read":
        bare_read(folder)
        found = None
    elif kind == "naive":
        found = naive_scan(folder)
    else:
        found = sorted([d.pid, d.family] for d in find_duplicate_runtimes(parse_dir(folder)))
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
        naive = measure("naive", folder)
        lab = measure("lab", folder)
    print(f"loader log: {mb:.0f} MB (the real logs of {SOURCE.relative_to(ROOT)}/ repeated); times: finding "
          "duplicate runtimes in it, each side in its own process")
    print(f"bare line read (floor)   : {mb / read['seconds']:8.1f} MB/s  {read['seconds']:7.2f} s  "
          f"peak RSS {read['peak_mib']:6.1f} MiB")
    for name, side in (("naive regex scan", naive), ("lab parse_dir", lab)):
        print(f"{name:<25}: {mb / side['seconds']:8.1f} MB/s  {side['seconds']:7.2f} s  "
              f"peak RSS {side['peak_mib']:6.1f} MiB  found {_words(side['duplicates'])}")
    print("same answer: " + ("yes" if naive["duplicates"] == lab["duplicates"] else "NO"))
    print(f"ratio lab/naive time: {lab['seconds'] / naive['seconds']:.2f}x; lab/read: "
          f"{lab['seconds'] / read['seconds']:.2f}x")
    print(f"RESULT loader_parse_lab_over_naive={lab['seconds'] / naive['seconds']:.2f}")


def _words(found: list) -> str:
    families = sorted({family for _, family in found})
    return f"{len(found)} duplicate(s) ({', '.join(families) or 'none'})"


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
