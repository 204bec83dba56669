"""The memory lab: what each operation costs, measured, and every way to get it wrong."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import psutil
import pytest
import torch

from torchmem.lab.measure import Job, measure
from torchmem.lab.ops import ExpressionError, expression
from torchmem.lab.results import jobs_of
from torchmem.lab.runner import LabCancelled, run_lab

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow

N = 256
FLOAT32 = 4


def lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmem", "lab", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    ("op", "owns", "shares"),
    [
        ("add", FLOAT32 * N * N, False),
        ("mul", FLOAT32 * N * N, False),
        ("add_", 0, True),
        ("mul_", 0, True),
        ("view", 0, True),
        ("clone", FLOAT32 * N * N, False),
        ("contiguous", FLOAT32 * N * N, False),
        ("reshape_t", FLOAT32 * N * N, False),
        ("matmul", FLOAT32 * N * N, False),
        ("cat", 2 * FLOAT32 * N * N, False),
    ],
)
def test_each_operation_owns_what_it_allocates(op, owns, shares):
    row = measure(Job(op, N, repeats=2))
    assert not row.error and not row.skipped
    assert row.result_bytes == owns and row.shares_input_storage is shares
    # The peak holds at least the result; a view or an in-place op allocates nothing.
    assert row.peak_extra_bytes >= owns
    assert (row.allocations == 0) is (owns == 0)
    assert row.median_s > 0 and row.why


def test_the_loop_pair_shows_the_allocations_a_reused_buffer_saves():
    allocating = measure(Job("alloc_loop", N, repeats=2))
    reusing = measure(Job("reuse_fill", N, repeats=2))
    assert allocating.allocations == 10 and reusing.allocations == 0
    assert reusing.shares_input_storage and reusing.result_bytes == 0


def test_half_precision_halves_the_result():
    row = measure(Job("add", N, dtype="bfloat16", repeats=2))
    assert row.result_bytes == 2 * N * N


def test_what_autograd_saves_for_backward_depends_on_the_expression():
    plain = measure(Job("a * b", N, grad=True, repeats=2))
    sigmoid = measure(Job("torch.sigmoid(a) * b", N, grad=True, repeats=2))
    recomputed = measure(
        Job("checkpoint(lambda a, b: torch.sigmoid(a) * b, a, b)", N, grad=True, repeats=2)
    )
    assert plain.saved_bytes == 0 and sorted(plain.saved) == ["a (input)", "b (input)"]
    assert sigmoid.saved_bytes == FLOAT32 * N * N  # sigmoid's output, kept for its backward
    assert any("intermediate" in s for s in sigmoid.saved)
    assert recomputed.saved_bytes < sigmoid.saved_bytes  # checkpoint keeps only the inputs


def test_an_accelerator_copy_is_skipped_on_cpu_with_the_reason():
    row = measure(Job("to_pinned", N))
    assert row.skipped.startswith("needs an accelerator") and not row.error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a +", "not a Python expression"),
        ("a + q", "unknown name q"),
        ("", "empty"),
    ],
)
def test_a_bad_expression_is_refused_before_anything_runs(text, message):
    with pytest.raises(ExpressionError, match=message):
        expression(text)
    with pytest.raises(ValueError, match=message):
        jobs_of([text], [N], ["float32"], ["cpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_a_device_this_machine_lacks_is_a_row_that_says_so():
    row = measure(Job("add", 8, device="cuda:0"))
    assert row.error.startswith("no cuda device here (torch ") and "choose cpu" in row.error
    assert row.median_s is None, "nothing ran"


def test_a_shape_mismatch_is_a_row_with_its_error():
    row = measure(Job("a[:10] + b", N))
    assert "RuntimeError" in row.error and "size of tensor" in row.error


def test_each_row_runs_in_a_fresh_child_and_a_dying_one_costs_one_row():
    rows = run_lab(
        [
            Job("add", 64, repeats=1),
            Job("__import__('os').kill(__import__('os').getpid(), 9)", 64),
            Job("view", 64, repeats=1),
        ]
    )
    assert [r.op for r in rows][0::2] == ["add", "view"] and not rows[0].error
    assert "died (signal SIGKILL)" in rows[1].error
    assert rows[2].shares_input_storage


def test_a_cuda_row_is_measured_in_the_worker_not_in_a_forked_child(monkeypatch):
    # A child forked after the CUDA driver started fails its first CUDA call
    # ("initialization error"): every CUDA row of the lab did, on an H200.
    import torch

    from torchmem.lab import worker

    forks, cleared, measured = [], [], []
    monkeypatch.setattr(worker, "measure_in_child", lambda job: forks.append(job.device) or {})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cleared.append(1))

    def fake_measure(job):
        measured.append(job.device)
        row = measure(Job(job.op, job.size, repeats=1))
        row.device = job.device
        return row

    monkeypatch.setattr(worker, "measure", fake_measure)
    row = worker.answer(Job("add", 64, device="cuda:0"))
    assert forks == [] and measured == ["cuda:0"] and row["device"] == "cuda:0"
    assert cleared == [1], "the lab must hand its cached blocks back to the device"
    worker.answer(Job("add", 64, repeats=1))
    assert forks == ["cpu"] and measured == ["cuda:0"], "a CPU row still gets its fresh child"


def test_cancel_ends_the_worker_and_the_measurement_in_flight():
    cancel = threading.Event()
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    seen = []

    def on_row(row):
        seen.append(row)
        cancel.set()  # after the first row, while nothing else is in flight

    with pytest.raises(LabCancelled):
        run_lab([Job("add", 64, repeats=1)] * 3, on_row=on_row, cancel=cancel)
    assert len(seen) == 1
    assert {p.pid for p in me.children(recursive=True)} - before == set()


def test_the_command_line_prints_a_table_and_json():
    r = lab("--ops", "add,add_,view", "--sizes", "64,128", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["operation", "size", "dtype"]
    assert sum(line.startswith("add ") for line in lines) == 2
    assert "add_: a.add_(b) — in place" in r.stdout
    r = lab("--ops", "add", "--sizes", "64", "--expr", "a @ b.T + c", "--json", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["op"] for row in rows] == ["add", "a @ b.T + c"]
    for key in ("op", "size", "dtype", "device", "result_bytes", "peak_extra_bytes",
                "shares_input_storage", "median_s"):  # fmt: skip
        assert key in rows[0]
    assert rows[1]["result_bytes"] == FLOAT32 * 64 * 64


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--ops", "nope"], "unknown operation 'nope'", 2),
        (["--sizes", "big"], "--sizes must be integers", 2),
        (["--ops", "add", "--expr", "a +"], "not a Python expression", 2),
        (["--ops", "add", "--dtype", "float99", "--sizes", "8"], "not a torch dtype", 1),
        (["--ops", "add", "--expr", "a[:3] + b", "--sizes", "8"], "size of tensor", 1),
    ],
)
def test_bad_input_gets_one_clear_line(args, message, code):
    r = lab(*args)
    assert r.returncode == code and message in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_measuring_in_process_leaves_no_tensor_behind():
    # What backward keeps is measured through saved-tensor hooks; a graph that saves its
    # own output must not keep it (and the inputs) alive in a cycle no collector sees.
    import gc

    import torch

    from torchmem.tensors.heap import objects_of_types

    def alive() -> int:
        gc.collect()
        (tensors,), _ = objects_of_types([torch.Tensor])
        return len(tensors)

    before = alive()
    for op in ("torch.sigmoid(a) * b", "checkpoint(lambda a, b: torch.sigmoid(a) * b, a, b)"):
        assert measure(Job(op, 64, grad=True, repeats=1)).saved
    assert alive() == before


@pytest.mark.parametrize("where", [[], ["--in-process"]])
def test_an_expression_that_prints_never_breaks_the_rows(where):
    # The worker's rows are a stream of their own: a print in the expression once landed
    # inside it ("the lab failed: JSONDecodeError").
    r = lab("--ops", "add", "--expr", 'print("hello") or a', "--sizes", "8", "--json",
            "--repeats", "1", *where)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["op"] for row in rows] == ["add", 'print("hello") or a']
    assert not any(row["error"] for row in rows)
    assert rows[1]["result_bytes"] == 0, "the expression returns a: nothing new"
