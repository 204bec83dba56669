"""The memory lab's operations: what each one does, the inputs it needs, and why it costs
what it costs.

Tutorials state memory habits (``add_`` writes in place, a view shares its storage,
``.contiguous()`` of a transposed tensor copies) without measuring them; each operation
here carries that sentence, so the lab's table can say it beside the figure that proves
it. A user's own expression over ``a``, ``b`` and ``c`` is an operation too.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Names an expression may use besides its inputs.
EXPRESSION_NAMES = ("torch", "F", "checkpoint")
#: The inputs every expression gets: three n x n tensors.
EXPRESSION_INPUTS = ("a", "b", "c")
#: Iterations of the allocate-in-a-loop / reuse-with-fill_ pair.
LOOP = 10


class ExpressionError(ValueError):
    """A user expression that cannot run; the message says what to change."""


@dataclass(frozen=True)
class Operation:
    """One thing the lab measures."""

    name: str
    #: How it reads in code, e.g. ``a + b``.
    code: str
    #: Why it costs what it costs: one sentence, shown in the table.
    why: str
    #: ``(inputs) -> result``; the inputs are a dict of tensors by name.
    run: Callable[[dict[str, Any]], Any]
    #: The inputs it takes (n x n tensors of the row's dtype and device) ...
    inputs: tuple[str, ...] = ("a", "b")
    #: ... and those made on the CPU instead (what a host-to-device copy copies).
    host_inputs: tuple[str, ...] = ()
    #: Host inputs in pinned (page-locked) memory.
    pinned: bool = False
    #: Bytes read and written per element of one n x n input, for a bandwidth (None: no
    #: bandwidth is defined, e.g. a view that moves nothing).
    traffic: float | None = None
    #: FLOPs as a function of n (matmul), for FLOP/s.
    flops: Callable[[int], float] | None = None
    #: Needs an accelerator (a host-to-device copy).
    accelerator: bool = False
    #: Writes into its first input: cannot run on a leaf that requires grad.
    in_place: bool = False


def _loop_allocating(x: dict[str, Any]) -> Any:
    import torch

    out = None
    for _ in range(LOOP):
        out = torch.empty_like(x["a"])
        out.fill_(1.0)
    return out


def _loop_reusing(x: dict[str, Any]) -> Any:
    buf = x["a"]
    for _ in range(LOOP):
        buf.fill_(1.0)
    return buf


def _to_device(x: dict[str, Any]) -> Any:
    return x["h"].to(x["a"].device, non_blocking=x["h"].is_pinned())


BUILTIN: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("add", "a + b", "out of place: the result is a new tensor of its own, "
                  "as large as an input", lambda x: x["a"] + x["b"], traffic=3),
        Operation("mul", "a * b", "out of place, like add: one new tensor the size of an "
                  "input", lambda x: x["a"] * x["b"], traffic=3),
        Operation("add_", "a.add_(b)", "in place: writes into a, so nothing new is "
                  "allocated and the result is a itself", lambda x: x["a"].add_(x["b"]),
                  traffic=3, in_place=True),
        Operation("mul_", "a.mul_(b)", "in place, like add_: the result is a's own "
                  "storage", lambda x: x["a"].mul_(x["b"]), traffic=3, in_place=True),
        Operation("matmul", "a @ b", "a new n x n result; the product reads each input n "
                  "times, so it is bound by arithmetic, not memory",
                  lambda x: x["a"] @ x["b"], flops=lambda n: 2.0 * n**3),
        Operation("view", "a.view(-1)", "a view: new shape and strides over a's storage; "
                  "no byte is allocated or moved", lambda x: x["a"].view(-1), inputs=("a",)),
        Operation("reshape_t", "a.t().reshape(-1)", "a transposed tensor is not "
                  "contiguous, so reshape cannot return a view: it copies",
                  lambda x: x["a"].t().reshape(-1), inputs=("a",), traffic=2),
        Operation("clone", "a.clone()", "a copy that owns its storage, as large as a",
                  lambda x: x["a"].clone(), inputs=("a",), traffic=2),
        Operation("contiguous", "a.t().contiguous()", ".contiguous() of a transposed "
                  "tensor copies it into row-major order (of a contiguous one, it returns "
                  "the tensor itself)", lambda x: x["a"].t().contiguous(), inputs=("a",),
                  traffic=2),
        Operation("cat", "torch.cat([a, b])", "cat always copies: the result owns the "
                  "sum of its inputs", lambda x: __import__("torch").cat([x["a"], x["b"]]),
                  traffic=4),
        Operation("alloc_loop", f"{LOOP}x: x = torch.empty_like(a); x.fill_(1)",
                  f"a new tensor each iteration: {LOOP} allocations (the allocator may "
                  "reuse the freed block, but each one is a call)", _loop_allocating,
                  inputs=("a",), traffic=LOOP),
        Operation("reuse_fill", f"{LOOP}x: buf.fill_(1)", "one buffer allocated once and "
                  "filled in place: no allocation in the loop", _loop_reusing, inputs=("a",),
                  traffic=LOOP, in_place=True),
        Operation("to_pageable", "h.to(device)", "a copy from ordinary (pageable) host "
                  "memory: the driver stages it through a pinned buffer, a synchronous copy",
                  _to_device, inputs=("a",), host_inputs=("h",), traffic=1, accelerator=True),
        Operation("to_pinned", "h.pin_memory().to(device, non_blocking=True)", "a copy "
                  "from pinned host memory: DMA straight from it, asynchronous and usually "
                  "faster", _to_device, inputs=("a",), host_inputs=("h",), pinned=True,
                  traffic=1, accelerator=True),
    )
}  # fmt: skip


def expression(text: str) -> Operation:
    """An operation from a user's expression over ``a``, ``b``, ``c`` (n x n each),
    ``torch``, ``F`` (torch.nn.functional) and ``checkpoint``; ExpressionError saying
    what is wrong (not Python, an unknown name, a statement)."""
    source = text.strip()
    if not source:
        raise ExpressionError("the expression is empty: write e.g. a @ b.T + c")
    try:
        tree = ast.parse(source, "<expression>", mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise ExpressionError(f"not a Python expression{where}: {exc.msg}") from None
    allowed = set(EXPRESSION_INPUTS) | set(EXPRESSION_NAMES) | set(dir(builtins))
    bound = {  # names a lambda or comprehension inside the expression binds itself
        arg.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
        for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs)
    } | {
        n.id for node in ast.walk(tree) if isinstance(node, ast.comprehension)
        for n in ast.walk(node.target) if isinstance(n, ast.Name)
    }  # fmt: skip
    unknown = sorted(
        {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id not in allowed | bound
        }
    )
    if unknown:
        raise ExpressionError(
            f"unknown name{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: an "
            f"expression may use {', '.join(EXPRESSION_INPUTS)} (n x n tensors), torch, F "
            "and checkpoint"
        )
    code = compile(tree, "<expression>", "eval")
    used = tuple(n for n in EXPRESSION_INPUTS if any(
        isinstance(node, ast.Name) and node.id == n for node in ast.walk(tree)
    ))  # fmt: skip

    def run(x: dict[str, Any]) -> Any:
        import torch
        import torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint as _checkpoint

        def checkpoint(fn: Callable[..., Any], *args: Any) -> Any:
            return _checkpoint(fn, *args, use_reentrant=False)

        # One namespace, so that a lambda inside the expression sees the inputs too.
        names = {"__builtins__": builtins, "torch": torch, "F": F, "checkpoint": checkpoint}
        return eval(code, {**names, **x})

    return Operation(name=source, code=source, why="", run=run, inputs=used or ("a",), traffic=None)


def operation(name_or_expression: str) -> Operation:
    """A built-in operation by name, else the text as an expression."""
    return BUILTIN.get(name_or_expression.strip()) or expression(name_or_expression)
