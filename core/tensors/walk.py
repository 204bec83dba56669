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

import sys
import time
from collections.abc import Iterable
from itertools import compress
from operator import not_
from typing import Any

from torchmem.probe.collector import collector_paused
from torchmem.tensors.heap import objects_of_types
from torchmem.tensors.model import (
    KIND_RANK,
    Census,
    Skipped,
)
from torchmem.tensors.namespaces import Namespace
from torchmem.tensors.referrers import name_by_referrers
from torchmem.tensors.walker import (
    MAX_REFERRER_TENSORS,
    Walk,
    label_of,
    module_paths,
    unwrapped,
)


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
    with collector_paused():
        return _take_census(torch, namespaces, exclude, step, referrers, started)


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
    walk = Walk(torch, {id(o) for o in exclude})
    tensors, modules, optimizers, tensor_types, tracing = _find_objects(torch, walk.exclude)
    walk.tensor_types |= tensor_types
    walk.skipped += tracing
    namespaces = namespaces or []
    var_names = _variable_names(torch, namespaces)
    roots = _root_modules(modules, var_names)
    param_names = _name_modules(walk, roots, var_names)
    _name_optimizer_state(walk, torch, optimizers, var_names, param_names)
    _name_namespaces(walk, namespaces, roots, var_names)
    # Tensors saved for backward, attributed to the graph of a named root.
    graph_ids = {id(t) for t in tensors if t.grad_fn is not None}
    saved = walk.saved_tensors(_graph_roots(walk, tensors))
    _add_tensors(walk, tensors, graph_ids)
    _add_saved(walk, torch, saved)
    saved.clear()
    if referrers:
        _name_by_referrers(walk, tensors, modules, optimizers)
    walk.unnamed.clear()
    tensors.clear()
    walk.by_id.clear()
    return Census(walk.storages, walk.skipped, time.perf_counter() - started, step)


def _variable_names(torch: Any, namespaces: list[Namespace]) -> dict[int, str]:
    """The script's names of its modules and optimizers (``model``, ``opt``), by id."""
    Module, Optimizer = torch.nn.Module, torch.optim.Optimizer
    var_names: dict[int, str] = {}
    for entry in namespaces:
        if len(entry) == 3:  # a library frame's locals: they do not name modules
            continue
        for key, value in list(entry[1].items()):
            if isinstance(value, (Module, Optimizer)) and not key.startswith("_"):
                var_names.setdefault(id(value), key)
    return var_names


def _root_modules(modules: list[Any], var_names: dict[int, str]) -> list[Any]:
    """Modules that are nobody's child, those the script names first."""
    children = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in children]
    roots.sort(key=lambda m: id(m) not in var_names)
    return roots


def _name_modules(walk: Walk, roots: list[Any], var_names: dict[int, str]) -> dict[int, str]:
    """Name parameters (every name of a tied weight), their ``.grad`` and buffers by
    module path; returns each parameter's first name, by id."""
    param_names: dict[int, str] = {}
    used: dict[str, int] = {}
    for root in roots:
        base = var_names.get(id(root)) or type(root).__name__
        used[base] = used.get(base, 0) + 1
        if used[base] > 1:
            base = f"{base}#{used[base]}"
        for pname, p in root.named_parameters(remove_duplicate=False):
            full = unwrapped(f"{base}.{pname}")
            walk.name(p, full, "parameter")
            param_names.setdefault(id(p), full)
            if p.grad is not None:
                walk.name(p.grad, f"{full}.grad", "gradient")
        for bname, b in root.named_buffers(remove_duplicate=False):
            walk.name(b, unwrapped(f"{base}.{bname}"), "buffer")
    return param_names


def _name_optimizer_state(
    walk: Walk,
    torch: Any,
    optimizers: list[Any],
    var_names: dict[int, str],
    param_names: dict[int, str],
) -> None:
    """Name optimizer state after its parameter (``Adam.state[fc.weight].exp_avg``)."""
    per_class: dict[type, int] = {}
    for opt in optimizers:
        per_class[type(opt)] = per_class.get(type(opt), 0) + 1
    for i, opt in enumerate(optimizers):
        oname = type(opt).__name__
        if per_class[type(opt)] > 1:  # two Adams: tell them apart by variable or order
            oname = f"{oname}[{var_names.get(id(opt)) or i}]"
        for p, state in list(opt.state.items()):
            pname = param_names.get(id(p)) or label_of(p)
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor):
                    walk.name(value, f"{oname}.state[{pname}].{key}", "optimizer_state")


def _name_namespaces(
    walk: Walk, namespaces: list[Namespace], roots: list[Any], var_names: dict[int, str]
) -> None:
    """The script's variables, then tensors in flight in library frames (a module's
    forward, an optimizer's step), named after the object that runs them."""
    for entry in namespaces:
        if len(entry) == 2:
            walk.name_namespace(entry[0], entry[1])
    paths = {id(m): path for root in roots for path, m in module_paths(root, var_names)}
    for entry in namespaces:
        if len(entry) == 3:
            prefix, ns, owner = entry
            if owner is not None:
                owner_name = paths.get(id(owner)) or type(owner).__name__
                prefix = f"{owner_name}.{prefix}"
            walk.name_namespace(prefix, ns, depth=1)


def _graph_roots(walk: Walk, tensors: list[Any]) -> list[tuple[Any, str]]:
    """Each tensor with an autograd graph, with the name its saved tensors take."""
    names = walk.names
    with_graph = [t for t in tensors if t.grad_fn is not None]
    roots = [(t, names[id(t)][0][0]) for t in with_graph if id(t) in names]
    roots += [(t, label_of(t)) for t in with_graph if id(t) not in names]
    return roots


def _add_tensors(walk: Walk, tensors: list[Any], graph_ids: set[int]) -> None:
    """Every tensor into its storage, named first so that their names win."""
    names = walk.names
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
                walk.add(t, name, kind, True, all_names)
            else:
                kind = "activation" if id(t) in graph_ids else "plain"
                walk.add(t, label_of(t), kind, False, ())
        except Exception as exc:  # a tensor subclass torch cannot size: listed, never fatal
            walk.skip_failed(t, exc)


def _add_saved(walk: Walk, torch: Any, saved: list[tuple[Any, str]]) -> None:
    """Saved tensors come back from the graph as new Python objects over the same storage:
    name the storage's unnamed tensors after the graph, and add only unseen storages."""
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


def _name_by_referrers(
    walk: Walk, tensors: list[Any], modules: list[Any], optimizers: list[Any]
) -> None:
    """A bounded referrer walk for the largest tensors that still have no name."""
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
