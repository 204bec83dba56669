"""Helpers shared by test modules (imported from here, never from another test module)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from functools import cache
from typing import Any

import jsonschema
import psutil

from torchmem.resources import path as resource_path


@cache
def _summary_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(resource_path("summary.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_summary(data: dict[str, Any]) -> dict[str, Any]:
    """Fail unless ``data`` follows resources/summary.schema.json; returns it."""
    errors = sorted(_summary_validator().iter_errors(data), key=lambda e: list(e.path))
    assert not errors, "summary breaks its schema:\n" + "\n".join(
        f"  {'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in errors
    )
    return data


def census_of(named: dict[str, list[int]], step: int) -> Any:
    """A census with storages of the given names and sizes, at fresh addresses each step
    (as a script's reallocated tensors have)."""
    from torchmem.tensors.model import Census, StorageInfo, TensorInfo

    storages, address = {}, 4096 * (step * 1000 + 1)
    for name, sizes in named.items():
        for nbytes in sizes:
            key = ("cpu", address)
            address += 4096
            tensor = TensorInfo(
                name=name, kind="plain", shape=(nbytes,), stride=(1,), storage_offset=0,
                dtype="uint8", device="cpu", numel=nbytes, element_size=1, span_bytes=nbytes,
                is_view=False, is_contiguous=True, requires_grad=False, is_leaf=True,
                grad_fn="", pinned=False, storage_key=key,
            )  # fmt: skip
            storages[key] = StorageInfo(key, nbytes, [tensor])
    return Census(storages, [], 0.01, step)


def end_process_tree(proc: subprocess.Popen, sig: int = signal.SIGINT, grace: float = 60) -> None:
    """Ask ``proc`` to end with ``sig`` (Ctrl+C, as a user would); after ``grace`` seconds
    kill it and everything under it. Never waits without a limit: a descendant left alive
    would hold ``proc``'s pipes open, and a read to their end would hang the test worker."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.communicate(timeout=grace)
        return
    except subprocess.TimeoutExpired:
        # Not an error of the test's (it ends the run either way), but the sign of a run
        # that no longer stops on Ctrl+C: say so where the test's output is kept.
        sys.stderr.write(f"end_process_tree: {proc.args!r} ignored signal {sig} for {grace} s\n")
    for p in [psutil.Process(proc.pid), *tree] if proc.poll() is None else tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


def holder_text(qtbot: Any, window: Any, tensor: Any) -> str:
    """What the Tensors panel's details say keeps ``tensor`` alive, once the process that
    owns it has answered (asked in the command thread: the dialog opens at once)."""
    dialog = window.tensors.open_details(tensor)
    qtbot.waitUntil(
        lambda: "What keeps it alive (nearest first)" in dialog.text.toPlainText(),
        timeout=30_000,
    )
    text = dialog.text.toPlainText().partition("alive (nearest first)")[2]
    dialog.close()
    return text


def run_tune(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``torchmem tune ARGS`` as a user types it, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "torchmem", "tune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
