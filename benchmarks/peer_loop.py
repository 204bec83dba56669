"""The CPU training loop every peer profiles in ``peers.py``: ``cnn_loop.make_loop``.

Standalone (each peer runs it as its own program). It times each step with
``perf_counter`` and writes the median of the steps after a warm-up to the file named by
``PEER_TIMES``. With ``PEER_LINE_PROFILE=memory_profiler`` the step function is
decorated with memory_profiler's ``@profile`` (its line-by-line mode), with
``PEER_LINE_PROFILE=memlab`` it runs under pytorch-memlab's ``LineProfiler``.
"""

import json
import os
import statistics
import sys
import time

from cnn_loop import make_loop

STEPS = int(os.environ.get("PEER_STEPS", "150"))
WARMUP = 5

step = make_loop(64)


line = os.environ.get("PEER_LINE_PROFILE", "")
if line == "memory_profiler":
    from memory_profiler import profile

    step = profile(step, stream=open(os.devnull, "w"))  # noqa: SIM115
profiler = None
if line == "memlab":
    from pytorch_memlab import LineProfiler

    profiler = LineProfiler(step)
    profiler.enable()

times = []
for _ in range(STEPS):
    started = time.perf_counter()
    step()
    times.append(time.perf_counter() - started)
with open(os.environ["PEER_TIMES"], "w") as f:
    json.dump({"median_s": statistics.median(times[WARMUP:])}, f)
sys.exit(0)
