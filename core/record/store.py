"""The session file: SQLite in WAL mode, readable while it is written, and after a crash.

One file per session. Samples, the bulk of a long run, get a table of their own with the
series keys replaced by small integers; every other event (markers, log lines, alerts,
commands, censuses folded to their largest storages, run start and end) is a row of the
events table holding its wire encoding (:mod:`torchmem.transport.wire`), so a field added
to an event is recorded without a line here. Both tables share one sequence, which is the
order the Session received them in. ``meta`` holds JSON facts about the run (script,
environment, allocator settings) and, once the run ended cleanly, its summary.

SQLite's ``application_id`` marks the file as ours, ``user_version`` is the schema. A
file that is not SQLite, another program's database, a newer schema, an empty or a
damaged file each give a :class:`RecordError` naming the file and what could be read.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from torchmem.events import CensusTaken, Event, Sample
from torchmem.series import split_device
from torchmem.transport.protocol import ProtocolError
from torchmem.transport.wire import event_from_wire, event_to_wire
from torchmem.units import format_bytes

#: ``PRAGMA application_id``: "tmem".
APPLICATION_ID = 0x746D656D
#: ``PRAGMA user_version``: bumped when a table changes shape.
SCHEMA_VERSION = 1
SUFFIX = ".tmsession"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE series (id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL);
CREATE TABLE samples (seq INTEGER PRIMARY KEY, t REAL NOT NULL, step INTEGER,
                      vals BLOB NOT NULL);
CREATE TABLE events (seq INTEGER PRIMARY KEY, t REAL NOT NULL, kind TEXT NOT NULL,
                     data BLOB NOT NULL);
CREATE INDEX events_kind ON events (kind, seq);
CREATE TABLE overview (key TEXT PRIMARY KEY, data BLOB NOT NULL);
"""


class RecordError(Exception):
    """A session file that cannot be written or read, with a message for the user."""


def create(path: Path, meta: dict[str, Any]) -> sqlite3.Connection:
    """Create a new session file at ``path`` (it must not exist) and return a connection
    for writing it (usable from one other thread, the recorder's)."""
    if path.exists():
        raise RecordError(f"{path} already exists; choose another file for the recording")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # WAL: readers (the session browser, `torchmem report`) never block the writer,
        # and a commit survives a kill -9 of this process. NORMAL syncs at checkpoints
        # only: a power cut may lose the last commits, a crash loses nothing committed.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.executescript(_SCHEMA)
        write_meta(conn, meta)
    except (OSError, sqlite3.Error) as exc:
        raise RecordError(f"cannot create the recording {path}: {exc}") from None
    return conn


def write_meta(conn: sqlite3.Connection, meta: dict[str, Any]) -> None:
    """Set (or replace) facts about the session, each stored as JSON."""
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
        [(k, json.dumps(v)) for k, v in meta.items()],
    )
    conn.execute("COMMIT")


def pack_sample(sample: Sample, series_ids: dict[str, int]) -> bytes:
    """A sample's values keyed by series id; whole numbers (bytes) packed as integers."""
    return msgpack.packb(
        {
            series_ids[k]: (int(v) if float(v).is_integer() else float(v))
            for k, v in sample.series().items()
        }
    )


#: Event blobs above this size are zlib-compressed (censuses and alerts with culprits:
#: their names and field lists repeat, and shrink about sixfold).
COMPRESS_ABOVE = 512
# A compressed blob starts with zlib's header byte 0x78; a packed event (a msgpack map)
# starts with 0x80-0x8f, 0xde or 0xdf, so the first byte tells them apart.
_ZLIB = 0x78


def pack_event(event: Event) -> bytes:
    """Any other event, as its wire map (compressed when large)."""
    data = msgpack.packb(event_to_wire(event))
    return zlib.compress(data, 6) if len(data) > COMPRESS_ABOVE else data


def unpack_event(data: bytes) -> Event:
    """The inverse of :func:`pack_event` (ProtocolError, ValueError or zlib.error if
    damaged)."""
    if data[:1] == bytes([_ZLIB]):
        data = zlib.decompress(data)
    return event_from_wire(msgpack.unpackb(data))


