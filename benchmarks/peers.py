"""torchmem beside the memory tools ML engineers use today, on one CPU training loop.

Each tool runs ``peer_loop.py`` (a small CNN, batches of 64) its own way, as a program
of its own; the loop times its steps itself and reports the median after a warm-up.
Runs alternate between the tools (A/B/C..., ``--rounds`` times) so that a noisy machine
slows all of them alike; each ratio is the median over rounds of the tool's median step
over the plain loop's of the same round. Tools that are not installed are rows that say
so (``pip install memray scalene memory_profiler pytorch_memlab``).

Beside the cost, what each tells about the loop's memory, in the columns the issue asks
for: a live view while it runs, tensors by name, a leak alert, attaching to a running
process.

    .venv/bin/python benchmarks/peers.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import report

HERE = Path(__file__).resolve().parent
LOOP = str(HERE / "peer_loop.py")
PY = sys.executable


@dataclass(frozen=True)
class Tool:
    """One way of running the loop, and what it tells about memory."""

    name: str
    module: str  # what must be importable ("" for none)
    live: str
    names: str
    leaks: str
    attach: str
    env: dict[str, str] = field(default_factory=dict)

    def command(self, out: str) -> list[str]:
        """The command line that runs the loop under this tool, writing into ``out``."""
        return {
            "plain": [PY, LOOP],
            "torchmem run": [PY, "-m", "torchmem", "run", "--quiet", LOOP],
            "torchmem run --attachable": [PY, "-m", "torchmem", "run", "--quiet",
                                          "--attachable", LOOP],
            "memray run": [PY, "-m", "memray", "run", "--quiet", "--force", "-o",
                           f"{out}.bin", LOOP],
            "memray run --native": [PY, "-m", "memray", "run", "--quiet", "--native",
                                    "--force", "-o", f"{out}.bin", LOOP],
            "scalene (cpu+memory)": [PY, "-m", "scalene", "run", "-o", f"{out}.json", LOOP],
            "mprof run (RSS sampling)": [PY, "-m", "mprof", "run", "--output", f"{out}.dat",
                                         LOOP],
            "memory_profiler @profile": [PY, LOOP],
            "pytorch-memlab LineProfiler": [PY, LOOP],
        }[self.name]  # fmt: skip


TOOLS = (
    Tool("plain", "", "-", "-", "-", "-"),
    Tool("torchmem run", "torchmem", "yes: traces per device, steps, 10 Hz",
         "yes: every tensor by variable, module path, .grad, optimizer state",
         "yes: names the growing tensors, says how to fix", "with --attachable"),
    Tool("torchmem run --attachable", "torchmem", "yes", "yes", "yes",
         "yes: window or CLI, any time, every rank"),
    Tool("memray run", "memray", "live mode is a TUI of allocations by stack",
         "no: allocations by Python stack, not tensors", "leaked allocations, after the run",
         "memray attach (via gdb)"),
    Tool("memray run --native", "memray", "as above", "no: native stacks", "as above",
         "as above"),
    Tool("scalene (cpu+memory)", "scalene", "no: a report after the run",
         "no: memory per source line", "likely leaks per line, after the run", "no"),
    Tool("mprof run (RSS sampling)", "memory_profiler", "no: a plot after the run",
         "no: process RSS over time", "no", "mprof attach PID (RSS only)"),
    Tool("memory_profiler @profile", "memory_profiler", "no: a table after each call",
         "no: RSS change per line", "no", "no",
         env={"PEER_LINE_PROFILE": "memory_profiler"}),
    Tool("pytorch-memlab LineProfiler", "pytorch_memlab", "no: a table after the run",
         "CUDA memory per line (none on CPU); MemReporter names tensors when called",
         "no", "no", env={"PEER_LINE_PROFILE": "memlab"}),
)  # fmt: skip


def available(tool: Tool) -> bool:
    """True when the tool's package is installed."""
    return not tool.module or importlib.util.find_spec(tool.module) is not None


def run_once(tool: Tool, steps: int, tmp: Path, timeout: float) -> float | str:
    """One run of the loop under ``tool``: its median step in seconds, or why it failed
    (a run past ``timeout`` is ended, with its RSS then)."""
    out = tmp / tool.name.replace(" ", "_").replace("/", "_")
    times = Path(f"{out}.times")
    times.unlink(missing_ok=True)
    env = {**os.environ, **tool.env, "PEER_TIMES": str(times), "PEER_STEPS": str(steps)}
    proc = subprocess.Popen(
        tool.command(str(out)), env=env, cwd=tmp, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        below = _children(proc.pid)
        rss = sum(_rss(p) for p in [proc.pid, *below])
        # Scalene runs the program in a session of its own, which still holds the pipes:
        # the group signal alone left communicate() waiting forever.
        for pid in [proc.pid, *below]:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        proc.communicate()
        return f"not done after {timeout:.0f} s ({rss / 2**30:.1f} GiB RSS then)"
    if not times.exists():
        tail = stderr.strip() or stdout.strip() or f"exit {proc.returncode}"
        return tail.splitlines()[-1][:100]
    return json.loads(times.read_text())["median_s"]


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {args.rounds} rounds of {args.steps} steps")  # fmt: skip
    tools = [t for t in TOOLS if available(t)]
    missing = [t for t in TOOLS if not available(t)]
    ratios: dict[str, list[float]] = {t.name: [] for t in tools}
    medians: dict[str, list[float]] = {t.name: [] for t in tools}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="torchmem-peers-") as tmp:
        for _ in range(args.rounds):
            plain = None
            for tool in tools:  # plain first: each round's reference
                if tool.name in failed:
                    continue
                # A tool 20x slower than the plain loop says enough: end it there.
                limit = 60 + 20 * args.steps * (plain or 0.5)
                result = run_once(tool, args.steps, Path(tmp), limit)
                if isinstance(result, str):
                    failed[tool.name] = result
                    continue
                medians[tool.name].append(result)
                plain = result if tool.name == "plain" else plain
                if plain:
                    ratios[tool.name].append(result / plain)
    header = f"{'tool':<30} {'step':>9} {'ratio':>7}  live view / names / leak alert / attach"
    print(header)
    print("-" * len(header))
    for tool in TOOLS:
        if tool in missing:
            line, ratio_text = "not installed", "-"
        elif tool.name in failed:
            line, ratio_text = f"failed: {failed[tool.name]}", "-"
        else:
            ratio = statistics.median(ratios[tool.name])
            step = statistics.median(medians[tool.name])
            ratio_text = f"{ratio:.2f}x"
            line = f"{step * 1000:6.1f} ms {ratio_text:>7}"
            report.row(f"peers: CNN step under {tool.name}", ratio_text, "", None,
                       f"median of {args.rounds} alternating runs of {args.steps} steps; "
                       f"live: {tool.live}; names: {tool.names}; leaks: {tool.leaks}; "
                       f"attach: {tool.attach}")  # fmt: skip
        print(f"{tool.name:<30} {line:>17}  {tool.live} / {tool.names} / {tool.leaks} / "
              f"{tool.attach}")  # fmt: skip


if __name__ == "__main__":
    main()
