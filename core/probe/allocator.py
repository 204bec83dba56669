"""Allocator settings a user gives a run (``PYTORCH_CUDA_ALLOC_CONF``), checked before the
run starts: a typo there is silently ignored by PyTorch, and two runs compared by their
settings must differ in what the allocator really read."""

from __future__ import annotations

import os

#: Environment variables of PyTorch's allocators: what a run's allocator settings set, and
#: what a run reports (and a recording notes) of the environment it runs in.
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def allocator_settings() -> dict[str, str]:
    """The allocator variables this process runs with."""
    return {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ}


#: The keys PyTorch's CUDA caching allocator reads, and what their values must be.
KNOWN = {
    "expandable_segments": "True or False",
    "max_split_size_mb": "a whole number of MiB (at least 20)",
    "garbage_collection_threshold": "a fraction between 0 and 1",
    "roundup_power2_divisions": "a whole number (a power of two)",
    "backend": "native or cudaMallocAsync",
    "release_lock_on_cudamalloc": "True or False",
    "pinned_use_cuda_host_register": "True or False",
    "pinned_num_register_threads": "a whole number",
}


def check_allocator_conf(text: str) -> str:
    """``key:value,key:value`` normalised (spaces dropped), or ValueError saying what is
    wrong and what is accepted. An empty text means the allocator's defaults."""
    text = "".join(text.split())
    if not text:
        return ""
    for part in text.split(","):
        key, sep, value = part.partition(":")
        if not sep or not key or not value:
            raise ValueError(f"{part!r} is not key:value (e.g. expandable_segments:True)")
        if key not in KNOWN:
            raise ValueError(f"unknown setting {key!r}; PyTorch reads {', '.join(KNOWN)}")
        if not _valid(key, value):
            raise ValueError(f"{key} must be {KNOWN[key]}, not {value!r}")
    return text


def _valid(key: str, value: str) -> bool:
    if KNOWN[key] == "True or False":
        return value in ("True", "False", "true", "false", "1", "0")
    if key == "backend":
        return value in ("native", "cudaMallocAsync")
    if key == "garbage_collection_threshold":
        try:
            return 0.0 < float(value) < 1.0
        except ValueError:
            return False
    if key == "roundup_power2_divisions" and value.startswith("["):
        return value.endswith("]")  # the per-size list form
    if not value.isdigit():
        return False
    return key != "max_split_size_mb" or int(value) >= 20


def allocator_env(conf: str) -> dict[str, str]:
    """The environment of a run with ``conf``: both names PyTorch reads (the CUDA one, and
    the device-generic one of recent releases)."""
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_ALLOC_CONF": conf} if conf else {}
