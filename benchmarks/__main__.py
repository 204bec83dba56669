"""One command for every benchmark: ``python -m benchmarks [--quick] [--only NAME,...]``.

Each benchmark runs as its own process (a Qt application, torch's threads or a crash in
one never touch another), prints its detailed tables into a log, and hands the harness
its key figures (:mod:`report`). The harness prints them as one table: each figure, its
value, its target, whether it met it, and how it was measured. Ratios are measured side
by side inside each benchmark (interleaved blocks, medians), so that they hold on a noisy
machine; ``--quick`` runs every benchmark small enough to finish in about two minutes
(figures are noisier), the full run takes much longer. ``--smoke`` is for the test suite:
each benchmark at the least size that still runs all of its code, in about a minute; its
figures say that the benchmark works, not how fast anything is.

    python -m benchmarks --quick            # every benchmark, small
    python -m benchmarks --only census,log  # two of them, full size
    python -m benchmarks --list             # what there is
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS_ENV = "TORCHMEM_BENCH_ROWS"  # as report.ROWS_ENV (report is a script's sibling)


@dataclass(frozen=True)
class Bench:
    """One benchmark script and its arguments at full size, in ``--quick`` and in
    ``--smoke`` (the quick ones where it has none of its own)."""

    name: str
    script: str
    what: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    needs: str = ""  # a program it cannot run without
    smoke: tuple[str, ...] | None = None

    def args(self, size: str) -> tuple[str, ...]:
        """The arguments for ``size``: "full", "quick" or "smoke"."""
        if size == "smoke" and self.smoke is not None:
            return self.smoke
        return self.full if size == "full" else self.quick


BENCHES = (
    Bench("sampler", "sampler_overhead.py", "step time under the sampler and leak tracking",
          ("--blocks", "8"), ("--blocks", "2", "--steps", "15"),
          smoke=("--blocks", "1", "--steps", "6")),
    Bench("agent", "agent_overhead.py", "step time with a viewer attached; latency; 16 agents",
          ("--blocks", "12"), ("--blocks", "2", "--steps", "12", "--parts", "12",
                               "--seconds", "3"),
          smoke=("--blocks", "1", "--steps", "6", "--parts", "12", "--seconds", "1.2")),
    Bench("record", "record_overhead.py", "step time while recording to a session file",
          ("--blocks", "8"), ("--blocks", "2", "--steps", "12", "--hours", "0.03"),
          smoke=("--blocks", "1", "--steps", "6", "--hours", "0.01")),
    Bench("census", "census_speed.py", "census of 100k tensors among 1M objects",
          (), ("--tensors", "20000", "--objects", "200000", "--repeat", "1")),
    Bench("reopen", "reopen_window.py", "reopening a recorded week in the window",
          ("--hours", "168"), ("--hours", "1")),
    Bench("gui", "gui_speed.py", "redrawing 8 traces of 1M samples; cold start",
          (), ("--points", "100000", "--frames", "20")),
    Bench("week", "gui_week.py", "the window's RSS over a simulated week of samples",
          ("--days", "7", "--hz", "10"), ("--days", "7", "--hz", "0.1", "--every", "60"),
          smoke=("--days", "3", "--hz", "0.05", "--every", "240")),
    Bench("log", "log_flood.py", "300,000 printed lines in the window vs headless",
          (), ("--lines", "20000", "--rounds", "1"), smoke=("--lines", "5000", "--rounds", "1")),
    Bench("snapshot", "snapshot_open.py", "opening a memory snapshot of 1 GiB and more",
          (), ("--events", "100000")),
    Bench("tune", "tune_search.py", "batch-size search vs Lightning and Accelerate",
          (), ("--quick",),
          smoke=("--quick", "--seeds", "1", "--cases", "1", "--real", "accelerate")),
    Bench("peers", "peers.py", "the CNN loop under memray, Scalene, memory_profiler, memlab",
          ("--rounds", "3"), ("--rounds", "1", "--steps", "20"),
          smoke=("--rounds", "1", "--steps", "6")),
    Bench("ssh", "ssh_attach.py", "attaching over SSH: latency, 16 ranks' ssh CPU",
          (), ("--rounds", "1", "--seconds", "3", "--agents", "4"), needs="sshd",
          smoke=("--rounds", "1", "--seconds", "1.2", "--agents", "2", "--settle", "0.5")),
)  # fmt: skip


def _available(bench: Bench) -> str:
    """Why ``bench`` cannot run here ("" when it can)."""
    if bench.needs == "sshd" and not (Path("/usr/sbin/sshd").exists() and shutil.which("ssh")):
        return "skipped: needs sshd and ssh (apt-get install openssh-server)"
    return ""


def run_bench(bench: Bench, size: str, logs: Path, verbose: bool) -> list[dict]:
    """Run one benchmark; its rows (a failed run is a row that says so)."""
    why_not = _available(bench)
    if why_not:
        return [{"figure": bench.what, "value": "-", "target": "", "met": None, "how": why_not}]
    rows_file = logs / f"{bench.name}.rows"
    rows_file.unlink(missing_ok=True)  # a --logs folder used before holds its last rows
    log = logs / f"{bench.name}.log"
    args = bench.args(size)
    env = {**os.environ, ROWS_ENV: str(rows_file), "QT_QPA_PLATFORM": "offscreen"}
    command = [sys.executable, str(HERE / bench.script), *args]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            command,
            stdout=None if verbose else out,
            stderr=subprocess.STDOUT if not verbose else None,
            env=env,
            cwd=HERE.parent,
        )
    seconds = time.monotonic() - started
    rows = []
    if rows_file.exists():
        rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line]
    if proc.returncode != 0:
        tail = "" if verbose else (log.read_text().strip().splitlines() or [""])[-1][:120]
        rows.append({
            "figure": f"{bench.name}: the benchmark itself", "value": "failed",
            "target": "exit 0", "met": False,
            "how": f"exit {proc.returncode} after {seconds:.0f} s: {tail} (log: {log})",
        })  # fmt: skip
    for row in rows:
        row["bench"] = bench.name
    return rows


def _mark(met: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[met]


def print_table(rows: list[dict], markdown: bool) -> None:
    """The rows as one table (plain text, or Markdown for docs/benchmarks.md)."""
    header = ("figure", "value", "target", "met", "how it was measured")
    cells = [(r["figure"], r["value"], r["target"], _mark(r["met"]), r["how"]) for r in rows]
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in cells:
            print("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
        return
    widths = [max(len(header[i]), *(len(c[i]) for c in cells)) for i in range(4)]
    line = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    print(line.format(*header))
    print("  ".join("-" * w for w in widths) + "  " + "-" * 20)
    for row in cells:
        print(line.format(*row))


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks and print their figures; the exit code is 1 when a
    benchmark failed to run (or, with ``--strict``, missed a target)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sizes = p.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="every benchmark small (~2 minutes)")
    sizes.add_argument(
        "--smoke", action="store_true", help="the least that runs each one's code (for tests)"
    )
    p.add_argument("--only", metavar="NAME,...", help="these benchmarks (see --list)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--verbose", action="store_true", help="show each benchmark's own output")
    p.add_argument("--logs", metavar="DIR", help="keep each benchmark's output here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    opts = p.parse_args(argv)
    size = "smoke" if opts.smoke else "quick" if opts.quick else "full"
    if opts.list:
        for bench in BENCHES:
            print(f"{bench.name:<10} {bench.what}")
        return 0
    chosen = list(BENCHES)
    if opts.only:
        names = [n.strip() for n in opts.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {b.name for b in BENCHES}]
        if unknown:
            p.error(
                f"unknown benchmark {unknown[0]!r}: one of {', '.join(b.name for b in BENCHES)}"
            )
        chosen = [b for b in BENCHES if b.name in names]
    logs = Path(opts.logs) if opts.logs else Path(tempfile.mkdtemp(prefix="torchmem-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}; "
        f"{size} run; logs in {logs}",
        flush=True,
    )
    started = time.monotonic()
    rows: list[dict] = []
    for i, bench in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {bench.name}: {bench.what}…", end="", flush=True)
        began = time.monotonic()
        rows += run_bench(bench, size, logs, opts.verbose)
        print(f" {time.monotonic() - began:.0f} s", flush=True)
    print()
    print_table(rows, opts.markdown)
    missed = sum(1 for r in rows if r["met"] is False)
    targets = sum(1 for r in rows if r["met"] is not None)
    print(
        f"\n{len(rows)} figures, {targets - missed} of {targets} targets met, "
        f"in {time.monotonic() - started:.0f} s"
    )
    failed = any(r["value"] == "failed" for r in rows)
    return 1 if failed or (opts.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
