"""A script's first training step under FakeTensorMode: its tensor bytes at their peak,
per batch size, with nothing allocated.

Run by :mod:`torchmem.tuning.predict` in a child process of its own (never in the
user's process: it patches torch for the duration)::

    python -m torchmem.tuning.fake_step --out F --batch-arg=--batch-size --min 1 \\
        --max 4096 --until BYTES train.py [ARGS...]

Sizes go up eightfold from ``--min`` until the step's tensors alone pass ``--until`` (the
search's limit) or ``--max`` is reached, so that the points span the size the search
will predict, where the model must be right; one more size between the top two narrows
the span of the model's chord (:func:`torchmem.tuning.model.fit_exact`).

Under ``FakeTensorMode`` every tensor has a shape, a dtype and a storage size but no
data, so a forward and backward at batch 4096 take as long as at batch 1 and cost no
memory. A dispatch mode above it counts each storage an operator creates, once (views
share theirs), and takes it off when the storage dies: the live bytes, and their peak.
The step ends when the first backward returns: by then the activations, the part that
grows with the batch, have peaked. What does not grow with the batch (the interpreter,
the optimizer's state) is taken from a real trial by the caller.

Fake tensors have no values. A value read before the first backward (``.item()`` of a
count, as Hugging Face's ``Trainer`` does for ``num_items_in_batch``; a logged loss;
``if loss > x``) is given a stand-in: 1 for integers, 1.0 for floats, False for a
boolean (the "is it NaN?" checks let the step go on), and each one is written out as a
caveat, since the prediction holds only where the step's memory does not depend on it.
An operator whose output shape depends on values (``nonzero``, boolean masks) or that
has no fake implementation cannot be predicted; the error is written out, said in one
line, and the search falls back to probes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from torchmem.probe.collector import collector_paused
from torchmem.probe.parent_watch import ParentWatch
from torchmem.probe.runner import EXIT_STOPPED
from torchmem.tuning.trial import substitute

#: Each fake size is this many times the one before.
GROWTH = 8


class StepEnded(BaseException):
    """Raised when the first backward returns: the step's peak is known."""


class PredictionFailed(Exception):
    """The script cannot run under FakeTensorMode; the message says why, for a user."""


def _live_bytes_mode() -> Any:
    """A TorchDispatchMode counting the bytes of live storages, and their peak."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    scalar = torch.ops.aten._local_scalar_dense.default

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0
            self._seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
            #: Stand-in values given to reads of a tensor's value: (dtype, value) -> count.
            self.stand_ins: dict[tuple[str, Any], int] = {}

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func is scalar:  # .item(): a fake tensor has no value to give
                dtype = args[0].dtype
                value: Any = (
                    False
                    if dtype == torch.bool
                    else 1.0
                    if dtype.is_floating_point or dtype.is_complex
                    else 1
                )
                key = (str(dtype).removeprefix("torch."), value)
                self.stand_ins[key] = self.stand_ins.get(key, 0) + 1
                return value
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    if storage not in self._seen:
                        n = storage.nbytes()
                        self._seen[storage] = n
                        self.live += n
                        weakref.finalize(storage, self._free, n)
                        self.peak = max(self.peak, self.live)
            return out

        def _free(self, n: int) -> None:
            self.live -= n

    return LiveBytes()


def _on_the_cpu_mode() -> Any:
    """A TorchFunctionMode that keeps every tensor of the fake step on the CPU.

    A fake step counts bytes, which do not depend on the device, and fake tensors cannot
    move between devices: torch swaps a module's parameters for their moved copies, and
    the swap of fake tensors fails ("Couldn't swap Linear.weight", seen on an H200), so a
    model stayed on the CPU while the script built its batches on ``cuda`` and the first
    forward failed ("found two different devices cuda:0, cpu"): no CUDA script could be
    predicted. Here a ``device=`` of a factory becomes the CPU, ``Tensor.to`` keeps only
    its dtype, and ``Tensor.cuda``/``pin_memory`` return the tensor. That also lets a
    CUDA script be predicted on a machine without CUDA. ``copy.deepcopy`` of a tensor
    becomes a clone (a fake storage cannot be deep-copied).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    same = {
        torch.Tensor.cuda,
        torch.Tensor.pin_memory,
        *(getattr(torch.Tensor, name) for name in ("xpu", "mps") if hasattr(torch.Tensor, name)),
    }

    deepcopy = torch.Tensor.__deepcopy__

    def _fake_copy(tensor: Any, memo: dict[int, Any] | None) -> Any:
        # copy.deepcopy of a fake tensor clones its storage onto "meta", which torch
        # refuses; Lightning's self.log deep-copies a metric's default state. A fake
        # clone has the same shape, dtype and bytes, which is all the count needs.
        copied = tensor.detach().clone().requires_grad_(tensor.requires_grad)
        if memo is not None:
            memo[id(tensor)] = copied
        return copied

    class OnTheCpu(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if func in same:
                return args[0]
            if func is deepcopy:
                return _fake_copy(args[0], args[1] if len(args) > 1 else None)
            if func is torch.Tensor.to:
                tensor = args[0]
                _device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(
                    *args[1:], **kwargs
                )
                return func(
                    tensor,
                    "cpu",
                    dtype or tensor.dtype,
                    non_blocking=bool(non_blocking),
                    copy=bool(kwargs.get("copy", False)),
                    memory_format=memory_format or torch.preserve_format,
                )
            if kwargs.get("device") is not None:
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    return OnTheCpu()


def _patch_module_to() -> dict[str, Any]:
    """``Module.to``, ``Module.cuda`` and ``Module.cpu`` under FakeTensorMode: a no-op
    unless the dtype changes. Returns the originals by name, to put back.

    torch swaps fake parameters for their converted copies, which fails when the copy is
    the parameter itself ("Couldn't swap Conv2d.weight"): with every tensor kept on the
    CPU (:func:`_on_the_cpu_mode`), any move is such a no-op, so it is skipped; a dtype
    change still runs. ``cpu`` too: Lightning's teardown moves the model back to the CPU
    while the step's end unwinds, and the failed swap then replaced :class:`StepEnded`."""
    import torch

    module = torch.nn.Module
    originals = {name: getattr(module, name) for name in ("to", "cuda", "cpu")}
    original_to = originals["to"]

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        _device, dtype, _blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        floats = [p for p in self.parameters() if p.is_floating_point()]
        if dtype is None or all(p.dtype == dtype for p in floats):
            return self
        return original_to(self, *args, **kwargs)

    def stays(self: Any, device: Any = None) -> Any:
        return self

    module.to = to  # type: ignore[method-assign]
    module.cuda = module.cpu = stays  # type: ignore[method-assign]
    return originals


def one_step(script: str, argv: list[str], caveats: list[str] | None = None) -> int:
    """Peak live tensor bytes of ``script``'s first step, run with ``argv``, under
    FakeTensorMode; PredictionFailed with the reason when it cannot run. Each stand-in
    value the step was given is added to ``caveats`` (once)."""
    import torch
    import torch.autograd
    from torch._subclasses.fake_tensor import FakeTensorMode

    counter = _live_bytes_mode()
    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        original_backward(*args, **kwargs)
        raise StepEnded()

    torch.autograd.backward = backward
    module_moves = _patch_module_to()
    saved_argv = sys.argv
    sys.argv = [script, *argv]
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), counter, _on_the_cpu_mode():
            runpy.run_path(script, run_name="__main__")
    except StepEnded:
        for (dtype, value), count in counter.stand_ins.items():
            said = (
                f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} value read before backward "
                f"(.item()) was given {value!r} "
                f"({count} time{'s' * (count > 1)} a step): the step's memory must not "
                "depend on it"
            )
            if caveats is not None and said.split(" (")[0] not in " ".join(caveats):
                caveats.append(said)
        return int(counter.peak)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        raise PredictionFailed(
            f"the script exited (code {code}) before its first backward"
            + (": check its arguments" if code == 2 else "")
        ) from None
    except Exception as exc:  # the script's own error, under fake tensors
        raise PredictionFailed(why_not(exc)) from None
    finally:
        sys.argv = saved_argv
        torch.autograd.backward = original_backward
        for name, original in module_moves.items():
            setattr(torch.nn.Module, name, original)
    raise PredictionFailed("the script ended without a backward pass: no training step to predict")


