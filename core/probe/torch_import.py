"""torch, imported with the cyclic garbage collector paused.

Importing torch creates several hundred thousand Python objects (its ops, decompositions
and modules), and the collector runs over the young ones again and again while they
appear, though none of them is garbage: 0.15-0.2 s of the 1.1-1.3 s import on a 2-core
machine. Every process torchmem starts for itself (a tuning trial, a fake step, a lab
worker, a separate-process run) imports torch first, so each of them starts that much
sooner. The collector's state is put back as it was, and whatever garbage the import
left is collected by its next pass.
"""

from __future__ import annotations

import gc
import sys
from types import ModuleType


def import_torch() -> ModuleType:
    """torch (ImportError where it is not installed), imported with the collector paused
    if this process has not imported it yet."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    paused = gc.isenabled()
    gc.disable()
    try:
        import torch
    finally:
        if paused:
            gc.enable()
    return torch
