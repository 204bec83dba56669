"""Cost of recording a run: step time with the recorder vs without, its CPU, bytes on disk.

1. One CPU training loop in this process, in interleaved blocks: unmonitored, torchmem's
   defaults, and the defaults plus a recorder writing the Session into a session file.
   Ratios of the median and mean step times to the unmonitored loop and to the defaults;
   the recorder thread's own CPU time (it runs beside the loop, so it is counted apart,
   as a share of one core over the blocks' wall time).
2. An hour of a run at 10 Hz written straight into a session file (6 series, 10 steps a
   second, a census of 2,000 storages every 5 minutes, a log line a second): bytes on disk
   per hour, the writer's CPU per hour, and the time to read it back into a Session.

    .venv/bin/python benchmarks/record_overhead.py [--blocks 8] [--steps 60] [--hours 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import report
import torch
from sampler_overhead import Monitored, make_loop, timed_block

from torchmem.events import CensusTaken, LogRecord, Marker, MarkerKind, Sample, Stream
from torchmem.record.library import file_bytes
from torchmem.record.overview import OVERVIEW_ABOVE
from torchmem.record.recorder import Recorder, start_recording
from torchmem.record.replay import load
from torchmem.session import Session
from torchmem.tensors.model import Census, StorageInfo, TensorInfo


def thread_cpu(native_id: int | None) -> float:
    """CPU seconds (user + system) of one thread of this process so far."""
    for thread in psutil.Process().threads():
        if thread.id == native_id:
            return thread.user_time + thread.system_time
    return 0.0


class Recorded(Monitored):
    """The defaults plus a recorder on the same Session."""

    def __init__(self, hz: float, folder: Path) -> None:
        super().__init__(hz)
        self.recorder: Recorder = start_recording(
            folder / "bench.tmsession", self.session, "run", "bench.py"
        )
        self.cpu = 0.0
        self.wall = 0.0

    def timed(self, step, steps: int) -> list[float]:
        native = self.recorder._thread.native_id
        cpu, wall = thread_cpu(native), time.perf_counter()
        times = timed_block(step, steps)
        self.cpu += thread_cpu(native) - cpu
        self.wall += time.perf_counter() - wall
        return times


def _census(n: int) -> Census:
    storages = {}
    for i in range(n):
        key = ("cpu", 4096 * (i + 1))
        nbytes = 4096 * (i % 97 + 1)
        tensor = TensorInfo(
            name=f"model.layers.{i % 48}.mlp.weight", kind="parameter", shape=(nbytes // 4,),
            stride=(1,), storage_offset=0, dtype="float32", device="cpu", numel=nbytes // 4,
            element_size=4, span_bytes=nbytes, is_view=False, is_contiguous=True,
            requires_grad=True, is_leaf=True, grad_fn="", pinned=False, storage_key=key,
        )  # fmt: skip
        storages[key] = StorageInfo(key, nbytes, [tensor])
    return Census(storages, [], 0.1, 0)


def an_hour_on_disk(folder: Path, hours: float) -> None:
    session = Session()
    path = folder / "hour.tmsession"
    recorder = start_recording(path, session, "run", "long.py")
    census = _census(2000)
    seconds = int(hours * 3600)
    keys = ("cpu/rss", "cpu/uss", "system/available", "cuda:0/allocated", "cuda:0/reserved",
            "cuda:0/peak_allocated")  # fmt: skip
    started, cpu0 = time.perf_counter(), thread_cpu(recorder._thread.native_id)
    step = 0
    for second in range(seconds):
        if second % 60 == 0:  # a live run submits in real time: never outrun the writer
            while recorder._queue.qsize() > 1000:
                time.sleep(0.01)
        for tick in range(10):
            t = second + tick / 10
            session.submit(Sample(t, {k: 1e9 + (t * 1e3 + i) % 1e6 for i, k in enumerate(keys)}))
            step += 1
            session.submit(Marker(t, MarkerKind.STEP, step=step))
        session.submit(LogRecord(second, Stream.STDOUT, f"step {step} loss 0.{step % 1000:03d}"))
        if second % 300 == 0:
            session.submit(CensusTaken(second, step, census, "step"))
    while recorder._queue.qsize():
        time.sleep(0.01)
    time.sleep(1.0)  # the last commit
    cpu = thread_cpu(recorder._thread.native_id) - cpu0
    dropped = recorder.dropped
    recorder.close()
    write_s = time.perf_counter() - started
    size = file_bytes(path)
    started = time.perf_counter()
    recording = load(path)
    read_s = time.perf_counter() - started
    per_hour = 1 / hours
    print(
        f"{hours:g} h at 10 Hz ({recording.session.samples:,} samples, {step:,} steps): "
        f"{size * per_hour / 1e6:.1f} MB per hour on disk, "
        f"{size * per_hour * 24 * 7 / 1e9:.2f} GB per week ({dropped} events dropped)"
    )
    print(
        f"recorder thread CPU: {cpu * per_hour:.1f} s per hour of run "
        f"({cpu / (hours * 36):.3f}% of one core); submitting it all took {write_s:.1f} s"
    )
    how = "from its overview" if recording.session.samples > OVERVIEW_ABOVE else "by replay"
    print(f"reading it back into a Session ({how}): {read_s:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hours", type=float, default=1.0, help="length of the simulated run")
    args = p.parse_args()
    step = make_loop()
    for _ in range(10):
        step()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        recorded = Recorded(10.0, folder)
        variants = {"unmonitored": None, "torchmem defaults": Monitored(10.0),
                    "defaults + recording": recorded}  # fmt: skip
        results: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.blocks):
            for name, monitor in variants.items():
                results[name] += (
                    timed_block(step, args.steps)
                    if monitor is None
                    else monitor.block(step, args.steps)
                )
        recorded.recorder.close()
        print(
            f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads"
        )
        base = statistics.median(results["unmonitored"])
        base_mean = statistics.fmean(results["unmonitored"])
        defaults = statistics.median(results["torchmem defaults"])
        print(
            f"{'variant':<22} {'median step':>12} {'ratio':>7} {'mean step':>11} {'ratio':>7} "
            f"{'vs defaults':>12}   ({args.blocks} blocks x {args.steps} steps, interleaved)"
        )
        for name, times in results.items():
            med, mean = statistics.median(times), statistics.fmean(times)
            print(
                f"{name:<22} {med * 1000:>9.2f} ms {med / base:>7.3f} {mean * 1000:>8.2f} ms "
                f"{mean / base_mean:>7.3f} {med / defaults:>12.3f}"
            )
        print(
            f"recorder thread: {recorded.cpu * 1000:.0f} ms CPU over {recorded.wall:.1f} s of "
            f"recorded blocks ({100 * recorded.cpu / max(recorded.wall, 1e-9):.2f}% of one "
            f"core); {recorded.recorder.written:,} rows, "
            f"{file_bytes(recorded.recorder.path) / 1024:.0f} KiB"
        )
        report.ratio_row(
            "step time, recording (vs torchmem defaults)",
            statistics.median(results["defaults + recording"]) / defaults,
            1.01,
            f"median step, {args.blocks} interleaved blocks x {args.steps} steps",
        )
        an_hour_on_disk(folder, args.hours)


if __name__ == "__main__":
    main()