def why_not(exc: BaseException) -> str:
    """Why FakeTensorMode could not run the step, for a user."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    if name == "DynamicOutputShapeException":
        return (
            "an operator's output shape depends on tensor values before the first backward "
            f"(a boolean mask, nonzero: {text}); fake tensors have no values"
        )
    if name == "DataDependentOutputException" or "_local_scalar_dense" in text:
        return (
            "the step reads a tensor's value before its first backward (a data-dependent "
            f"operator: {text}); fake tensors have no values"
        )
    if name == "UnsupportedOperatorException":
        return f"an operator has no FakeTensorMode implementation ({text})"
    return f"{name}: {text[:300]}"


def main(argv: list[str] | None = None) -> None:
    """Run the step at growing sizes; write ``{"points": [[b, peak], ...], "error": ...}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-arg", required=True)
    parser.add_argument("--min", type=int, required=True, help="the first batch size")
    parser.add_argument("--max", type=int, required=True, help="the largest batch size")
    parser.add_argument("--until", type=int, required=True, help="stop past these bytes")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    # Ends with the search that started it, whatever ended that (a closed window).
    ParentWatch.from_environment(lambda: os._exit(EXIT_STOPPED))
    with collector_paused():  # torch, and torch._dynamo that FakeTensorMode imports
        import torch._dynamo  # noqa: F401
    script = str(Path(opts.script).resolve())
    sys.path.insert(0, os.path.dirname(script))  # as `python train.py` would
    started = time.monotonic()
    points: list[list[int]] = []
    caveats: list[str] = []
    error = None
    size = opts.min
    while True:
        try:
            peak = one_step(script, substitute(opts.args, opts.batch_arg, size), caveats)
        except PredictionFailed as exc:
            error = str(exc)
            break
        points.append([size, peak])
        if peak >= opts.until or size >= opts.max:
            break
        size = min(size * GROWTH, opts.max)
    if error is None and len(points) >= 3:
        # One more size in the top eightfold step, where the answer lies: the model is the
        # chord through the top two points (model.fit_exact), above the peaks' upward bends
        # between them, and a chord over a shorter span overstates less (the MLP of issue
        # 30: 2% at batch 3000 instead of 5%).
        low, high = points[-2][0], points[-1][0]
        middle = round(math.sqrt(low * high))
        if low < middle < high:
            try:
                peak = one_step(script, substitute(opts.args, opts.batch_arg, middle), caveats)
                points.insert(-1, [middle, peak])
            except PredictionFailed:
                pass  # the eightfold points stand, their chord a looser bound
    result = {
        "points": points,
        "error": error,
        "caveats": caveats,
        "seconds": round(time.monotonic() - started, 3),
    }
    Path(opts.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
