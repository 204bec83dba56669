"""Path options checked before any work: a run that would fail at its end for a folder
that does not exist fails at its start instead, in one line (exit 2).

Every command's options go through :func:`check_paths`, by their ``dest`` names, so that a
new command with ``--summary`` or ``--cwd`` is checked without a line of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

#: Options naming a file that will be written (its folder must exist and be writable).
OUTPUT_FILES = ("summary", "csv")
#: Options naming a new file (as OUTPUT_FILES, and it must not exist yet).
NEW_FILES = ("record",)
#: Options naming a folder that will be written into, created if missing.
OUTPUT_DIRS = ("export",)
#: Options naming a folder that must exist.
FOLDERS = ("cwd", "dir")
#: Arguments naming a session file that must exist.
SESSION_FILES = ("session",)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _writable_parent(path: Path) -> str | None:
    parent = path.expanduser().absolute().parent
    if parent.exists() and not parent.is_dir():
        return f"{parent} is a file, not a folder"
    if not parent.is_dir():
        return f"no such folder: {parent}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write into {parent} (permission denied)"
    return None


def path_problem(opts: argparse.Namespace) -> str | None:
    """The first path option of ``opts`` that cannot work, said in one line; None when
    every one can."""
    for dest in FOLDERS:
        value = getattr(opts, dest, None)
        if value and not Path(value).expanduser().is_dir():
            what = "not a folder" if Path(value).expanduser().exists() else "no such folder"
            return f"{_flag(dest)} {value}: {what}"
    for dest in SESSION_FILES:
        value = getattr(opts, dest, None)
        if value and Path(value).expanduser().is_dir():
            return (
                f"{value} is a folder, not a session file: list its sessions with "
                f"`torchmem sessions --dir {value}`"
            )
    for dest in (*OUTPUT_FILES, *NEW_FILES):
        value = getattr(opts, dest, None)
        if not value or not isinstance(value, str):
            continue
        path = Path(value).expanduser()
        if path.is_dir():
            return f"{_flag(dest)} {value}: is a folder; give a file name"
        if dest in NEW_FILES and path.exists():
            return f"{_flag(dest)} {value}: already exists; choose a new file"
        problem = _writable_parent(path)
        if problem:
            return f"{_flag(dest)} {value}: {problem}"
    for dest in OUTPUT_DIRS:
        value = getattr(opts, dest, None)
        if not value:
            continue
        path = Path(value).expanduser()
        if path.exists() and not path.is_dir():
            return f"{_flag(dest)} {value}: is a file; give a folder"
        problem = None if path.is_dir() else _writable_parent(path)
        if problem:
            return f"{_flag(dest)} {value}: {problem}"
    return None


def check_paths(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> argparse.Namespace:
    """``opts``; for a path option that cannot work, its problem in one line on stderr and
    exit code 2 (the usage would bury it: the option is right, its folder is not)."""
    problem = path_problem(opts)
    if problem:
        print(f"{parser.prog}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return opts
