"""Who grows: storages of successive censuses grouped by signature, and how to fix it.

A leak keeps the same kind of tensor step after step (``losses[12]``, ``losses[13]``, ...
with one grad_fn and one shape): censuses are grouped by (device, dtype, shape, grad_fn,
name pattern), and the groups whose count grows with the steps are the culprits, each
with a suggestion for its pattern.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from torchmem.leaks.advice import SUGGEST_CLOSURE, SUGGEST_CONTAINER, SUGGEST_GRAPH
from torchmem.units import format_bytes

_INDEX = re.compile(r"\[(\d+|'[^']*'|\"[^\"]*\")\]")
_NUMBERS = re.compile(r"\b(item|of a list of|of a tuple of|in a dict of|key) \d+")
_LABEL = re.compile(r": \w+ \[[\d, ]*\]$")


def name_pattern(name: str) -> str:
    """A name with its indices folded: ``losses[12]`` -> ``losses[#]``.

    Referrer descriptions fold too (``item 7 of a list of 40: float32 [3]`` ->
    ``item # of a list of #``), so that one growing container is one group.
    """
    name = _INDEX.sub(lambda m: "[#]" if m.group(1).isdigit() else "['#']", name)
    name = _NUMBERS.sub(lambda m: f"{m.group(1)} #", name)
    return _LABEL.sub("", name)


def _holder(pattern: str) -> str:
    """Who holds tensors of this name pattern, in words."""
    if pattern.startswith("saved by the graph of "):
        return f"the autograd graph of {_holder(pattern.removeprefix('saved by the graph of '))}"
    base = pattern
    if base.startswith("captured by closure"):
        return base.split(":")[0]
    for marker, kind in (("[#]", "container"), ("['#']", "dict")):
        if marker in base:
            container = base.split(marker)[0]
            return f"{kind} `{container}`" if container else f"a {kind}"
    if base.startswith(("item ", "value of key")):
        return base.split(":")[0].replace("item # of ", "").replace(" of #", "")
    return f"`{base}`"


@dataclass
class CensusGroup:
    """Storages of one census that share a signature: how many, their bytes, an example."""

    count: int
    nbytes: int
    example: str
    dtype: str
    shape: tuple[int, ...]
    grad_fn: str
    device: str


def group_census(census: Any) -> dict[tuple, CensusGroup]:
    """Storages of a census grouped by signature (device, dtype, shape, grad_fn, pattern)."""
    groups: dict[tuple, CensusGroup] = {}
    for storage in census.storages.values():
        if not storage.tensors:
            continue
        best = min(storage.tensors, key=lambda t: (not t.named, t.is_view))
        pattern = name_pattern(best.name)
        sig = (storage.device, best.dtype, best.shape, best.grad_fn, pattern)
        g = groups.get(sig)
        if g is None:
            groups[sig] = CensusGroup(
                1, storage.nbytes, best.name, best.dtype, best.shape, best.grad_fn, storage.device
            )
        else:
            g.count += 1
            g.nbytes += storage.nbytes
    return groups


def find_culprits(tables: list[tuple[int, dict[tuple, CensusGroup]]]) -> list[dict[str, Any]]:
    """Groups whose count grows with the steps across the censuses in ``tables``."""
    if len(tables) < 2:
        return []
    (s0, first), (s1, last) = tables[0], tables[-1]
    steps = s1 - s0
    if steps <= 0:
        return []
    growing: dict[str, dict[str, Any]] = {}
    for sig, g in last.items():
        before = first.get(sig)
        count0 = before.count if before else 0
        bytes0 = before.nbytes if before else 0
        counts = [t.get(sig).count if t.get(sig) else 0 for _, t in tables]
        if g.count <= count0 or any(b < a for a, b in itertools.pairwise(counts)):
            continue
        pattern = sig[4]
        if pattern in growing:  # same name pattern, other shapes (a graph's activations)
            entry = growing[pattern]
            entry["bytes_per_step"] += (g.nbytes - bytes0) / steps
            entry["count_per_step"] = max(entry["count_per_step"], (g.count - count0) / steps)
            continue
        growing[pattern] = {
            "name": pattern,
            "example": g.example,
            "device": g.device,
            "dtype": g.dtype,
            "shape": list(g.shape),
            "grad_fn": g.grad_fn,
            "count": g.count,
            "count_per_step": (g.count - count0) / steps,
            "bytes_per_step": (g.nbytes - bytes0) / steps,
            "bytes_each": g.nbytes / g.count,
            "holder": _holder(pattern),
            "graph_bytes_per_step": 0.0,
        }
    # A kept tensor and the activations saved by its graph are one culprit.
    for pattern in list(growing):
        if pattern.startswith("saved by the graph of "):
            root = pattern.removeprefix("saved by the graph of ")
            saved = growing.pop(pattern)
            if root in growing:
                growing[root]["graph_bytes_per_step"] += saved["bytes_per_step"]
            else:
                growing[pattern] = saved
    culprits = sorted(
        growing.values(), key=lambda c: -(c["bytes_per_step"] + c["graph_bytes_per_step"])
    )
    # A group that gained one tensor over many steps (an evaluation batch) is not a trend.
    return [
        c
        for c in culprits
        if c["bytes_per_step"] + c["graph_bytes_per_step"] > 0 and c["count_per_step"] >= 0.05
    ][:5]


def describe_culprit(c: dict[str, Any]) -> str:
    """``+1 float32 [] tensor with grad_fn=AddBackward0 per step (...), held by list x``."""
    per = c["count_per_step"]
    count = f"{per:.0f}" if abs(per - round(per)) < 0.05 else f"{per:.2f}"
    grad = f" with grad_fn={c['grad_fn']}" if c["grad_fn"] else ""
    text = f"+{count} {c['dtype']} {c['shape']} tensor{grad} per step ("
    text += f"{format_bytes(c['bytes_each'])} each"
    if c["graph_bytes_per_step"]:
        total = c["bytes_per_step"] + c["graph_bytes_per_step"]
        text += f", but each keeps its graph: {format_bytes(total, signed=True)}/step"
    text += f"), held by {c['holder']}"
    return text


def suggestion_for(culprits: list[dict[str, Any]]) -> str:
    """How to fix the leak its top culprit shows: a kept graph, a closure, or a container."""
    if not culprits:
        return ""
    top = culprits[0]
    if top["graph_bytes_per_step"] or top["grad_fn"] or top["name"].startswith("saved by"):
        return SUGGEST_GRAPH
    if "captured by closure" in top["holder"]:
        return SUGGEST_CLOSURE
    return SUGGEST_CONTAINER.format(holder=top["holder"].capitalize())
