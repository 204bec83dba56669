"""What keeps a tensor alive: the chain of objects that refer to it, nearest first.

The census names tensors it found nowhere else by the container that holds them; the
Tensors panel asks, for one tensor, which objects hold it. The same lookup serves a tensor
of this process and one of an attached process (its agent runs it there).
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
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
    """What keeps ``t`` alive: one line per hop, nearest first (at most ``depth`` hops).

    Frames of torchmem itself (the caller asking) are not counted as holders.
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
        if not refs:
            break
        refs.sort(key=lambda r: isinstance(r, types.FrameType))  # containers say more
        ref = refs[0]
        if isinstance(ref, types.CellType):
            fn = _closure_owner(ref)
            chain.append(f"captured by closure {fn.__qualname__}()" if fn else "a closure cell")
            break
        if isinstance(ref, dict):
            owner = next(
                (o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref), None
            )
            if owner is not None:
                chain.append(f"attribute {type(owner).__name__}.{_key_of(ref, target)}")
                target = owner
                continue
            if ref.get("__name__") == "__main__":
                chain.append(f"global {_key_of(ref, target)} of the script")
                break
        chain.append(_describe_referrer(ref, target) or f"a {type(ref).__name__}")
        if isinstance(ref, types.FrameType):
            break
        target = ref
    return chain


def _closure_owner(cell: types.CellType) -> types.FunctionType | None:
    """The function whose ``__closure__`` holds ``cell``."""
    for holder in gc.get_referrers(cell):
        if isinstance(holder, tuple):
            for fn in gc.get_referrers(holder):
                if isinstance(fn, types.FunctionType) and fn.__closure__ is holder:
                    return fn
    return None


def _key_of(d: dict, value: Any) -> str:
    return next((str(k) for k, v in d.items() if v is value), "?")


def _container_owner(container: Any, exclude: set[int]) -> str:
    """`` captured by closure f()`` or `` in attribute C.x`` for a list or dict, else ``""``."""
    for holder in gc.get_referrers(container):
        if id(holder) in exclude or isinstance(holder, types.FrameType):
            continue
        if isinstance(holder, types.CellType):
            fn = _closure_owner(holder)
            if fn is not None:
                return f" captured by closure {fn.__qualname__}()"
        elif hasattr(holder, "__dict__") and not isinstance(holder, type):
            try:
                for key, value in vars(holder).items():
                    if value is container:
                        return f" in attribute {type(holder).__name__}.{key}"
            except TypeError:
                continue
    return ""


def name_by_referrers(infos: dict[int, TensorInfo], unnamed: list[Any], exclude: set[int]) -> None:
    """Name ``unnamed`` tensors by the container that holds them (one gc scan for all)."""
    if not unnamed:
        return
    owners: dict[int, str] = {}
    exclude = exclude | {id(infos), id(sys._getframe()), id(owners)}
    for ref in gc.get_referrers(*unnamed):
        if id(ref) in exclude or isinstance(ref, types.FrameType):
            continue
        for held in gc.get_referents(ref):
            info = infos.get(id(held))
            if info is None or info.named:
                continue
            where = _describe_referrer(ref, held)
            if where:
                if isinstance(ref, (list, dict)):
                    owner = owners.get(id(ref))
                    if owner is None:  # one heap scan per container, not per tensor
                        owner = owners[id(ref)] = _container_owner(ref, exclude)
                    where += owner
                info.name = f"{where}: {info.name}"
                info.named = True


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
