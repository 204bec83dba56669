"""Opening a large PyTorch memory snapshot: time to the first answer, cold and from the
index, and the memory it takes, against loading the whole pickle as memory_viz does.

Writes a snapshot of ``--events`` trace events in PyTorch's format (a training-like
pattern: parameters, then per step activations freed by backward, gradients, optimizer
state; every event with a four-frame stack, as ``_record_memory_history(stacks="python")``
writes), then measures, each in a fresh process:

- ``torchmem snapshot info`` cold (read in a worker, indexed) and again (from the index);
- the time and peak RSS of the reading worker, with the native scanner and with pickle
  (an install built without a compiler), and of the process that holds the index (the
  window's share: it never holds the pickle);
- ``pickle.load`` of the whole file (what a viewer that keeps every event as an object
  holds: memory_viz in a browser tab holds it as JavaScript objects, more again).

    .venv/bin/python benchmarks/snapshot_open.py [--events 5000000]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import report

from torchmem.units import format_bytes

MiB = 1 << 20


def frames(i: int) -> list[dict[str, object]]:
    return [
        {"name": "forward", "filename": "/home/me/model.py", "line": 40 + i % 24},
        {"name": "_call_impl", "filename": "/usr/lib/python3/torch/nn/modules/module.py",
         "line": 1527},
        {"name": "train_step", "filename": "/home/me/train.py", "line": 88},
        {"name": "main", "filename": "/home/me/train.py", "line": 120},
    ]  # fmt: skip


def fresh(stack: list[dict[str, object]]) -> list[dict[str, object]]:
    """New frame objects (strings too) for each event, as torch builds them: shared ones
    would be pickled once, and the file would be unrealistically small."""
    return [{k: v[:1] + v[1:] if isinstance(v, str) else v for k, v in f.items()} for f in stack]


def write_snapshot(path: Path, events: int) -> None:
    """A training-like trace of about ``events`` events, pickled (protocol 4)."""
    stacks = [frames(i) for i in range(24)]
    trace: list[dict[str, object]] = []
    t, addr, live = 0, 1 << 32, []
    while len(trace) < events:
        for layer in range(24):  # forward: activations
            t += 7
            addr += (1 + layer % 4) * MiB + 512
            size = (1 + layer % 4) * MiB
            live.append((addr, size))
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                          "time_us": t, "frames": fresh(stacks[layer])})  # fmt: skip
        while live:  # backward frees them, last first
            a, size = live.pop()
            t += 5
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": a, "size": size, "stream": 0,
                              "time_us": t, "frames": fresh(stacks[0])})  # fmt: skip
    with path.open("wb") as f:
        pickle.dump({"segments": [], "device_traces": [trace[:events]]}, f, protocol=4)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - started, r.stdout


def peak_of(code: str, env: dict[str, str]) -> tuple[float, int]:
    """Wall time and peak RSS (VmHWM) of ``python -c code``, which prints its own."""
    full = code + "\nfrom torchmem.probe.backends import peak_rss\nprint('PEAK', peak_rss())"
    took, out = timed([sys.executable, "-c", full], env)
    return took, int(out.split("PEAK")[-1].split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=5_000_000)
    p.add_argument("--file", help="keep the snapshot here, and reuse it if it exists")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="torchmem-snapshot-"))
    env = {**os.environ, "TORCHMEM_SESSIONS_DIR": str(folder / "sessions")}
    path = Path(args.file) if args.file else folder / "big.pickle"
    if not path.exists():
        started = time.perf_counter()
        write_snapshot(path, args.events)
        print(f"wrote {args.events:,} events: {format_bytes(path.stat().st_size)} in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    info = [sys.executable, "-m", "torchmem", "snapshot", "info", "--json", str(path)]
    cold, out = timed(info, env)
    data = json.loads(out)
    warm, _ = timed(info, env)
    # The worker's own peak: index the file again in a process that reports its VmHWM,
    # with the native scanner and with pickle (what an install without a compiler does).
    read_s, read_peak = peak_of(
        f"from torchmem.snapshots.open import index_snapshot\n"
        f"index_snapshot({str(path)!r}, {str(folder / 'again.npz')!r})", env
    )  # fmt: skip
    pickled_s, pickled_peak = peak_of(
        f"from torchmem.snapshots.open import index_snapshot\n"
        f"index_snapshot({str(path)!r}, {str(folder / 'pickled.npz')!r}, native=False)", env
    )  # fmt: skip
    _, view_peak = peak_of(
        f"from torchmem.snapshots.open import open_snapshot\n"
        f"from torchmem.snapshots import analysis\n"
        f"i = open_snapshot({str(path)!r})\n"
        f"line = analysis.timeline(i, 0)\n"
        f"analysis.category_curves(i, 0)\n"
        f"analysis.by_owner(i, analysis.live_at(i, 0, line.peak[2]))", env
    )  # fmt: skip
    load_s, load_peak = peak_of(f"import pickle\nd = pickle.load(open({str(path)!r}, 'rb'))", env)
    _, base_peak = peak_of("import torchmem", env)
    print(
        f"\nmachine: {platform.node()} · {psutil.cpu_count()} CPUs · "
        f"{format_bytes(psutil.virtual_memory().total)} · Python {platform.python_version()}"
    )
    print(f"file: {format_bytes(path.stat().st_size)}, {data['events']:,} events, peak "
          f"{format_bytes(data['peak_active_bytes'])}\n")  # fmt: skip
    rows = [
        ("snapshot info, first time (read + index)", f"{cold:.1f} s", "<= 15 s"),
        ("snapshot info, from the index", f"{warm:.2f} s", "<= 2 s"),
        ("reading worker (native scanner): time", f"{read_s:.1f} s", ""),
        (
            "reading worker (native scanner): peak RSS",
            format_bytes(read_peak),
            "(a child: never the window)",
        ),
        ("reading worker (pickle, no compiler): time", f"{pickled_s:.1f} s", ""),
        ("reading worker (pickle, no compiler): peak RSS", format_bytes(pickled_peak), ""),
        ("index + timeline + live set: peak RSS", format_bytes(view_peak), "<= 1.5 GiB"),
        ("  of which Python + torchmem alone", format_bytes(base_peak), ""),
        ("pickle.load of the whole file: peak RSS", format_bytes(load_peak), "memory_viz's way"),
        ("pickle.load of the whole file: time", f"{load_s:.1f} s", ""),
    ]
    how = f"{data['events']:,} events, {format_bytes(path.stat().st_size)} pickle"
    full_size = path.stat().st_size >= 1 << 30  # the targets are for files of 1 GiB and more
    report.row(
        "snapshot: first open (read + index)",
        f"{cold:.1f} s",
        "<= 15 s" if full_size else "",
        cold <= 15 if full_size else None,
        how,
    )
    # The generator's answer, computed independently of the reader: one forward pass of
    # 24 activations of (1 + layer % 4) MiB is live at once, at its last allocation.
    expected = sum((1 + layer % 4) * MiB for layer in range(24))
    device = data["devices"][0] if data["devices"] else {"live_at_peak": 0}
    right = data["peak_active_bytes"] == expected and device["live_at_peak"] == 24
    report.row(
        "snapshot: peak and live set equal the generator's",
        f"{format_bytes(data['peak_active_bytes'])}, {device['live_at_peak']} live",
        f"= {format_bytes(expected)}, 24 live", right, how,
    )  # fmt: skip
    report.row("snapshot: reopen from the index", f"{warm:.2f} s", "<= 2 s", warm <= 2, how)
    report.row("snapshot: index + views, peak RSS", format_bytes(view_peak),
               "<= 1.5 GiB", view_peak <= 1.5 * (1 << 30), how)  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>12}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>12}  {target}")


if __name__ == "__main__":
    main()
