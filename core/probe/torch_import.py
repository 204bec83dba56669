"""torch, and torch's heaviest lazy import, with the cyclic garbage collector paused.

Importing torch creates several hundred thousand Python objects (its ops, decompositions
and modules), and the collector runs over them again and again while they appear,
though none of them is garbage. The first ``torch.optim`` optimizer, and every
``FakeTensorMode``, import ``torch._dynamo`` too, and the collection passes grow with the
heap. On the 2-core CI machine, with the collector paused: ``import torch`` 0.15-0.2 s
less CPU (of 1.1-1.3 s), ``import torch, torch._dynamo`` 0.5-0.7 s less (of 2.7-3.0 s).

Only the processes torchmem runs a script in for itself pause it (``torchmem run``: a
tuning trial, a separate-process run of the window, a run from the command line; a fake
step; a lab worker), and only while those modules' code runs. The collector's state is
put back as it was, and whatever garbage the import left is collected by its next pass.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from torchmem.probe.collector import collector_paused

#: Imported lazily by torch at a script's first optimizer (or FakeTensorMode): 1.1-1.4 s.
LAZY_HEAVY = ("torch._dynamo",)


def import_torch() -> ModuleType:
    """torch (ImportError where it is not installed), imported with the collector paused
    if this process has not imported it yet."""
    if "torch" not in sys.modules:
        with collector_paused():
            import torch  # noqa: F401
    return sys.modules["torch"]


class _PausedLoader(importlib.abc.Loader):
    """Another loader, whose module code runs with the collector paused; everything else
    (``get_source``, ``is_package``, resources) is the other loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with collector_paused():
            self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PausedImports(importlib.abc.MetaPathFinder):
    """Finds ``names`` as the finders after it would, with their loader wrapped."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PausedLoader(spec.loader)
                return spec
        return None


def pause_collector_for_lazy_imports(names: Sequence[str] = LAZY_HEAVY) -> None:
    """From now on in this process, ``names`` (not imported yet) are imported with the
    collector paused, whoever imports them: the script torchmem runs included."""
    missing = [name for name in names if name not in sys.modules]
    if missing and not any(isinstance(f, _PausedImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _PausedImports(missing))
