"""The state of one census as it walks the heap: names given, storages sized, what was
skipped and why.

:mod:`torchmem.tensors.walk` runs the passes of a census (modules, optimizer state, the
script's variables, autograd graphs, referrers) over one :class:`Walk`; this module is
what they share: how a tensor is named once, sized by its storage and kept off the list
of live objects once the census returns.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from itertools import compress, islice
from typing import Any

from torchmem.tensors.model import (
    Skipped,
    StorageInfo,
    StorageKey,
    TensorInfo,
)

MAX_CONTAINER_ITEMS = 1_000_000
# Containers entered inside the script's variables per census (a list of a million dicts
# would cost a second to walk; tensors in them are still found, and named by referrers).
MAX_NESTED_CONTAINERS = 100_000
MAX_GRAPH_NODES = 200_000
# gc.get_referrers(*targets) compares every reference on the heap with every target, so
# the walk is kept to the largest unnamed tensors (where the unnamed bytes are).
MAX_REFERRER_TENSORS = 32

# -- the walk -----------------------------------------------------------------------------


def module_paths(root: Any, var_names: dict[int, str]) -> Iterator[tuple[str, Any]]:
    """Every submodule of ``root`` with its path, from the script's name of ``root``."""
    base = var_names.get(id(root)) or type(root).__name__
    for name, module in root.named_modules():
        yield unwrapped(f"{base}.{name}" if name else base), module


def unwrapped(path: str) -> str:
    """``path`` without the ``_orig_mod`` that torch.compile's wrapper puts in every name
    of the module it compiles: ``model.fc.weight``, the name the user knows."""
    return path.replace("._orig_mod", "") if "._orig_mod" in path else path


def label_of(t: Any) -> str:
    """A tensor without a name, as the table shows it: ``float32 [64, 128]``."""
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


