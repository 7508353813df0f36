"""The run history: an SQLite index (stdlib sqlite3) of every run folder under a runs root.

The run folders stay the source of truth. The index (`<runs root>/index.sqlite3`) is a cache of
their result.json files: `record` adds one folder as soon as it is written, and `sync` (run before
every query) walks the root and brings the index up to date, adding folders it lacks, refreshing
those whose result.json changed and dropping those that are gone; a missing index is simply built.
An index that is not an SQLite file, or not ours (another application id or schema), is moved
aside and rebuilt, with a note: never a crash. Writers take SQLite's write lock (`BEGIN
IMMEDIATE`) with a long busy timeout, so several `lab` processes can record at once.

What a bundle or a bisection refers to is kept by `gc`: bisect folders name their probes in
bisect.json, and `lab bundle` appends the folder it packed to `<runs root>/bundles.log`.

Whose runs they are (lab.core.runmarker): a folder the lab made for a run carries a marker that
checks out against the runs root's key; its `created` column is the time the lab saw it made.
A run folder's sub-folders are its content and never runs of their own (a replay's `replayed/`
holds a stranger's result.json), and below a marked folder (an ablation's rungs) only marked
folders are runs. An unmarked folder with a result.json (made before markers, or unpacked by
hand) is listed but never `gc`'s to remove, nor counted when gc looks for the newest of a case.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from lab.core.errors import LabError
from lab.core.results import RESULT_NAME, RunResult, parse_result
from lab.core.runmarker import MARKER, marked_since, runs_key

INDEX_NAME = "index.sqlite3"
BUNDLES_LOG = "bundles.log"
APPLICATION_ID = 0x4C414231          # "LAB1"
SCHEMA = 2                           # 2: `created`, from the lab's own marker
_BUSY_TIMEOUT_S = 60
_OPEN_TRIES = 5     # a transient "disk I/O error" at open is tried again this many times
_TABLES = """
CREATE TABLE IF NOT EXISTS runs (
  path TEXT PRIMARY KEY,        -- the run folder, relative to the runs root
  scenario TEXT NOT NULL, case_name TEXT NOT NULL, torch TEXT NOT NULL, arch TEXT NOT NULL,
  backend TEXT, verdict TEXT NOT NULL, reason TEXT NOT NULL, started TEXT NOT NULL,
  kind TEXT NOT NULL,           -- run, probe or replay
  stamp TEXT NOT NULL,          -- mtime and size of result.json, mtime of the marker
  created INTEGER               -- ns: when the lab made the folder (its marker), NULL if not the lab's
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started);
CREATE TABLE IF NOT EXISTS refs (
  path TEXT NOT NULL, referrer TEXT NOT NULL, how TEXT NOT NULL,   -- how: bisect, matrix or bundle
  PRIMARY KEY (path, referrer)
);
"""


_COLUMNS = ",".join("?" * 12)


def _stamp(run_dir: Path, result: os.stat_result) -> str:
    """What says a row is stale: result.json's mtime and size, the marker's mtime."""
    try:
        marker = str((run_dir / MARKER).lstat().st_mtime_ns)
    except OSError:
        marker = "-"
    return f"{result.st_mtime_ns}:{result.st_size}:{marker}"


class _Foreign(Exception):
    """The index file is an SQLite database, but not this lab's (or not this schema)."""


class HistoryError(LabError):
    """A bad option of `lab runs` (a date, an age, --gc without a rule)."""


@dataclass(frozen=True)
class RunEntry:
    path: Path               # the run folder
    scenario: str
    case: str
    torch: str
    arch: str
    backend: str | None
    verdict: str
    reason: str
    started: str
    kind: str                # run | probe | replay | cell (a matrix's run)

    def to_json(self) -> dict:
        return {"run_dir": str(self.path), "scenario": self.scenario, "case": self.case, "torch": self.torch,
                "arch": self.arch, "backend": self.backend, "verdict": self.verdict, "reason": self.reason,
                "started": self.started, "kind": self.kind}


