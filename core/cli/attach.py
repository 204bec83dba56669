"""``torchmem attach``: follow an attached process headless, then print and write a summary."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from torchmem.cli.paths import check_paths
from torchmem.record.recorder import start_recording
from torchmem.record.store import RecordError
from torchmem.report.summary import build_summary, rank_row, write_summary
from torchmem.session import Session
from torchmem.sources.attached import AttachedRun
from torchmem.transport.client import AttachError, entry_from_file
from torchmem.transport.discovery import AgentEntry
from torchmem.transport.hosts import job_hosts
from torchmem.transport.ssh import SshHost
from torchmem.units import format_bytes


def attach_command(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """``torchmem attach ARGV``: check the options, then :func:`attach_headless`."""
    opts = check_paths(parser, parser.parse_args(argv))
    if opts.duration is not None and opts.duration <= 0:
        parser.error("--duration must be positive")
    try:
        hosts = job_hosts(opts.host, opts.hostfile, opts.slurm_job, opts.slurm, opts.remote_command)
    except AttachError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    if hosts and (opts.entry or opts.inject):
        parser.error("--host attaches through SSH: leave out --entry and --inject")
    if len(hosts) > 1 and opts.pid is not None:
        parser.error(
            "a PID names a process of one host: give one --host, or no PID to attach to "
            "every agent of the hosts (the ranks of a multi-node job)"
        )
    entries = None
    if opts.entry:
        try:
            entries = [entry_from_file(opts.entry, opts.address)]
        except AttachError as exc:
            print(f"torchmem: {exc}", file=sys.stderr)
            return 2
    elif opts.pid is None and not hosts:
        parser.error("give a PID (see `torchmem ps`), --host, or --entry and --address")
    pid = entries[0].pid if entries else opts.pid
    return attach_headless(
        pid, opts.duration, opts.summary, opts.hz, opts.quiet, entries, opts.inject,
        opts.snapshot, opts.record, hosts,
    )  # fmt: skip


def attach_headless(
    pid: int | None,
    duration: float | None = None,
    summary_path: str | None = None,
    hz: float = 10.0,
    quiet: bool = False,
    entries: list[AgentEntry] | None = None,
    inject: bool = False,
    snapshot: bool = False,
    record: str | None = None,
    hosts: list[SshHost] | None = None,
) -> int:
    """``torchmem attach``: collect for ``duration`` seconds (or until the process ends)
    and optionally write ``{"pid", "injected", "samples", "peak_bytes", "ranks"}``.

    With ``snapshot``, CUDA allocation history is recorded while attached and a
    memory_viz snapshot written by each process at the end (listed as ``"snapshots"``).
    With ``record``, what is collected (the agent's history included) goes into that new
    session file as it arrives.
    """
    session = Session()
    recorder = None
    if record:
        try:
            recorder = start_recording(
                record, session, "attach", None, [], on_problem=_warn, attached_pid=pid
            )
        except RecordError as exc:
            sys.stderr.write(f"torchmem: {exc}\n")
            return 2
    run = AttachedRun(session, pid, hz, entries, inject, hosts)
    try:
        run.connect()
    except AttachError as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        if recorder is not None:
            recorder.close({"complete": False})
        return 1
    if snapshot and not run.remotes:
        run.close()
        sys.stderr.write(
            f"torchmem: --snapshot needs an agent in process {pid}: start it with "
            "torchmem.serve() or `torchmem run --attachable`, or add --inject\n"
        )
        return 1
    recording = False
    if snapshot:
        started = run.command("history_start")
        for result in started:
            if not result.ok:
                sys.stderr.write(f"torchmem: no snapshot: {result.said}\n")
        recording = any(result.ok for result in started)
    if not quiet:
        if not run.remotes:
            what = "from outside: no agent, so RSS and GPU memory only"
        elif len(run.remotes) == 1:
            argv = run.remotes[0].entry.argv
            what = ("injected agent: " if run.injected else "agent: ") + " ".join(argv)[:80]
        else:
            what = f"{len(run.remotes)} processes: " + ", ".join(r.label for r in run.remotes)
        sys.stderr.write(
            f"torchmem: attached to {_target(pid, hosts)} ({what})"
            + (f" for {duration:g} s" if duration else " until it ends (Ctrl+C to detach)")
            + "\n"
        )
    attached_at = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C detaches; the summary is still written
        run.follow(duration, close=False)
    snapshots = _save_snapshots(run) if recording else []
    run.close()
    data = build_summary(
        "attach",
        session,
        pid=pid,
        injected=run.injected,
        attached="agent" if run.remotes else "process",
        duration_s=round(time.monotonic() - attached_at, 3),
        ranks=[rank_row(r, session) for r in run.remotes],
    )
    if snapshot:
        data["snapshots"] = snapshots
    if recorder is not None:
        # A detach is not the process's end: the file says which it was.
        recorder.close({"summary": data, "detached": session.run_finished is None})
        if not quiet and recorder.error is None:
            sys.stderr.write(f"torchmem: recorded in {recorder.path}\n")
    if not quiet:
        for path in snapshots:
            sys.stderr.write(f"torchmem: memory snapshot {path} (open it on memory_viz)\n")
        peaks = ", ".join(f"{k} {format_bytes(v)}" for k, v in data["peak_bytes"].items())
        sys.stderr.write(
            f"torchmem: detached after {data['samples']} samples; peaks: {peaks or 'none'}\n"
        )
    if summary_path and not write_summary(summary_path, data):
        return 1
    return 0


def _target(pid: int | None, hosts: list[SshHost] | None) -> str:
    """``pid 42``, ``pid 42 on node1``, ``node1, node2`` (every agent of the hosts)."""
    where = ", ".join(h.target for h in hosts or [])
    if pid is None:
        return where
    return f"pid {pid} on {where}" if where else f"pid {pid}"


def _warn(message: str) -> None:
    sys.stderr.write(f"torchmem: {message}\n")


def _save_snapshots(run: AttachedRun) -> list[str]:
    """Ask each attached process still running for a snapshot, then stop its recording;
    the files written, as paths on that process's machine."""
    paths = []
    for result in run.command("snapshot"):
        if result.ok:
            paths.append(result.output)
        else:
            sys.stderr.write(f"torchmem: no snapshot: {result.said}\n")
    run.command("history_stop")
    return paths
