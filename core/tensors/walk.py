"""Taking a census of live tensors: every storage once, with real names and exact sizes.

One pass over ``gc.get_objects()`` finds tensors, modules and optimizers. Storages are
keyed by ``(device, untyped_storage().data_ptr())`` and their bytes are
``untyped_storage().nbytes()``, counted once however many views share them. Names come,
best first, from module paths (every name of a tied weight), ``.grad``, optimizer state,
the running script's variables, the graphs of autograd (tensors saved for backward), a
bounded referrer walk, and only then a type+shape label.

The census holds no reference to any tensor once it returns, so it never keeps memory
alive (a tensor a user asks about is found again by :meth:`TensorInfo.alive`).
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections.abc import Iterable, Iterator
from itertools import compress, islice
from operator import not_
from typing import Any

from torchmem.tensors.heap import objects_of_types
from torchmem.tensors.model import (
    KIND_RANK,
    Census,
    Skipped,
    StorageInfo,
    StorageKey,
    TensorInfo,
)
from torchmem.tensors.namespaces import Namespace
from torchmem.tensors.referrers import name_by_referrers

MAX_CONTAINER_ITEMS = 1_000_000
# Containers entered inside the script's variables per census (a list of a million dicts
# would cost a second to walk; tensors in them are still found, and named by referrers).
MAX_NESTED_CONTAINERS = 100_000
MAX_GRAPH_NODES = 200_000
# gc.get_referrers(*targets) compares every reference on the heap with every target, so
# the walk is kept to the largest unnamed tensors (where the unnamed bytes are).
MAX_REFERRER_TENSORS = 32

# -- the walk -----------------------------------------------------------------------------


def _module_paths(root: Any, var_names: dict[int, str]) -> Iterator[tuple[str, Any]]:
    base = var_names.get(id(root)) or type(root).__name__
    for name, module in root.named_modules():
        yield _unwrapped(f"{base}.{name}" if name else base), module


def _unwrapped(path: str) -> str:
    """``path`` without the ``_orig_mod`` that torch.compile's wrapper puts in every name
    of the module it compiles: ``model.fc.weight``, the name the user knows."""
    return path.replace("._orig_mod", "") if "._orig_mod" in path else path


def _label(t: Any) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


class _Walk:
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
            label = entries[0][0] if entries else _label(t)
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


def take_census(
    namespaces: list[Namespace] | None = None,
    exclude: Iterable[Any] = (),
    step: int = 0,
    referrers: bool = True,
) -> Census:
    """Walk every live tensor of this process and return a :class:`Census`.

    ``namespaces`` are ``(prefix, dict)`` pairs whose variables name tensors (the running
    script's); ``exclude`` objects are left out (torchmem's own).
    """
    import torch

    started = time.perf_counter()
    # A census allocates a few objects per tensor; with automatic collection on, those
    # allocations set off collections over the whole heap that cost more than the census
    # (1.3 s instead of 0.8 s for 100,000 tensors among a million objects). Collections
    # are deferred while it runs, never run by it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _take_census(torch, namespaces, exclude, step, referrers, started)
    finally:
        if collecting:
            gc.enable()


#: Tensor types of torch.compile and export tracing: shapes and dtypes over a meta storage,
#: no memory (a FakeTensor's ``data_ptr()`` raises). Compiled models keep them alive in
#: their graphs' metadata. Looked up in ``sys.modules`` only: never imported for this.
_TRACING_TYPES = (
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._subclasses.functional_tensor", "FunctionalTensor"),
)


def _tracing_types(tensor_types: set[type]) -> set[type]:
    """The types among ``tensor_types`` that only trace (see ``_TRACING_TYPES``)."""
    bases = tuple(
        cls
        for module, name in _TRACING_TYPES
        if (cls := getattr(sys.modules.get(module), name, None)) is not None
    )
    return {tp for tp in tensor_types if issubclass(tp, bases)} if bases else set()


def _find_objects(
    torch: Any, excluded: set[int]
) -> tuple[list[Any], list[Any], list[Any], set[type], list[Skipped]]:
    """Every tensor, module and optimizer on the heap, the tensor types among them, and a
    line for each kind of tracing tensor left out (they hold no memory)."""
    found, tensor_types = objects_of_types((torch.Tensor, torch.nn.Module, torch.optim.Optimizer))
    tensors, modules, optimizers = found
    skipped: list[Skipped] = []
    tracing = _tracing_types(tensor_types)
    if tracing:
        kinds = list(map(type, tensors))
        for tp in sorted(tracing, key=lambda tp: tp.__name__):
            n = kinds.count(tp)
            skipped.append(
                Skipped(
                    f"{n:,} {tp.__name__}{'s' if n > 1 else ''}",
                    "torch.compile / export tracing: shapes only, no memory of their own",
                )
            )
        tensors = list(compress(tensors, map(not_, map(tracing.__contains__, kinds))))
        tensor_types -= tracing
    if excluded:
        tensors = [t for t in tensors if id(t) not in excluded]
    return tensors, modules, optimizers, tensor_types, skipped


def _take_census(
    torch: Any,
    namespaces: list[Namespace] | None,
    exclude: Iterable[Any],
    step: int,
    referrers: bool,
    started: float,
) -> Census:
    walk = _Walk(torch, {id(o) for o in exclude})
    Tensor, Module, Optimizer = torch.Tensor, torch.nn.Module, torch.optim.Optimizer
    tensors, modules, optimizers, tensor_types, tracing = _find_objects(torch, walk.exclude)
    walk.tensor_types |= tensor_types
    walk.skipped += tracing

    # 1. Module paths (all names of tied weights), buffers, .grad.
    var_names: dict[int, str] = {}
    for entry in namespaces or ():
        if len(entry) == 3:  # a library frame's locals: they do not name modules
            continue
        for key, value in list(entry[1].items()):
            if isinstance(value, (Module, Optimizer)) and not key.startswith("_"):
                var_names.setdefault(id(value), key)
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    roots.sort(key=lambda m: id(m) not in var_names)
    param_names: dict[int, str] = {}
    used: dict[str, int] = {}
    for root in roots:
        base = var_names.get(id(root)) or type(root).__name__
        used[base] = used.get(base, 0) + 1
        if used[base] > 1:
            base = f"{base}#{used[base]}"
        for pname, p in root.named_parameters(remove_duplicate=False):
            full = _unwrapped(f"{base}.{pname}")
            walk.name(p, full, "parameter")
            param_names.setdefault(id(p), full)
            if p.grad is not None:
                walk.name(p.grad, f"{full}.grad", "gradient")
        for bname, b in root.named_buffers(remove_duplicate=False):
            walk.name(b, _unwrapped(f"{base}.{bname}"), "buffer")

    # 2. Optimizer state, named after the parameter it belongs to.
    per_class: dict[type, int] = {}
    for opt in optimizers:
        per_class[type(opt)] = per_class.get(type(opt), 0) + 1
    for i, opt in enumerate(optimizers):
        oname = type(opt).__name__
        if per_class[type(opt)] > 1:  # two Adams: tell them apart by variable or order
            oname = f"{oname}[{var_names.get(id(opt)) or i}]"
        for p, state in list(opt.state.items()):
            pname = param_names.get(id(p)) or _label(p)
            for key, value in list(state.items()):
                if isinstance(value, Tensor):
                    walk.name(value, f"{oname}.state[{pname}].{key}", "optimizer_state")

    # 3. The script's variables, then tensors in flight in library frames (forward of a
    # module, step of an optimizer), named after the object that runs them.
    for entry in namespaces or ():
        if len(entry) == 2:
            walk.name_namespace(entry[0], entry[1])
    module_paths = {id(m): path for root in roots for path, m in _module_paths(root, var_names)}
    for entry in namespaces or ():
        if len(entry) == 3:
            prefix, ns, owner = entry
            if owner is not None:
                owner_name = module_paths.get(id(owner)) or type(owner).__name__
                prefix = f"{owner_name}.{prefix}"
            walk.name_namespace(prefix, ns, depth=1)

    # 4. Tensors saved for backward, attributed to the graph of a named root.
    names = walk.names
    with_graph = [t for t in tensors if t.grad_fn is not None]
    roots_for_graph = [(t, names[id(t)][0][0]) for t in with_graph if id(t) in names]
    roots_for_graph += [(t, _label(t)) for t in with_graph if id(t) not in names]
    graph_ids = {id(t) for t in with_graph}
    with_graph.clear()
    saved = walk.saved_tensors(roots_for_graph)
    roots_for_graph.clear()

    # 5. Everything into storages, named first so that their names win.
    add = walk.add
    for t in tensors:
        try:
            entries = names.get(id(t))
            if entries:
                if len(entries) > 1:
                    entries.sort(key=lambda e: KIND_RANK[e[1]])
                    all_names = tuple(n for n, _ in entries)
                else:
                    all_names = (entries[0][0],)
                name, kind = entries[0]
                if kind == "plain" and id(t) in graph_ids:
                    kind = "activation"
                add(t, name, kind, True, all_names)
            else:
                add(t, _label(t), "activation" if id(t) in graph_ids else "plain", False, ())
        except Exception as exc:  # a tensor subclass torch cannot size: listed, never fatal
            walk.skip_failed(t, exc)
    # Saved tensors come back from the graph as new Python objects over the same storage:
    # name the storage's unnamed tensors after the graph, and add only unseen storages.
    renamed: set[int] = set()
    for t, root_name in saved:
        if id(t) in renamed:
            continue
        renamed.add(id(t))
        if t.device.type == "meta" or t.is_nested or t.layout is not torch.strided:
            continue
        known = len(walk.storages)
        try:
            key = walk.storage_key(t)
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            continue
        storage = walk.storages[key]
        if len(walk.storages) > known or not storage.tensors:
            walk.add(t, root_name, "activation", True, (root_name,))
            continue
        for info in storage.tensors:
            if not info.named:
                info.name, info.named, info.names = root_name, True, (root_name,)
                walk.names.setdefault(id(t), [(root_name, "activation")])
                if info.kind == "plain":
                    info.kind = "activation"
    saved.clear()

    # 6. A bounded referrer walk for tensors that still have no name.
    if referrers:
        unnamed = [t for t in tensors if id(t) in walk.unnamed]
        if len(unnamed) > MAX_REFERRER_TENSORS:
            unnamed.sort(
                key=lambda t: walk.storages[walk.unnamed[id(t)].storage_key].nbytes, reverse=True
            )
            del unnamed[MAX_REFERRER_TENSORS:]
        name_by_referrers(
            walk.unnamed,
            unnamed,
            exclude={id(tensors), id(modules), id(optimizers), id(walk.by_id), id(unnamed)},
        )
        unnamed.clear()
    walk.unnamed.clear()
    tensors.clear()
    walk.by_id.clear()
    census = Census(walk.storages, walk.skipped, time.perf_counter() - started, step)
    return census