@dataclass(frozen=True)
class FlakyCase:
    case: str
    scenario: str
    runs: int
    reproduced: int
    runnable: int            # runs that reached reproduced or not_reproduced

    @property
    def rate(self) -> float:
        return self.reproduced / self.runnable

    def to_json(self) -> dict:
        return {"case": self.case, "scenario": self.scenario, "runs": self.runs, "reproduced": self.reproduced,
                "runnable": self.runnable, "rate": round(self.rate, 4)}


@dataclass(frozen=True)
class Collected:
    removed: tuple[Path, ...]
    kept_referenced: tuple[Path, ...]
    not_marked: tuple[Path, ...] = ()   # run folders without the lab's marker: never removed


def kind_of(rel: str) -> str:
    parts = rel.split("/")
    if re.search(r"-replay(-\d+)?$", parts[-1]):
        return "replay"
    if len(parts) >= 2 and parts[-2].startswith("bisect-"):
        return "probe"
    return "run"


def root_of(run_dir: Path) -> Path:
    """The runs root a run folder belongs to: the nearest ancestor with an index, else
    runs/<scenario>/<run> (or runs/<scenario>/bisect-.../<probe>)."""
    run_dir = run_dir.resolve()
    for parent in run_dir.parents:
        if (parent / INDEX_NAME).exists():
            return parent
    up = 3 if run_dir.parent.name.startswith("bisect-") else 2
    return run_dir.parents[up - 1]


