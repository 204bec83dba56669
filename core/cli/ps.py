"""``torchmem ps``: the processes one can attach to, here or on SSH hosts.

Local rows and a host's rows are the same JSON (``ProcessInfo.to_json``), so one table
prints both; a host's rows come from ``torchmem ps --json`` run there over ssh.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torchmem import __version__
from torchmem.sources.processes import agents_for, list_processes
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import list_agents
from torchmem.transport.hosts import job_hosts
from torchmem.transport.protocol import PROTOCOL_VERSION
from torchmem.transport.ssh import remote_processes
from torchmem.units import format_bytes

NOTHING = (
    "No processes to attach to{where}. Start a run with `torchmem run --attachable "
    "SCRIPT`, or add `torchmem.serve()` to a script."
)


def ps(opts: argparse.Namespace) -> int:
    """List processes (of this machine, or of the ``--host``s); the exit code."""
    if opts.ssh_entries is not None:
        return _ssh_entries(None if opts.ssh_entries < 0 else opts.ssh_entries)
    try:
        hosts = job_hosts(opts.host, opts.hostfile, opts.slurm_job, opts.slurm, opts.remote_command)
    except AttachError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    if not hosts:
        rows = [r.to_json() for r in list_processes(include_plain=not opts.agents)]
        return _print(rows, opts.json)
    listed: dict[str, list[dict[str, Any]]] = {}
    failed = 0
    for host in hosts:
        try:
            listed[host.target] = remote_processes(host, opts.agents)
        except AttachError as exc:
            print(f"torchmem: {exc}", file=sys.stderr)
            failed += 1
    if opts.json:
        rows = [{**row, "host": h} for h, rows in listed.items() for row in rows]
        print(json.dumps(rows, indent=2))
    else:
        for target, rows in listed.items():
            if len(hosts) > 1:
                print(f"{target}:")
            _print(rows, False, f" on {target}")
    return 1 if failed == len(hosts) else 0


def _print(rows: list[dict[str, Any]], as_json: bool, where: str = "") -> int:
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(NOTHING.format(where=where))
        return 0
    print(f"{'PID':>8}  {'AGENT':<6} {'RANK':<6} {'RSS':>10} {'GPU':>10}  COMMAND")
    for row in rows:
        agent = row.get("agent") or {}
        rank = (
            f"{agent['rank']}/{agent.get('world_size')}" if agent.get("rank") is not None else "-"
        )
        gpu = format_bytes(row["gpu_bytes"]) if row.get("gpu_bytes") is not None else "-"
        cmd = _short_command(row.get("cmdline") or [])
        print(
            f"{row['pid']:>8}  {'yes' if agent else 'no':<6} {rank:<6} "
            f"{format_bytes(row.get('rss_bytes') or 0):>10} {gpu:>10}  {cmd}"
        )
    return 0


def _short_command(argv: list[str], width: int = 100) -> str:
    """A command line that fits ``width``: the interpreter by its name, and the end kept
    when it is cut (the script is at the end, the interpreter's path at the start)."""
    if not argv:
        return ""
    text = " ".join([Path(argv[0]).name, *argv[1:]])
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def _ssh_entries(pid: int | None) -> int:
    """Print, for a viewer's ssh, the entries (tokens included) of ``pid``'s agents, or of
    every agent: read from this user's private runtime directory, written only to the
    SSH session's pipe."""
    entries = agents_for(pid) if pid is not None else list_agents()
    data = {
        "torchmem": __version__,
        "protocol": PROTOCOL_VERSION,
        "entries": [asdict(e) for e in entries],
    }
    print(json.dumps(data))
    return 0
