"""Whether a run reached an evaluation pass: module forwards made with grad disabled.

A batch size tuned on training steps alone can fail later in evaluation (Lightning #8028,
transformers #46809): a tuning trial counts the forwards it sees under ``no_grad`` or
``inference_mode``, so that the search can say whether its peaks include one.
"""

from __future__ import annotations

from typing import Any


class EvalWatch:
    """Counts module forwards with grad disabled, from :meth:`start` to :meth:`stop`."""

    def __init__(self) -> None:
        self.forwards = 0
        self._handle: Any = None

    def start(self) -> bool:
        """Install the global forward hook; False where torch is not installed."""
        try:
            import torch
            from torch.nn.modules.module import register_module_forward_pre_hook
        except ImportError:
            return False
        grad_enabled = torch.is_grad_enabled

        def seen(module: Any, args: Any) -> None:
            if not grad_enabled():
                self.forwards += 1

        self._handle = register_module_forward_pre_hook(seen)
        return True

    def stop(self) -> None:
        """Remove the hook."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
