"""What keeps a tensor alive: the chain of objects that refer to it, nearest first.

The census names tensors it found nowhere else by the container that holds them; the
Tensors panel asks, for one tensor, which objects hold it. The same lookup serves a tensor
of this process and one of an attached process (its agent runs it there).
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable, Iterator
from itertools import compress
from pathlib import Path
from typing import Any

from torchmem.tensors.model import TensorInfo

_CORE_DIR = Path(__file__).resolve().parent.parent  # torchmem/, above tensors/
# torchmem's own code (core, and gui beside it in a checkout) is never a holder of tensors.
_OWN_DIRS = (str(_CORE_DIR) + "/", str(_CORE_DIR.parent / "gui") + "/")


def _describe_referrer(ref: Any, t: Any) -> str | None:
    """How a container holds ``t``, e.g. ``list[3] (of 12)`` or ``Trainer.cache``."""
    if isinstance(ref, list):
        for i, v in enumerate(ref):
            if v is t:
                return f"item {i} of a list of {len(ref)}"
    elif isinstance(ref, tuple):
        return f"item of a tuple of {len(ref)}"
    elif isinstance(ref, dict):
        for k, v in ref.items():
            if v is t:
                # A class body's namespace knows its class through its descriptors.
                owner = getattr(ref.get("__dict__") or ref.get("__weakref__"), "__objclass__", None)
                if owner is not None and "__module__" in ref:
                    return f"class attribute {owner.__qualname__}.{k}"
                return f"value of key {k!r} in a dict of {len(ref)}"
    elif isinstance(ref, types.CellType):
        fn = _closure_owner(ref)
        return f"captured by closure {fn.__qualname__}()" if fn else "a closure variable"
    elif isinstance(ref, types.FrameType):
        return f"a local variable of {ref.f_code.co_name}()"
    elif isinstance(ref, (set, frozenset)):
        return f"item of a set of {len(ref)}"
    elif hasattr(ref, "__dict__"):
        try:
            for k, v in vars(ref).items():
                if v is t:
                    return f"attribute {type(ref).__name__}.{k}"
        except TypeError:
            return None
    return None


def own_frame(frame: types.FrameType) -> bool:
    """True for a frame of torchmem's own code (never a holder of the user's tensors)."""
    return frame.f_code.co_filename.startswith(_OWN_DIRS)


def referrer_chain(t: Any, depth: int = 4, exclude: Iterable[int] = ()) -> list[str]:
    """What keeps ``t`` alive: one line per hop, nearest first (at most ``depth`` hops),
    ending at a global of the script, a closure, a local variable or an object nothing
    names.

    Of several holders, the one that says most is followed (:func:`_holder_rank`): an
    attribute before a dict inside an object (a module's ``_parameters``), before a list
    (an optimizer's parameter group), before a closure or a frame. Frames and closures of
    torchmem itself (the caller asking) are not holders, nor a cell whose function is gone.
    """
    skip = set(exclude)
    chain: list[str] = []
    target = t
    for _ in range(depth):
        refs = [
            r
            for r in gc.get_referrers(target)
            if id(r) not in skip and not (isinstance(r, types.FrameType) and own_frame(r))
        ]
        skip.add(id(refs))
        ranked = sorted(
            (rank, i) for i, r in enumerate(refs) if (rank := _holder_rank(r, target)) is not None
        )
        if not chain and (not ranked or ranked[0][0] >= _FRAME):
            # A .grad is held in C by its parameter, where no referrer shows it.
            grad_of = _grad_owner(target)
            if grad_of is not None:
                chain.append("the .grad of a parameter")
                target = grad_of
                continue
        if not ranked:
            break
        ref = refs[ranked[0][1]]
        refs.clear()
        if isinstance(ref, types.CellType):
            fn = _closure_owner(ref)
            chain.append(f"captured by closure {fn.__qualname__}()" if fn else "a closure cell")
            break
        if isinstance(ref, dict) and any(v is target for v in list(ref.values())):
            if ref.get("__name__") == "__main__":
                chain.append(f"global {_key_of(ref, target)} of the script")
                break
            owner = next(
                (o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref), None
            )
            if isinstance(owner, types.ModuleType):
                chain.append(f"global {_key_of(ref, target)} of module {owner.__name__}")
                break
            if owner is not None:
                chain.append(f"attribute {type(owner).__name__}.{_key_of(ref, target)}")
                target = owner
                continue
            held_by = _attribute_holding(ref)
            if held_by is not None:  # a module's _parameters, an optimizer's state
                obj, attr = held_by
                key = next((k for k, v in list(ref.items()) if v is target), "?")
                chain.append(f"{type(obj).__name__}.{attr}[{_key_text(key)}]")
                target = obj
                continue
        chain.append(_describe_referrer(ref, target) or f"a {type(ref).__name__}")
        if isinstance(ref, types.FrameType):
            break
        target = ref
    return chain


_FRAME = 4  # the rank of a frame: the last holder to follow


def _holder_rank(ref: Any, target: Any) -> int | None:
    """How much a holder of ``target`` tells, lower first; None for one that is no holder
    to show. A dict that holds it as a value names it; one keyed by it (an optimizer's
    state) says no more than a list."""
    if isinstance(ref, dict):
        return 0 if any(v is target for v in list(ref.values())) else 2
    if isinstance(ref, types.CellType):
        fn = _closure_owner(ref)
        if fn is None or fn.__code__.co_filename.startswith(_OWN_DIRS):
            return None  # a frame's own cell, or torchmem's: no closure of the user's
        return 3
    if isinstance(ref, types.FrameType):
        return _FRAME
    if isinstance(ref, (list, tuple, set, frozenset)):
        return 2
    return 1


def _attribute_holding(d: dict) -> tuple[Any, str] | None:
    """The object and attribute whose value ``d`` is (``Linear``, ``_parameters``)."""
    for holder in gc.get_referrers(d):
        if isinstance(holder, dict):
            owner = next(
                (o for o in gc.get_referrers(holder) if getattr(o, "__dict__", None) is holder),
                None,
            )
            if owner is not None:
                return owner, _key_of(holder, d)
    return None


def _grad_owner(t: Any) -> Any:
    """The parameter whose ``.grad`` is ``t`` (held in C, invisible to the referrer walk)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor):
        return None
    module = torch.nn.Module
    for obj in gc.get_objects():
        # type(), not isinstance(): a lazy module's __class__ can warn or import.
        if issubclass(type(obj), module):
            for p in obj._parameters.values():
                if p is not None and p.grad is t:
                    return p
    return None


def _closure_owner(cell: types.CellType) -> types.FunctionType | None:
    """The function whose ``__closure__`` holds ``cell``."""
    for holder in gc.get_referrers(cell):
        if isinstance(holder, tuple):
            for fn in gc.get_referrers(holder):
                if isinstance(fn, types.FunctionType) and fn.__closure__ is holder:
                    return fn
    return None


def _key_text(key: Any) -> str:
    """A dict key as code would write it: ``'weight'``, ``3``; a tensor key (an
    optimizer's state is keyed by parameter) by its type and shape, never its values."""
    if isinstance(key, (str, int, float, bool)) or key is None:
        return repr(key)
    shape = getattr(key, "shape", None)
    if shape is not None:
        return f"<{type(key).__name__} {list(shape)}>"
    return f"<{type(key).__name__}>"


def _key_of(d: dict, value: Any) -> str:
    return next((str(k) for k, v in d.items() if v is value), "?")


def _container_owners(containers: list[Any], exclude: set[int]) -> dict[int, tuple[str, bool]]:
    """Who owns each list or dict of ``containers`` that has an owner, by id: ``("C.x",
    True)`` for an attribute of an object of class C, ``(" captured by closure f()",
    False)`` for a closure's variable; at most two scans of the heap for all.

    An object's attributes live in its ``__dict__`` once anything has asked for it (the
    census's own namespace walk does): the heap then shows that dict as the holder, and
    the object is found by a second scan, for all such dicts at once.
    """
    wanted = {id(c) for c in containers}
    owners: dict[int, tuple[str, bool]] = {}
    attr_dicts: list[dict] = []
    for holder in gc.get_referrers(*containers):
        if id(holder) in exclude or isinstance(holder, types.FrameType):
            continue
        if isinstance(holder, types.CellType):
            held = getattr(holder, "cell_contents", None)
            if id(held) in wanted and id(held) not in owners:
                fn = _closure_owner(holder)
                if fn is not None:
                    owners[id(held)] = (f" captured by closure {fn.__qualname__}()", False)
        elif isinstance(holder, dict):
            if any(map(wanted.__contains__, map(id, list(holder.values())))):
                attr_dicts.append(holder)
        elif hasattr(holder, "__dict__") and not isinstance(holder, type):
            try:
                _name_attributes(owners, wanted, type(holder).__name__, vars(holder))
            except TypeError:
                continue
    if attr_dicts:
        by_dict = {id(d): d for d in attr_dicts}
        for obj in gc.get_referrers(*attr_dicts):
            if isinstance(obj, (type, types.ModuleType)) or id(obj) in exclude:
                continue
            d = getattr(obj, "__dict__", None)
            if id(d) in by_dict and by_dict[id(d)] is d:
                _name_attributes(owners, wanted, type(obj).__name__, d)
    return owners


def _name_attributes(
    owners: dict[int, tuple[str, bool]], wanted: set[int], cls: str, attrs: dict
) -> None:
    for key, value in list(attrs.items()):
        if id(value) in wanted and id(value) not in owners:
            owners[id(value)] = (f"{cls}.{key}", True)


def name_by_referrers(infos: dict[int, TensorInfo], unnamed: list[Any], exclude: set[int]) -> None:
    """Name ``unnamed`` tensors by the container that holds them (one gc scan for all, and
    at most two more for the owners of the lists and dicts among them).

    Every unnamed tensor a found container holds is named, not only ``unnamed``: a list of
    100,000 activations is named in one pass over it (positions and keys are read once per
    container, never searched for per tensor).
    """
    if not unnamed:
        return
    exclude = exclude | {id(infos), id(sys._getframe())}
    found: list[tuple[TensorInfo, str, str, Any]] = []
    containers: dict[int, Any] = {}
    refs = gc.get_referrers(*unnamed)
    exclude.add(id(refs))
    for ref in refs:
        if id(ref) in exclude or isinstance(ref, types.FrameType):
            continue
        for info, where, item in _unnamed_held(ref, infos):
            info.named = True  # the first container that holds a tensor names it
            found.append((info, where, item, ref))
            if isinstance(ref, (list, dict)):
                containers[id(ref)] = ref
    refs.clear()
    owners: dict[int, tuple[str, bool]] = {}
    if containers:
        held = list(containers.values())
        owners = _container_owners(held, exclude | {id(found), id(containers), id(held)})
        held.clear()
    for info, where, item, ref in found:
        owner, is_attribute = owners.get(id(ref), ("", False))
        if is_attribute:  # a path, as the script's variables are named: Cache.batches[3]
            info.name = f"{owner}{item}"
        else:  # how it is held, then what it is: item 3 of a list of 40: float32 [3]
            info.name = f"{where}{owner}: {info.name}"


def _unnamed_held(ref: Any, infos: dict[int, TensorInfo]) -> Iterator[tuple[TensorInfo, str, str]]:
    """Each tensor of ``infos`` still unnamed that ``ref`` holds, with how it holds it in
    words and, for a list or dict, its index (``[3]``, ``['key']``).

    Lists and dicts are read in one pass (which items are tensors of the census is found
    in C); describing each item by searching the container for it was quadratic: 66,666
    tensors in one list took 80 s.
    """
    if isinstance(ref, list):
        items = list(ref)  # in C: another thread may change the list meanwhile
        n = len(items)
        for i in compress(range(n), map(infos.__contains__, map(id, items))):
            info = infos[id(items[i])]
            if not info.named:
                yield info, f"item {i} of a list of {n}", f"[{i}]"
    elif isinstance(ref, dict):
        keys, values = list(ref), list(ref.values())
        if len(keys) != len(values):  # changed between the two copies: skip this time
            return
        hits = list(compress(range(len(keys)), map(infos.__contains__, map(id, values))))
        if not hits:
            return
        # A class body's namespace knows its class through its descriptors.
        owner = getattr(ref.get("__dict__") or ref.get("__weakref__"), "__objclass__", None)
        owner = owner if owner is not None and "__module__" in ref else None
        for i in hits:
            k, info = keys[i], infos[id(values[i])]
            if not info.named:
                if owner is not None:
                    yield info, f"class attribute {owner.__qualname__}.{k}", ""
                else:
                    yield info, f"value of key {k!r} in a dict of {len(keys)}", f"[{k!r}]"
    else:  # tuples, sets and cells say the same of every item; objects have few attributes
        for held in gc.get_referents(ref):
            info = infos.get(id(held))
            if info is not None and not info.named:
                where = _describe_referrer(ref, held)
                if where:
                    yield info, where, ""


def referrers_of(tensor: TensorInfo) -> dict[str, Any]:
    """What keeps a tensor of a census alive, if it still is: ``{"alive", "chain",
    "grad_fn"}`` (the shape of an agent's ``referrers`` reply)."""
    alive = tensor.alive()
    if alive is None:
        return {"alive": False, "chain": [], "grad_fn": ""}
    try:
        chain = referrer_chain(alive)
        grad_fn = type(alive.grad_fn).__name__ if alive.grad_fn is not None else ""
    finally:
        del alive
    return {"alive": True, "chain": chain, "grad_fn": grad_fn}


def tensor_identity(args: dict[str, Any]) -> TensorInfo:
    """A census entry rebuilt from what a viewer sends to name a tensor (device, data_ptr,
    shape, stride, offset), enough for :meth:`TensorInfo.alive`; ValueError if malformed."""
    try:
        device = str(args["device"])
        return TensorInfo(
            name="",
            kind="plain",
            shape=tuple(int(n) for n in args["shape"]),
            stride=tuple(int(n) for n in args["stride"]),
            storage_offset=int(args["offset"]),
            dtype="",
            device=device,
            numel=0,
            element_size=0,
            span_bytes=0,
            is_view=False,
            is_contiguous=False,
            requires_grad=False,
            is_leaf=False,
            grad_fn="",
            pinned=False,
            storage_key=(device, int(args["data_ptr"])),
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError("referrers needs device, data_ptr, shape, stride and offset") from None
