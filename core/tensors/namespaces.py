"""Which variables name the tensors: the running script's globals and its frames' locals."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torchmem.tensors.referrers import own_frame

Namespace = tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], Any]


def script_namespaces(
    thread_ident: int | None = None, script: str | None = None
) -> list[Namespace]:
    """Variables of the running script: its globals, and the locals of its thread's frames.

    ``thread_ident`` is the script's thread (the caller's by default); frames whose code
    lies in ``script``'s folder, or in a ``__main__`` module, are the script's own and name
    tensors plainly (``batch``). Frames of library code name the tensors in flight after
    the object that runs them: ``model.3.forward: input`` for a module (its path is
    resolved by the census), ``Adam.step: grad`` for an optimizer.
    """
    frame = (
        sys._current_frames().get(thread_ident) if thread_ident is not None else sys._getframe(1)
    )
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    try:
        return _frame_namespaces(frames, script)
    finally:
        # Called in the script's own thread, the list holds this very frame, and this
        # frame holds the list: a cycle that kept every frame of the step, and the
        # activations in their locals, alive until the next cyclic collection (a census
        # at a step boundary doubled a step function's peak).
        frames.clear()


def traceback_namespaces(tb: Any, script: str | None = None) -> list[Namespace]:
    """Variables of the frames an exception went through, innermost first: what an
    out-of-memory census names tensors by, taken before the traceback is let go."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    try:
        return _frame_namespaces(reversed(frames), script)
    finally:
        frames.clear()


def _frame_namespaces(frames: Iterable[Any], script: str | None) -> list[Namespace]:
    """The namespaces of ``frames`` (innermost first); see :func:`script_namespaces`."""
    folder = str(Path(script).resolve().parent) if script else None
    out: list[Namespace] = []
    seen: set[int] = set()
    for frame in frames:
        # runpy's frames hold the script's globals as run_globals: the script's own names
        # already say it ("big", not "_run_code: run_globals['big']").
        if own_frame(frame) or frame.f_globals.get("__name__") == "runpy":
            continue
        filename = frame.f_code.co_filename
        code = frame.f_code.co_name
        is_script = frame.f_globals.get("__name__") == "__main__" or (
            folder is not None and filename.startswith(folder)
        )
        if is_script:
            if id(frame.f_globals) not in seen:
                seen.add(id(frame.f_globals))
                out.append(("", frame.f_globals))
            if code != "<module>":
                out.insert(0, ("", dict(frame.f_locals)))
        elif code not in ("<module>", "_call_impl", "_wrapped_call_impl"):
            local_vars = dict(frame.f_locals)
            owner = local_vars.pop("self", None)
            out.append((f"{code}: ", local_vars, owner))
    return out
