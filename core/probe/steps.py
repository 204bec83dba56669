"""Step boundaries without code changes, user marks, and the cooperative stop.

A step ends when an optimizer steps (PyTorch's global optimizer-step hook). Scripts that
update parameters by hand never call an optimizer, so until one steps, each backward call
ends a step. With several optimizers (a GAN), only the first one that stepped counts, so
one training iteration is one step. The tracker is also where a requested stop is raised,
inside the script's own thread, at its next step, backward, mark or module forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchmem.events import Marker, MarkerKind
from torchmem.probe.leave_together import leave_with_the_other_ranks

_mark_sinks: list[Callable[[str], None]] = []
_installed: list[StepTracker] = []


def current_tracker() -> StepTracker | None:
    """The tracker of the run in progress in this process, or None outside a run."""
    return _installed[-1] if _installed else None


def mark(label: str) -> None:
    """Put a named marker on the traces (``torchmem.mark("epoch 2")``).

    Labels starting with "epoch" are drawn as epoch markers. Outside torchmem this is a
    no-op, so scripts can call it unconditionally.
    """
    for sink in list(_mark_sinks):
        sink(str(label))


class ScriptStopped(BaseException):
    """Raised in the script's thread to stop it; a BaseException so ``except Exception``
    in user code does not swallow it."""


class StepLimitReached(SystemExit):
    """Ends a run with exit code 0 after its last allowed step (``torchmem run
    --max-steps N``, a script or each process of a COMMAND): a SystemExit, so a served
    interpreter exits as if the script had returned, running its ``finally`` blocks and
    exit handlers, and a run in this process ends finished. Each rank of a job first
    waits for the others to reach their limit too (leave_together.py)."""


class StepTracker:
    """Installs global hooks for one run and turns them into step and user markers."""

    def __init__(self, emit: Callable[[Marker], None], now: Callable[[], float]) -> None:
        self.emit = emit
        self.now = now
        self.steps = 0
        self._primary_optimizer: int | None = None
        self._last_from_backward = False
        self._handles: list[Any] = []
        self._orig_backward: Callable[..., Any] | None = None
        self._stop_requested = threading.Event()
        self._target_thread: int | None = None
        #: Exit (:class:`StepLimitReached`) once this many steps are made; None: never.
        self.limit: int | None = None

    # -- install / uninstall -------------------------------------------------------------
    def install(self, thread_ident: int | None = None) -> None:
        """Hook torch (if importable) and ``torchmem.mark`` for the run in ``thread_ident``."""
        self._target_thread = thread_ident if thread_ident is not None else threading.get_ident()
        _mark_sinks.append(self._on_mark)
        _installed.append(self)
        try:
            import torch
            import torch.autograd
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            return
        self._handles.append(register_optimizer_step_post_hook(self._on_optimizer_step))
        self._orig_backward = torch.autograd.backward
        original = self._orig_backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self._on_backward()
            return result

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        torch.autograd.backward = backward

    def uninstall(self) -> None:
        """Remove every hook this tracker installed."""
        if self._on_mark in _mark_sinks:
            _mark_sinks.remove(self._on_mark)
        if self in _installed:
            _installed.remove(self)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._orig_backward is not None:
            import torch.autograd

            torch.autograd.backward = self._orig_backward
            self._orig_backward = None

    # -- hooks ---------------------------------------------------------------------------
    def _step(self) -> None:
        self.steps += 1
        self.emit(Marker(self.now(), MarkerKind.STEP, f"step {self.steps}", self.steps))
        if (
            self.limit is not None
            and self.steps >= self.limit
            and threading.get_ident() == self._target_thread
        ):
            leave_with_the_other_ranks(self.limit)
            raise StepLimitReached(0)
        self.check_stop()

    def end_step(self) -> None:
        """End a step now: for code that makes its steps with neither an optimizer nor a
        backward call (``torchmem.tune``'s driver calling an inference function)."""
        self._step()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
            if self._last_from_backward:
                # The backward just before this first step already ended this iteration.
                self._last_from_backward = False
                self.check_stop()
                return
        if id(optimizer) == self._primary_optimizer:
            self._step()

    def _on_backward(self) -> None:
        if self._primary_optimizer is None:
            self._step()
            self._last_from_backward = True
        else:
            self.check_stop()

    def _on_mark(self, label: str) -> None:
        kind = MarkerKind.of_label(label)
        self.emit(Marker(self.now(), kind, label, self.steps))
        self.check_stop()

    # -- cooperative stop ------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the script to stop at its next step, backward, mark or module forward."""
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
        except ImportError:
            return
        # Installed only now: a global forward hook slows every module call.
        self._handles.append(register_module_forward_pre_hook(lambda *_: self.check_stop()))

    def check_stop(self) -> None:
        """Raise :class:`ScriptStopped` if a stop was requested and we are the script."""
        if self._stop_requested.is_set() and threading.get_ident() == self._target_thread:
            raise ScriptStopped(f"stopped by the user at step {self.steps}")
