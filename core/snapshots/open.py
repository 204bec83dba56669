"""Open a snapshot: from its index when one is saved, else read and indexed once in a
worker process, with progress and cancel.

The pickle's Python objects take several times the file's size; reading it in a child
keeps the window's memory to the arrays it draws, and a file too big for the machine
costs that child, never the window. The index lives in the sessions folder, named by
the file's path, size and modification time, so a changed file is indexed again; the
index of what it was is then removed (a ten-million-event index takes half a GiB).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from torchmem.probe.collector import collector_paused
from torchmem.probe.parent_watch import PARENT_ENV
from torchmem.record.library import sessions_dir
from torchmem.snapshots.index import (
    ACTIONS,
    EXTRA_FILE,
    SnapshotIndex,
    build_index,
    dead_saves,
    index_scanned,
)
from torchmem.snapshots.names import match_names, read_names
from torchmem.snapshots.read import SnapshotError, read_snapshot
from torchmem.snapshots.scan import scan_snapshot
from torchmem.sources.children import end_tree

#: Reading the pickle is most of the work; indexing the rest.
READ_SHARE = 0.8


class SnapshotCancelled(Exception):
    """The user cancelled opening a snapshot."""


def index_path(path: str | Path) -> Path:
    """The folder where the index of the snapshot at ``path`` is kept."""
    file = Path(path).resolve()
    stat = file.stat()
    key = hashlib.sha1(f"{file}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return sessions_dir() / "snapshot-index" / f"{file.stem[:40]}-{key}.index"


def index_snapshot(
    path: str | Path,
    out: str | Path,
    progress: Callable[[float], None] | None = None,
    native: bool = True,
) -> SnapshotIndex:
    """Read the snapshot at ``path`` here, and save its index to ``out``: with the native
    scanner where it can (``native``), else with pickle."""
    say = progress or (lambda share: None)
    # Millions of new containers and no garbage: the cyclic collector would walk them
    # again and again (it halves the time of a large file).
    with collector_paused():
        scanned = (
            scan_snapshot(path, ACTIONS, lambda share: say(share * READ_SHARE)) if native else None
        )
        if scanned is not None:
            index = index_scanned(scanned, _file_facts(path, "scanner"))
            del scanned
            say(1.0)
        else:
            data = read_snapshot(path, lambda share: say(share * READ_SHARE))
            index = build_index(
                data,
                _file_facts(path, "pickle"),
                lambda share: say(READ_SHARE + share * (1 - READ_SHARE)),
            )
            del data
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    index.save(out)
    drop_stale_indexes(Path(out), Path(path).resolve())
    return index


def drop_stale_indexes(kept: Path, source: Path) -> None:
    """Remove, beside the index ``kept`` of the snapshot file ``source``, the indexes no
    version of torchmem reads any more: ``source``'s own from before it changed, the
    zips that versions before the folders wrote (``.npz``), and the folders of saves
    that died half-written. Indexes of other files stay, whether or not they exist."""
    folder = kept.parent
    for old in folder.glob("*.npz"):
        old.unlink(missing_ok=True)
    for half in dead_saves(folder):
        shutil.rmtree(half, ignore_errors=True)
    stem = kept.name.rsplit("-", 1)[0]  # the file's stem, then the file's key
    for other in folder.glob(f"{stem}-*.index"):
        if other == kept:
            continue
        try:
            meta = json.loads((other / EXTRA_FILE).read_text())["meta"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge: loading it rebuilds it if damaged
        if isinstance(meta, dict) and meta.get("file") == str(source):
            shutil.rmtree(other, ignore_errors=True)


def _file_facts(path: str | Path, reader: str) -> dict[str, object]:
    return {"file": str(Path(path).resolve()), "file_bytes": Path(path).stat().st_size,
            "reader": reader}  # fmt: skip


def open_snapshot(
    path: str | Path,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    isolated: bool = True,
) -> SnapshotIndex:
    """The index of the snapshot at ``path``: saved, or built now (in a worker process
    when ``isolated``). SnapshotError says why a file cannot be opened; SnapshotCancelled
    once ``cancel`` is set (the worker is ended first)."""
    try:
        target = index_path(path)
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror or exc}") from None
    saved = SnapshotIndex.load(target) if target.exists() else None
    if saved is not None:
        if progress is not None:
            progress(1.0)
        return _with_names(saved, path)
    if not isolated:
        return _with_names(index_snapshot(path, target, progress), path)
    _in_worker(Path(path), target, progress, cancel or threading.Event())
    index = SnapshotIndex.load(target)
    if index is None:
        raise SnapshotError(f"the index of {path} could not be read back from {target}")
    return _with_names(index, path)


def _with_names(index: SnapshotIndex, path: str | Path) -> SnapshotIndex:
    """``index`` with its allocations' tensor names, where torchmem saved them beside."""
    censuses, note = read_names(path)
    try:
        index.tensor_names = match_names(index, censuses) if censuses else {}
    except (ValueError, TypeError, KeyError) as exc:  # a row of the wrong shape
        index.tensor_names = {}
        note = f"the tensor names beside it could not be read: {exc}"
    if note:
        index.meta["names_note"] = note
    return index


def _in_worker(
    path: Path, target: Path, progress: Callable[[float], None] | None, cancel: threading.Event
) -> None:
    with tempfile.TemporaryFile() as errors:
        worker = subprocess.Popen(
            [sys.executable, "-m", "torchmem.snapshots.worker", str(path), str(target)],
            stdout=subprocess.PIPE,
            stderr=errors,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, PARENT_ENV: str(os.getpid())},
            start_new_session=True,
        )
        assert worker.stdout is not None
        message = ""
        try:
            while True:
                if cancel.is_set():
                    raise SnapshotCancelled()
                ready, _, _ = select.select([worker.stdout], [], [], 0.05)
                if not ready:
                    continue
                line = worker.stdout.readline()
                if not line:
                    break
                kind, _, rest = line.rstrip("\n").partition(" ")
                if kind == "progress" and progress is not None:
                    progress(float(rest))
                elif kind == "error":
                    message = rest
        finally:
            if worker.poll() is None:  # cancelled, or this thread is unwinding
                end_tree(worker, grace_s=0)
            worker.wait()
            worker.stdout.close()
        if worker.returncode != 0 or message:
            if not message:
                errors.seek(0)
                tail = errors.read().decode(errors="replace").strip().splitlines()
                code = worker.returncode
                killed = code == -signal.SIGKILL
                message = (
                    f"reading {path} ran out of memory (the worker was killed)"
                    if killed
                    else f"reading {path} failed: {tail[-1] if tail else f'exit code {code}'}"
                )
            raise SnapshotError(message)