class SessionFile:
    """A recorded session opened for reading (also while it is still being written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._copy: Path | None = None
        if not self.path.is_file():
            raise RecordError(f"{self.path}: no such session file")
        if self.path.stat().st_size == 0:
            raise RecordError(f"{self.path} is empty: the recording never started")
        self.conn = self._connect()
        try:
            self._check()
        except RecordError:
            self.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            # A read-only folder or file with a WAL beside it: SQLite cannot open the
            # WAL's index there. A private copy (file and WAL) reads the same data.
            self._copy = Path(tempfile.mkdtemp(prefix="torchmem-session-"))
            for suffix in ("", "-wal"):
                source = self.path.with_name(self.path.name + suffix)
                if source.exists():
                    shutil.copyfile(source, self._copy / ("s.db" + suffix))
            try:
                return sqlite3.connect(self._copy / "s.db")
            except sqlite3.Error as exc:
                raise RecordError(f"cannot open {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(exc) from None

    def _unreadable(self, exc: sqlite3.DatabaseError) -> RecordError:
        """Why SQLite refused the file: a torchmem session that is damaged (its header says
        whose it is, even when the rest cannot be read) or not a session at all."""
        try:
            with self.path.open("rb") as handle:
                header = handle.read(100)
        except OSError:
            header = b""
        ours = header.startswith(b"SQLite format 3\x00") and len(header) == 100
        if ours and int.from_bytes(header[68:72], "big") == APPLICATION_ID:
            size = format_bytes(self.path.stat().st_size)
            return RecordError(
                f"{self.path} is a torchmem session ({size}) too damaged to read ({exc}):"
                " it was cut short or overwritten after it was recorded (a copy that did"
                " not finish?). A run killed while recording leaves a readable file."
            )
        return RecordError(f"{self.path} is not a torchmem session ({exc})")

    def _check(self) -> None:
        try:
            app = self.conn.execute("PRAGMA application_id").fetchone()[0]
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(exc) from None
        if app != APPLICATION_ID:
            raise RecordError(
                f"{self.path} is an SQLite database of another program, not a torchmem session"
            )
        if version > SCHEMA_VERSION:
            raise RecordError(
                f"{self.path} was written by a newer torchmem (session schema {version}; "
                f"this one reads up to {SCHEMA_VERSION}): upgrade torchmem to open it"
            )

    def close(self) -> None:
        """Close the file (and drop the private copy of a read-only one)."""
        self.conn.close()
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)

    def __enter__(self) -> SessionFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """Facts about the session (values decoded from JSON; unreadable ones left out)."""
        out: dict[str, Any] = {}
        try:
            rows = self.conn.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{self.path}: its facts cannot be read ({exc})") from None
        for key, value in rows:
            try:
                out[key] = json.loads(value)
            except (TypeError, ValueError):
                continue
        return out

    def span(self) -> tuple[int, float]:
        """How many samples it holds, and the time of the last one (s). Cheap on a file of
        millions: the newest row by its key, and the count its overview keeps (counted
        only where there is none)."""
        try:
            row = self.conn.execute("SELECT t FROM samples ORDER BY seq DESC LIMIT 1").fetchone()
            n = _overview_count(self.conn)
            if n is None:
                (n,) = self.conn.execute("SELECT count(*) FROM samples").fetchone()
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{self.path}: its samples cannot be read ({exc})") from None
        return int(n), float(row[0]) if row else 0.0

    def event_tail(self, limits: dict[str, int], problems: list[str]) -> Iterator[Event]:
        """The newest events of each kind in ``limits`` (kind -> how many; 0 for all), in
        their order: what a Session keeps of a long run."""
        seqs: list[int] = []
        try:
            for kind, limit in limits.items():
                query = "SELECT seq FROM events WHERE kind = ? ORDER BY seq DESC"
                rows = self.conn.execute(
                    query + (" LIMIT ?" if limit else ""), (kind, limit) if limit else (kind,)
                )
                seqs += [seq for (seq,) in rows]
            seqs.sort()
            bad = 0
            for start in range(0, len(seqs), 500):
                chunk = seqs[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for (data,) in self.conn.execute(
                    f"SELECT data FROM events WHERE seq IN ({marks}) ORDER BY seq", chunk
                ):
                    try:
                        yield unpack_event(data)
                    except (ValueError, TypeError, ProtocolError, msgpack.UnpackException,
                            zlib.error):  # fmt: skip
                        bad += 1
            if bad:
                problems.append(f"{bad} damaged record(s) skipped")
        except sqlite3.DatabaseError as exc:
            problems.append(f"the file is damaged; read up to the damage ({exc})")

    def after(self, seq: int, problems: list[str]) -> Iterator[Event]:
        """The samples and step boundaries written after ``seq`` (what an overview, taken
        at ``seq``, does not hold yet), in order."""
        try:
            ids = {i: k for i, k in self.conn.execute("SELECT id, key FROM series")}
            samples = self.conn.execute(
                "SELECT seq, t, step, vals FROM samples WHERE seq > ? ORDER BY seq", (seq,)
            )
            steps = self.conn.execute(
                "SELECT seq, kind, data FROM events WHERE kind = 'Marker:step' AND seq > ? "
                "ORDER BY seq",
                (seq,),
            )
            yield from _merged(samples, steps, ids, problems)
        except sqlite3.DatabaseError as exc:
            problems.append(f"the file is damaged; read up to the damage ({exc})")

    def series_keys(self) -> list[str]:
        """The series keys in the order they first appeared."""
        try:
            return [k for (k,) in self.conn.execute("SELECT key FROM series ORDER BY id")]
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"{self.path}: its series cannot be read ({exc})") from None

    def samples(self, problems: list[str] | None = None) -> Iterator[Sample]:
        """Only the samples, oldest first (for exports)."""
        for event in self.events(problems, samples_only=True):
            assert isinstance(event, Sample)
            yield event

    def events(
        self, problems: list[str] | None = None, samples_only: bool = False
    ) -> Iterator[Event]:
        """Every recorded event in the order the Session received it.

        Damage is not fatal: an undecodable row is skipped, and a file whose pages are
        damaged yields what comes before the damage; each is described in ``problems``.
        """
        problems = problems if problems is not None else []
        try:
            ids = {i: k for i, k in self.conn.execute("SELECT id, key FROM series")}
            samples = self.conn.execute("SELECT seq, t, step, vals FROM samples ORDER BY seq")
            others = self.conn.execute(
                "SELECT seq, kind, data FROM events WHERE ? = 0 ORDER BY seq", (samples_only,)
            )
            yield from _merged(samples, others, ids, problems)
        except sqlite3.DatabaseError as exc:
            problems.append(f"the file is damaged; read up to the damage ({exc})")


def _overview_count(conn: sqlite3.Connection) -> int | None:
    """The sample count the overview holds, if the file has one."""
    try:
        row = conn.execute("SELECT data FROM overview WHERE key = 'counts'").fetchone()
        return int(msgpack.unpackb(row[0])["samples"]) if row else None
    except (sqlite3.DatabaseError, ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None


def _merged(
    samples: sqlite3.Cursor,
    others: sqlite3.Cursor,
    ids: dict[int, str],
    problems: list[str],
) -> Iterator[Event]:
    """Samples and other events interleaved by their shared sequence number."""
    bad = 0
    sample_row = next(samples, None)
    other_row = next(others, None)
    while sample_row is not None or other_row is not None:
        if other_row is None or (sample_row is not None and sample_row[0] < other_row[0]):
            _, t, step, vals = sample_row
            sample_row = next(samples, None)
            try:
                values = {
                    ids[int(i)]: float(v)
                    for i, v in msgpack.unpackb(vals, strict_map_key=False).items()
                }
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                bad += 1
                continue
            yield Sample.of_series(float(t), values, step)
        else:
            _, _kind, data = other_row
            other_row = next(others, None)
            try:
                event = unpack_event(data)
            except (ValueError, TypeError, ProtocolError, msgpack.UnpackException, zlib.error):
                bad += 1
                continue
            yield _scoped_census(event) if isinstance(event, CensusTaken) else event
    if bad:
        problems.append(f"{bad} damaged record(s) skipped")


def _scoped_census(event: CensusTaken) -> CensusTaken:
    """A census as this version takes it: files written before a census carried its
    process named a rank's devices ``rank1/cpu``; such a census gets its scope field back
    and its devices their own names (``cpu``), as a live one has them."""
    census = event.census
    scopes = {split_device(device)[0] for device in census.devices()}
    if event.scope or len(scopes) != 1 or "" in scopes:
        return event
    scope = scopes.pop()
    prefix = f"{scope}/"
    storages = {}
    for (device, ptr), storage in census.storages.items():
        key = (device.removeprefix(prefix), ptr)
        tensors = [
            replace(t, device=t.device.removeprefix(prefix), storage_key=key)
            for t in storage.tensors
        ]
        storages[key] = replace(storage, key=key, tensors=tensors)
    return replace(event, census=replace(census, storages=storages), scope=scope)


def rename_session(path: Path, title: str) -> None:
    """Give a recorded run a title of its own (the file keeps its name)."""
    SessionFile(path).close()  # the same checks and messages as for reading it
    try:
        conn = sqlite3.connect(path, timeout=5, isolation_level=None)
        try:
            write_meta(conn, {"title": title})
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise RecordError(f"cannot rename {path}: {exc}") from None