class Walk:
    """State of one census; discarded when it returns."""

    def __init__(self, torch: Any, exclude: set[int]) -> None:
        self.torch = torch
        self.exclude = exclude
        self.names: dict[int, list[tuple[str, str]]] = {}  # id(tensor) -> [(name, kind)]
        self.by_id: dict[int, Any] = {}
        self.skipped: list[Skipped] = []
        self.storages: dict[StorageKey, StorageInfo] = {}
        self.by_address: dict[int, StorageInfo] = {}  # StorageImpl address -> its entry
        self.storage_address = torch._C._storage_address
        self.pinning = _pinning_possible(torch)
        self.pinned: dict[int, bool] = {}  # StorageImpl address -> pinned (CPU, if pinning)
        self.saved_attrs: dict[type, list[str]] = {}
        self.dtype_names: dict[Any, str] = {}
        self.device_names: dict[Any, str] = {}
        self.unnamed: dict[int, TensorInfo] = {}  # id(tensor) -> its entry, for referrers
        self.strided = torch.strided
        self.tensor_types: set[type] = {torch.Tensor, torch.nn.Parameter}
        self.nested_budget = MAX_NESTED_CONTAINERS

    def name(self, t: Any, name: str, kind: str) -> None:
        key = id(t)
        entry = self.names.get(key)
        if entry is None:
            self.names[key] = [(name, kind)]
            self.by_id[key] = t  # keeps t alive (and its id unique) until the census ends
        elif (name, kind) not in entry:
            entry.append((name, kind))

    # -- namespaces ---------------------------------------------------------------------
    def name_namespace(self, prefix: str, ns: dict[str, Any], depth: int = 2) -> None:
        Tensor = self.torch.Tensor
        for key, value in list(ns.items()):
            if key.startswith("__") or isinstance(value, _SKIP_TYPES):
                continue
            path = f"{prefix}{key}"
            if isinstance(value, Tensor):
                self.name(value, path, "plain")
            elif depth > 0:
                self._name_container(path, value, depth)

    def _name_container(self, path: str, value: Any, depth: int) -> None:
        """Name the tensors held by ``value`` (a list, tuple, dict or object), ``depth`` deep.

        Scripts keep big containers without tensors (a data set of a million samples):
        the types of a container's items are read in C first, and it is skipped when it
        holds neither a tensor nor a container; paths are formatted only for hits; and at
        most ``MAX_NESTED_CONTAINERS`` containers are entered per census (the referrer
        walk still names the biggest tensors missed).
        """
        if isinstance(value, (list, tuple)):
            seq = value if len(value) <= MAX_CONTAINER_ITEMS else value[:MAX_CONTAINER_ITEMS]
            keys: Any = None
        elif isinstance(value, dict):
            keys = list(islice(value, MAX_CONTAINER_ITEMS))
            seq = list(islice(value.values(), MAX_CONTAINER_ITEMS))
        elif hasattr(value, "__dict__") and not isinstance(value, self.torch.nn.Module):
            try:
                attrs = vars(value)
            except TypeError:
                return
            keys = [k for k in attrs if not (isinstance(k, str) and k.startswith("__"))]
            seq = [attrs[k] for k in keys]
            path += "."
        else:
            return
        # Everything per item runs in C (map, compress); Python sees only the hits.
        types_ = list(map(type, seq))
        kinds = set(types_)
        tensor_kinds = kinds & self.tensor_types
        nested = depth > 1 and not kinds.isdisjoint(_NESTED_TYPES)
        if not tensor_kinds and not nested:
            return
        is_attrs = path.endswith(".")
        indices = range(len(seq))
        if tensor_kinds:
            for i in compress(indices, map(tensor_kinds.__contains__, types_)):
                self.name(seq[i], _item_path(path, keys, i, is_attrs), "plain")
        if nested:
            candidates = list(compress(indices, map(_NESTED_TYPES.__contains__, types_)))
            for i in compress(candidates, map(len, map(seq.__getitem__, candidates))):
                if self.nested_budget <= 0:
                    break
                self.nested_budget -= 1
                self._name_container(_item_path(path, keys, i, is_attrs), seq[i], depth - 1)

    # -- storages -------------------------------------------------------------------------
    def add(self, t: Any, name: str, kind: str, named: bool, names: tuple[str, ...]) -> None:
        """Size ``t`` and file it under its storage (the hot path of a census).

        Every call and attribute read here is paid once per tensor: torch's getters cost
        40-70 ns each, a Python call ~100 ns, so fields are read once and derived ones
        (is_leaf, span) computed from them.
        """
        if t.layout is not self.strided or t.is_meta or t.is_nested:
            self._add_unusual(t, name, kind, named)
            return
        try:
            address = self.storage_address(t)
        except (RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
            self._skip_storageless(t, name, exc)
            return
        storage = self.by_address.get(address)
        if storage is None:
            storage = self._new_storage(t, address)
        shape = tuple(t.shape)
        stride = t.stride()
        esize = t.element_size()
        numel = t.numel()
        contiguous = t.is_contiguous()
        if contiguous or numel == 0:
            span = numel * esize
        else:
            span = 1
            for n, st in zip(shape, stride, strict=True):
                span += (n - 1) * st
            span *= esize
        grad_fn = t.grad_fn
        dtype = t.dtype
        dtype_name = self.dtype_names.get(dtype)
        if dtype_name is None:
            dtype_name = self.dtype_names[dtype] = str(dtype).removeprefix("torch.")
        key = storage.key
        info = TensorInfo(
            name,
            kind,
            shape,
            stride,
            t.storage_offset(),
            dtype_name,
            key[0],
            numel,
            esize,
            span,
            t._base is not None,
            contiguous,
            t.requires_grad,
            grad_fn is None,  # is_leaf, without asking torch again
            type(grad_fn).__name__ if grad_fn is not None else "",
            self.pinned.get(address, False),
            key,
            names,
            named,
        )
        storage.tensors.append(info)
        if not named:
            self.unnamed[id(t)] = info

    def _add_unusual(self, t: Any, name: str, kind: str, named: bool) -> None:
        if t.is_meta:
            self.skipped.append(Skipped(name, "meta tensor: holds no memory"))
        elif t.is_nested:
            self.skipped.append(Skipped(name, "nested tensor: its storage is not exposed"))
        else:
            self._add_sparse(t, name, kind, named)

    def skip_failed(self, t: Any, exc: Exception) -> None:
        """List ``t`` as skipped because sizing it raised (a tensor subclass with a storage
        torch will not show), instead of failing the census."""
        entries = self.names.get(id(t))
        try:
            label = entries[0][0] if entries else label_of(t)
        except Exception:  # its dtype or shape raise too
            label = type(t).__name__
        reason = _reason(exc)
        self.skipped.append(Skipped(label, f"{type(t).__name__} could not be sized: {reason}"))

    def _skip_storageless(self, t: Any, name: str, exc: Exception) -> None:
        reason = _reason(exc)
        self.skipped.append(Skipped(name, f"{type(t).__name__} without real storage: {reason}"))

    def _add_sparse(self, t: Any, name: str, kind: str, named: bool) -> None:
        """Sparse tensors have no storage of their own: count their component tensors."""
        torch = self.torch
        layout = t.layout
        if layout is torch.sparse_coo:
            parts = (("indices", t._indices()), ("values", t._values()))
        elif layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (
                ("crow_indices", t.crow_indices()),
                ("col_indices", t.col_indices()),
                ("values", t.values()),
            )
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (
                ("ccol_indices", t.ccol_indices()),
                ("row_indices", t.row_indices()),
                ("values", t.values()),
            )
        else:
            self.skipped.append(Skipped(name, f"layout {layout} is not sized"))
            return
        for part, tensor in parts:
            self.add(tensor, f"{name}.{part}", kind, named, ())

    def storage_key(self, t: Any) -> StorageKey:
        """The key of ``t``'s storage, creating its entry on first sight."""
        address = self.storage_address(t)
        storage = self.by_address.get(address)
        if storage is None:
            storage = self._new_storage(t, address)
        return storage.key

    def _new_storage(self, t: Any, address: int) -> StorageInfo:
        """The entry of a storage seen for the first time (by its StorageImpl address)."""
        storage = t.untyped_storage()
        device = storage.device
        device_name = self.device_names.get(device)
        if device_name is None:  # str(device) costs 0.2 µs: once per device, not storage
            device_name = self.device_names[device] = str(device)
        key = (device_name, storage.data_ptr())
        info = self.storages.get(key)
        if info is None:
            info = self.storages[key] = StorageInfo(key, storage.nbytes())
            # Pinned host memory comes from an accelerator's allocator: without one
            # initialised there is none to ask about (and asking costs per storage).
            if self.pinning and key[0] == "cpu":
                self.pinned[address] = _is_pinned(t)
        else:  # two storage objects over the same memory: count the larger once
            info.nbytes = max(info.nbytes, storage.nbytes())
            if key[0] == "cpu" and self.pinning:
                self.pinned[address] = _is_pinned(t)
        self.by_address[address] = info
        return info

    # -- autograd graphs ------------------------------------------------------------------
    def saved_tensors(self, roots: list[tuple[Any, str]]) -> list[tuple[Any, str]]:
        """Tensors saved for backward in the graphs of ``roots``, each with its root's name."""
        Tensor = self.torch.Tensor
        seen: set[int] = set()
        found: list[tuple[Any, str]] = []
        for root, root_name in roots:
            stack = [root.grad_fn]
            while stack and len(seen) < MAX_GRAPH_NODES:
                node = stack.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                attrs = self.saved_attrs.get(type(node))
                if attrs is None:
                    attrs = [a for a in dir(node) if a.startswith("_saved_")]
                    self.saved_attrs[type(node)] = attrs
                for attr in attrs:
                    try:
                        value = getattr(node, attr)
                    except RuntimeError:  # freed by a backward pass already
                        continue
                    values = value if isinstance(value, (tuple, list)) else (value,)
                    for v in values:
                        if isinstance(v, Tensor):
                            found.append((v, f"saved by the graph of {root_name}"))
                stack.extend(fn for fn, _ in node.next_functions if fn is not None)
        return found


_SKIP_TYPES = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    type,
    types.MethodType,
)


_NESTED_TYPES = frozenset({list, tuple, dict})


def _reason(exc: Exception) -> str:
    """Why torch refused a tensor, in one short line for the skipped list."""
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__


def _item_path(path: str, keys: list[Any] | None, i: int, is_attrs: bool) -> str:
    """``path[3]``, ``path['key']`` or ``path.attr`` for item ``i`` of a container."""
    if keys is None:
        return f"{path}[{i}]"
    if is_attrs:
        return f"{path}{keys[i]}"
    return f"{path}[{keys[i]!r}]"


def _pinning_possible(torch: Any) -> bool:
    """True when some accelerator runtime is initialised, so host memory can be pinned."""
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_initialized():
                return True
        except (AttributeError, RuntimeError):
            continue
    return False


def _is_pinned(t: Any) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # no accelerator runtime to ask
        return False
