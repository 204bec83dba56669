"""Snapshot files in PyTorch's format (``torch.cuda.memory._snapshot()``), built by hand:
no GPU here, so the tests write what ``_dump_snapshot`` would, with known answers."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

MiB = 1 << 20


def frames(*where: str) -> list[dict[str, Any]]:
    """Frames innermost first, each ``name@file:line``."""
    out = []
    for w in where:
        name, _, rest = w.partition("@")
        filename, _, line = rest.partition(":")
        out.append({"name": name, "filename": filename, "line": int(line or 1)})
    return out


PARAM = frames("reset_parameters@/x/torch/nn/modules/linear.py:100",
               "__init__@/x/torch/nn/modules/linear.py:90", "main@train.py:10")  # fmt: skip
ACTIVATION = frames("forward@model.py:20", "_call_impl@/x/torch/nn/modules/module.py:1",
                    "main@train.py:30")  # fmt: skip
OPTIMIZER = frames("_init_group@/x/torch/optim/adam.py:150", "step@/x/torch/optim/adam.py:200",
                   "main@train.py:40")  # fmt: skip
GRADIENT = frames("_engine_run_backward@/x/torch/autograd/graph.py:5",
                  "backward@/x/torch/_tensor.py:600", "main@train.py:50")  # fmt: skip


def alloc(addr: int, size: int, t: int, stack: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": stack}  # fmt: skip


def free(addr: int, size: int, t: int) -> list[dict[str, Any]]:
    """A free as torch records it: requested, then completed."""
    return [
        {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}
        for action in ("free_requested", "free_completed")
    ]


def segment(address: int, blocks: list[tuple[int, int, str]], device: int = 0) -> dict[str, Any]:
    total = sum(size for _, size, _ in blocks)
    allocated = sum(size for _, size, state in blocks if state == "active_allocated")
    return {
        "device": device, "address": address, "total_size": total,
        "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
        "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [],
        "blocks": [{"address": a, "size": s, "requested_size": s, "state": st, "frames": []}
                   for a, s, st in blocks],
    }  # fmt: skip


def holed_segment_snapshot(seg: int = 0x10000000) -> dict[str, Any]:
    """One 20 MiB segment traced from its allocation: three parameters of 4, 8 and 4 MiB
    (at times 2, 3, 4), then the middle one freed (time 5): a hole of 8 MiB between two
    blocks, and 4 MiB free at the end."""
    trace = [
        {"action": "segment_alloc", "addr": seg, "size": 20 * MiB, "stream": 0, "time_us": 1,
         "frames": []},
        alloc(seg, 4 * MiB, 2, PARAM),
        alloc(seg + 4 * MiB, 8 * MiB, 3, PARAM),
        alloc(seg + 12 * MiB, 4 * MiB, 4, PARAM),
        *free(seg + 4 * MiB, 8 * MiB, 5),
    ]  # fmt: skip
    return {"segments": [], "device_traces": [trace]}


def small_snapshot() -> dict[str, Any]:
    """Known by hand: 1.5 MiB live before the trace (A freed at t=5, F never mentioned),
    B 2 MiB (parameter), C 4 MiB (activation, freed at t=4), D 3 MiB (optimizer state),
    E 8 MiB (gradient, t=6..7). Active: 1.5, 3.5, 7.5, 10.5, 6.5, 5.5, 13.5 (the peak, at
    t=6: B, D, E and F live), 5.5."""
    A, B, C, D, E, F = (0x10000 * i for i in range(1, 7))
    trace = [
        alloc(B, 2 * MiB, 1, PARAM),
        alloc(C, 4 * MiB, 2, ACTIVATION),
        alloc(D, 3 * MiB, 3, OPTIMIZER),
        *free(C, 4 * MiB, 4),
        *free(A, 1 * MiB, 5),
        alloc(E, 8 * MiB, 6, GRADIENT),
        *free(E, 8 * MiB, 7),
    ]
    segments = [
        segment(B, [(B, 2 * MiB, "active_allocated"), (B + 2 * MiB, 2 * MiB, "inactive")]),
        segment(D, [(D, 3 * MiB, "active_allocated")]),
        segment(F, [(F, MiB // 2, "active_allocated"), (F + MiB // 2, MiB // 2, "inactive")]),
    ]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}}


def random_snapshot(events: int, seed: int = 0) -> dict[str, Any]:
    """Random allocs and frees on one device (some live before the trace), to compare with
    a replay written independently."""
    rng = random.Random(seed)
    live: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    stacks = [PARAM, ACTIVATION, OPTIMIZER, GRADIENT]
    next_addr = 1 << 30
    for addr in range(64):  # live before the trace began
        live[(1 << 20) + addr * 4096] = rng.randrange(512, 1 << 16)
    addrs = list(live)  # the live addresses, to pick one in constant time
    t = 0
    while len(trace) < events:
        t += rng.randrange(1, 50)
        if addrs and rng.random() < 0.48:
            i = rng.randrange(len(addrs))
            addrs[i], addrs[-1] = addrs[-1], addrs[i]
            addr = addrs.pop()
            trace += free(addr, live.pop(addr), t)
        else:
            size = rng.randrange(512, 1 << 22)
            next_addr += size + 512
            live[next_addr] = size
            addrs.append(next_addr)
            trace.append(alloc(next_addr, size, t, rng.choice(stacks)))
    segments = [segment(a, [(a, s, "active_allocated")]) for a, s in live.items()]
    return {"segments": segments, "device_traces": [trace]}


def replay(snapshot: dict[str, Any]) -> tuple[int, int, set[int]]:
    """(peak active bytes, its time, the addresses live then) by a plain replay."""
    trace = snapshot["device_traces"][0]
    seen = {e["addr"] for e in trace if e["action"] in ("alloc", "free_completed")}
    first = {}
    for e in trace:
        if e["action"] in ("alloc", "free_completed"):
            first.setdefault(e["addr"], e)
    live = {a: e["size"] for a, e in first.items() if e["action"] == "free_completed"}
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in seen:
                live[b["address"]] = b["size"]
    best, when, at_peak = -1, 0, set()
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
        else:
            continue
        total = sum(live.values())
        if total > best:
            best, when, at_peak = total, e["time_us"], set(live)
    return best, when, at_peak


def write(path: Path, snapshot: Any, protocol: int = 4) -> Path:
    with path.open("wb") as f:
        pickle.dump(snapshot, f, protocol=protocol)
    return path
