"""Whether a device a user named exists here, said before any work starts.

``torchmem tune --device cuda:0`` on a machine without CUDA ran its trials first and
failed in each ("the script reported no cuda:0 memory"); the lab showed torch's own
"AssertionError: Torch not compiled with CUDA enabled". Both now ask here first. NVIDIA
devices are counted through NVML, which creates no CUDA context; torch is asked only
where NVML sees none, to say which build it is.
"""

from __future__ import annotations

from torchmem.probe import nvml

#: Device types torch can put a training run on.
KINDS = ("cpu", "cuda", "mps", "xpu", "meta")


def device_problem(device: str) -> str:
    """Why ``device`` (``cuda:0``, ``cpu``, ``mps``) cannot be used here, for a user; ""
    when it can."""
    kind, _, index_text = device.strip().partition(":")
    if kind not in KINDS or (index_text and not index_text.isdigit()):
        return f"not a device: {device!r} (cpu, cuda, cuda:N, mps or xpu)"
    if kind in ("cpu", "meta"):
        return ""
    index = int(index_text) if index_text else None
    count = nvml.device_count() if kind == "cuda" else 0
    if count == 0:
        import torch

        backend = torch.backends.mps if kind == "mps" else getattr(torch, kind, None)
        if backend is None or not backend.is_available():
            return f"no {kind} device here (torch {torch.__version__}): choose cpu"
        count = getattr(backend, "device_count", lambda: 1)()
    if index is not None and index >= count:
        return f"{device}: this machine has {count} {kind} device{'s' * (count > 1)}"
    return ""
