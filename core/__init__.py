"""torchmem: a live monitor for PyTorch memory.

``import torchmem`` gives the core API only and never imports Qt, so it is safe inside a
training process::

    import torchmem
    torchmem.mark("epoch 2")   # a marker on the traces (a no-op outside torchmem)
"""

from __future__ import annotations

__version__ = "0.1.0"

from .steps import mark

__all__ = ["__version__", "mark"]