class RunIndex:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / INDEX_NAME
        self.notes: list[str] = []

    # --- the database -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open()
        except sqlite3.OperationalError as exc:
            raise LabError(f"the run history {self.path} cannot be opened: {exc}.",
                           hint="Check the runs folder's permissions and free space, then try again.") from None
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            raise LabError(f"the run history {self.path} could not be read or written: {exc}.",
                           hint="Another lab may hold it for long; try again.") from None
        finally:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        for attempt in range(_OPEN_TRIES):
            try:
                return self._open_checked()
            except sqlite3.OperationalError as exc:
                # SQLite answers "disk I/O error" now and then when several processes open the index
                # at once (seen once in the four-writer test, tests/history): brief, so try again
                if "disk I/O error" not in str(exc) or attempt == _OPEN_TRIES - 1:
                    raise  # locked, read-only, no space: not the file's fault
                time.sleep(0.1 * (attempt + 1))
            except (sqlite3.DatabaseError, _Foreign) as exc:
                self._move_aside(f"it is not an index this lab can read ({exc})")
                return self._open_checked()
        raise AssertionError("unreachable: the last try returns or raises")

    def _open_checked(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            app, version = self._ids(conn)
            if (app, version) == (0, 0):
                conn.execute("BEGIN IMMEDIATE")
                app, version = self._ids(conn)
                if (app, version) == (0, 0):
                    if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                        conn.execute("ROLLBACK")
                        raise _Foreign("a foreign SQLite database")
                    for statement in _TABLES.split(";"):
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version = {SCHEMA}")
                    app, version = APPLICATION_ID, SCHEMA
                conn.execute("COMMIT")
            if app != APPLICATION_ID:
                raise _Foreign(f"a foreign SQLite database (application id {app:#x})")
            if 0 < version < SCHEMA:  # an older index of this lab: a cache, rebuilt from the folders
                conn.execute("BEGIN IMMEDIATE")
                if self._ids(conn)[1] < SCHEMA:
                    conn.execute("DROP TABLE IF EXISTS runs")
                    conn.execute("DROP TABLE IF EXISTS refs")
                    for statement in _TABLES.split(";"):
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {SCHEMA}")
                conn.execute("COMMIT")
                version = SCHEMA
            if version != SCHEMA:
                raise _Foreign(f"index schema {version}, this lab reads {SCHEMA}")
            return conn
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _ids(conn: sqlite3.Connection) -> tuple[int, int]:
        return (conn.execute("PRAGMA application_id").fetchone()[0], conn.execute("PRAGMA user_version").fetchone()[0])

    def _move_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{INDEX_NAME}.broken-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            self.path.replace(aside)
        for suffix in ("-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(self.path) + suffix).unlink()
        self.notes.append(f"{self.path}: {why}; moved to {aside.name} and rebuilt from the run folders.")

    # --- writing ------------------------------------------------------------------------------
    def _rel(self, run_dir: Path) -> str:
        run_dir = Path(run_dir).resolve()
        try:
            return run_dir.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return run_dir.as_posix()

    def _abs(self, rel: str) -> Path:
        return Path(rel) if rel.startswith("/") else self.root / rel

    def _row(self, run_dir: Path, key: bytes | None) -> tuple | None:
        rel = self._rel(run_dir)
        file = Path(run_dir) / RESULT_NAME
        try:
            st = file.stat()
            result = parse_result(file.read_bytes(), str(file))
        except (OSError, LabError):
            return None
        stamp = _stamp(Path(run_dir), st)
        created = marked_since(self.root, Path(run_dir), key)
        if isinstance(result, RunResult):
            return (rel, result.scenario, result.case, result.torch, result.arch, result.backend,
                    result.verdict.value, result.reason, result.started, kind_of(rel), stamp, created)
        started = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat(timespec="seconds")
        return (rel, result.scenario, result.case, result.torch, result.arch, result.backend, result.status,
                result.reason, started, kind_of(rel), stamp, created)

    def _is_run(self, run_dir: Path, key: bytes | None) -> bool:
        """Whether a folder with a result.json is a run of this root: not inside another run
        folder, and below a marked folder only when marked itself."""
        run_dir = Path(run_dir).resolve()
        root = self.root.resolve()
        if root not in run_dir.parents:
            return True  # recorded from elsewhere (`--out`): the caller's own run folder
        for parent in run_dir.parents:
            if parent == root:
                return True
            if (parent / RESULT_NAME).exists():
                return False
            if (parent / MARKER).exists():
                return marked_since(self.root, run_dir, key) is not None
        return True

    def record(self, run_dir: Path) -> None:
        """Add or refresh one run folder (after its result.json is written)."""
        key = runs_key(self.root, create=False)
        if not self._is_run(run_dir, key):
            return
        row = self._row(run_dir, key)
        if row is None:
            return
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"INSERT OR REPLACE INTO runs VALUES ({_COLUMNS})", row)
            conn.execute("COMMIT")

    def sync(self) -> None:
        """Bring the index up to date with the folders under the root."""
        if not self.root.is_dir():
            return
        key = runs_key(self.root, create=False)
        found = dict(self._scan(key))
        refs = list(self._refs())
        with self._db() as conn:
            known = dict(conn.execute("SELECT path, stamp FROM runs").fetchall())
            fresh = [row for rel, stamp in found.items() if known.get(rel) != stamp
                     and (row := self._row(self._abs(rel), key)) is not None]
            conn.execute("BEGIN IMMEDIATE")
            # under the write lock: a folder another process made and recorded after the walk is kept
            gone = [rel for (rel,) in conn.execute("SELECT path FROM runs")
                    if rel not in found and (not (self._abs(rel) / RESULT_NAME).exists()
                                             or not self._is_run(self._abs(rel), key))]
            conn.executemany(f"INSERT OR REPLACE INTO runs VALUES ({_COLUMNS})", fresh)
            conn.executemany("DELETE FROM runs WHERE path = ?", [(g,) for g in gone])
            conn.execute("DELETE FROM refs")
            conn.executemany("INSERT OR IGNORE INTO refs VALUES (?,?,?)", refs)
            conn.execute("COMMIT")

    def _scan(self, key: bytes | None) -> Iterator[tuple[str, str]]:
        """(rel, stamp) of each run folder: one with a result.json, never inside another run folder
        (its sub-folders, a replay's `replayed/` among them, are its content), and below a marked
        folder (an ablation's, a replay's before its result) only when marked itself."""
        below_marked: set[str] = set()
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            here = Path(folder)
            strict = folder in below_marked
            if RESULT_NAME in files:
                if not strict or marked_since(self.root, here, key) is not None:
                    with contextlib.suppress(OSError):
                        yield self._rel(here), _stamp(here, (here / RESULT_NAME).stat())
                dirs[:] = []
                continue
            if strict or MARKER in files:
                below_marked.update(os.path.join(folder, d) for d in dirs)

    def _refs(self) -> Iterator[tuple[str, str, str]]:
        for name, how in (("bisect.json", "bisect"), ("matrix.json", "matrix")):
            for doc in self.root.glob(f"*/*/{name}"):
                try:
                    data = json.loads(doc.read_text())
                except (OSError, ValueError):
                    continue
                dirs = ([s.get("run_dir") for s in data.get("steps", [])] if how == "bisect" else
                        [r.get("run_dir") for c in data.get("cells", []) for r in c.get("runs", [])])
                for d in dirs:
                    if d:
                        path = Path(d) if Path(d).is_absolute() else Path.cwd() / d
                        yield self._rel(path), self._rel(doc.parent), how
        log = self.root / BUNDLES_LOG
        if log.is_file():
            for line in log.read_text(errors="replace").splitlines():
                run_dir, _, bundle = line.partition("\t")
                if run_dir:
                    yield self._rel(Path(run_dir)), bundle or "?", "bundle"

    def note_bundle(self, run_dir: Path, bundle: Path) -> None:
        """`lab bundle` packed `run_dir` into `bundle`: gc keeps the folder."""
        with open(self.root / BUNDLES_LOG, "a", encoding="utf-8") as f:
            f.write(f"{Path(run_dir).resolve()}\t{Path(bundle).resolve()}\n")

    # --- reading ------------------------------------------------------------------------------
    def query(self, scenario: str | None = None, torch: str | None = None, arch: str | None = None,
              verdict: str | None = None, since: datetime | None = None) -> list[RunEntry]:
        self.sync()
        if not self.root.is_dir():
            return []
        where, args = [], []
        for column, value in (("scenario", scenario), ("torch", torch), ("arch", arch), ("verdict", verdict)):
            if value is not None:
                where.append(f"r.{column} = ?")
                args.append(value)
        if since is not None:
            where.append("r.started >= ?")
            args.append(since.isoformat(timespec="seconds"))
        sql = ("SELECT r.path, r.scenario, r.case_name, r.torch, r.arch, r.backend, r.verdict, r.reason, r.started, "
               "CASE WHEN r.kind = 'run' AND EXISTS (SELECT 1 FROM refs f WHERE f.path = r.path AND f.how = 'matrix')"
               " THEN 'cell' ELSE r.kind END FROM runs r" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY r.started DESC, r.path DESC")
        with self._db() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [RunEntry(self._abs(r[0]), *r[1:]) for r in rows]

    def flaky(self, scenario: str | None = None) -> list[FlakyCase]:
        """Cases whose runs (repeats, reruns, probes, replays) reached different verdicts about the bug."""
        self.sync()
        if not self.root.is_dir():
            return []
        sql = ("SELECT case_name, scenario, count(*), sum(verdict = 'reproduced'), "
               "sum(verdict IN ('reproduced', 'not_reproduced')) FROM runs "
               + ("WHERE scenario = ? " if scenario else "") + "GROUP BY case_name, scenario "
               "HAVING sum(verdict = 'reproduced') > 0 AND sum(verdict = 'not_reproduced') > 0 ORDER BY case_name")
        with self._db() as conn:
            rows = conn.execute(sql, [scenario] if scenario else []).fetchall()
        return [FlakyCase(*r) for r in rows]

    def gc(self, older_than: timedelta | None, keep: int | None, now: datetime | None = None,
           dry_run: bool = False) -> Collected:
        """Remove run folders older than `older_than` and beyond the newest `keep` of their case (both
        when both are given). Only folders the lab made for the user's runs (their marker checks
        out) are candidates, ordered and aged by when the lab made them, never by a result.json's
        `started`; the newest of each case is always kept (a replay's runs are ranked apart from
        the user's own), and so are a bisection's probes and what a bisection or a bundle refers to."""
        if older_than is None and keep is None:
            raise HistoryError("`lab runs --gc` needs --older-than AGE or --keep N (or both), so that it "
                               "knows which run folders to remove.")
        now = now or datetime.now(timezone.utc)
        self.sync()
        if not self.root.is_dir():
            return Collected((), ())
        with self._db() as conn:
            rows = conn.execute("SELECT path, case_name, created, kind FROM runs WHERE created IS NOT NULL "
                                "ORDER BY case_name, created DESC, path DESC").fetchall()
            protected = {p for (p,) in conn.execute("SELECT path FROM refs WHERE how IN ('bisect', 'bundle')")}
            foreign = tuple(self._abs(p) for (p,) in conn.execute("SELECT path FROM runs WHERE created IS NULL "
                                                                  "ORDER BY path"))
        cutoff = None if older_than is None else int((now - older_than).timestamp() * 1e9)
        removed, kept, rank = [], [], {}
        for rel, case, created, kind in rows:
            group = (case, kind == "replay")
            n = rank[group] = rank.get(group, 0) + 1
            old = cutoff is None or created < cutoff
            surplus = n > max(keep if keep is not None else 1, 1)
            if not (old and surplus):
                continue
            if kind == "probe" or rel in protected:
                kept.append(self._abs(rel))
                continue
            removed.append(self._abs(rel))
        if not dry_run:
            key, done = runs_key(self.root, create=False), []
            for path in removed:  # checked again: the folder may have changed since the sync
                if (path / RESULT_NAME).is_file() and not path.is_symlink() \
                        and self.root.resolve() in path.resolve().parents \
                        and marked_since(self.root, path, key) is not None:
                    shutil.rmtree(path)
                    done.append(path)
            removed = done
            self.sync()
        return Collected(tuple(removed), tuple(kept), foreign)


def _parse_time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return datetime.fromtimestamp(0, timezone.utc)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def parse_since(text: str) -> datetime:
    """--since: an ISO date or date and time (UTC unless it says otherwise)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise HistoryError(f"--since {text!r} is not a date: give YYYY-MM-DD or YYYY-MM-DDTHH:MM.") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


_AGE = re.compile(r"^(\d+)\s*([dhw]?)$")


def parse_age(text: str) -> timedelta:
    """--older-than: `30d`, `12h`, `2w`, or a number of days."""
    m = _AGE.match(text.strip())
    if not m:
        raise HistoryError(f"--older-than {text!r} is not an age: give a number of days (30), or 30d, 12h, 2w.")
    n, unit = int(m.group(1)), m.group(2) or "d"
    return {"d": timedelta(days=n), "h": timedelta(hours=n), "w": timedelta(weeks=n)}[unit]


def record_run(runs_root: Path, run_dir: Path) -> str | None:
    """Record one run folder; a failure is a note (returned), never a lost run."""
    try:
        index = RunIndex(runs_root)
        index.record(run_dir)
        return " ".join(index.notes) or None
    except (OSError, sqlite3.Error, LabError) as exc:
        return f"the run history ({Path(runs_root) / INDEX_NAME}) was not updated: {exc}"


def note_bundle(run_dir: Path, bundle: Path) -> str | None:
    """`lab bundle` packed `run_dir`: remember it in its runs root (the nearest folder above it with
    an index), so that `lab runs --gc` keeps it. A folder outside any runs root is left alone."""
    root = next((p for p in Path(run_dir).resolve().parents if (p / INDEX_NAME).exists()), None)
    if root is None:
        return None
    try:
        RunIndex(root).note_bundle(run_dir, bundle)
    except OSError as exc:
        return f"{root / BUNDLES_LOG} was not updated: {exc}"
    return None
