"""``torchmem.tune(step_fn)``: the batch-size search for a notebook's function, with its
trials imported in a fresh process, forked, or (when asked) in the caller itself."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import torchmem
from torchmem.probe.backends import peak_rss
from torchmem.tuning.function import reference
from torchmem.tuning.search import TuneCancelled, TuneError

SCRIPTS = Path(__file__).parent / "scripts"
MiB = 1 << 20
ROW = 256 * 1024  # float32: one MiB per sample


def _notebook_function():
    def hold(batch_size: int) -> None:
        x = torch.ones(batch_size, ROW)
        del x

    return hold


#: A step no other process can import, as a notebook cell's: held memory of one MiB a sample.
hold = _notebook_function()


def test_a_module_function_is_sent_by_reference_and_a_local_one_is_not():
    from torchmem.tuning import step_driver

    assert reference(step_driver.resolve) == "torchmem.tuning.step_driver:resolve"
    assert reference(lambda b: None) is None

    def local(b: int) -> None: ...

    assert reference(local) is None
    assert reference(torch.nn.Linear(2, 2).forward) is None  # a bound method


@pytest.mark.slow
def test_an_importable_function_runs_each_trial_in_a_fresh_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import step_functions

    pids = tmp_path / "pids"
    monkeypatch.setenv("TORCHMEM_TEST_PIDS", str(pids))
    budget = peak_rss() + 400 * MiB
    result = torchmem.tune(
        step_functions.linear_step, budget=budget, max_trials=2, verbose=False, predict=False
    )
    calls = [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]
    ran_in = {pid for pid, _ in calls}
    assert os.getpid() not in ran_in and len(ran_in) == 2  # one fresh process per trial
    # Each trial called the function at its own size: a warm-up step and three measured
    # ones, each seen by the agent.
    assert sorted(calls) == sorted((pid, b) for pid, b in calls)
    assert [b for _, b in calls] == [1] * 4 + [result.trials[1].batch_size] * 4
    assert all(t.ok and t.steps == 4 for t in result.trials), result.trials
    assert any("stopped after 2 trials" in note for note in result.notes)


@pytest.mark.slow
def test_a_function_by_reference_is_predicted_by_a_fake_step_first(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import step_functions

    pids = tmp_path / "pids"
    monkeypatch.setenv("TORCHMEM_TEST_PIDS", str(pids))
    budget = peak_rss() + 400 * MiB
    result = torchmem.tune(step_functions.linear_step, budget=budget, verbose=False)
    (said,) = [n for n in result.notes if n.startswith("predicted before running")]
    assert "1.00 MiB × batch" in said  # exactly what a sample holds
    assert result.ooms == 0 and len(result.trials) == 4, [t.batch_size for t in result.trials]
    calls = [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]
    fake_pid, first = calls[0]
    fake_sizes = [b for pid, b in calls if pid == fake_pid]
    # The fake step: one call per size, eightfold up, then one between the top two, in a
    # process of its own.
    *eightfold, between = fake_sizes
    assert first == 1 and eightfold == [8**i for i in range(len(eightfold))]
    assert between == round((eightfold[-2] * eightfold[-1]) ** 0.5)
    assert fake_pid != os.getpid() and len(eightfold) >= 3


def test_a_notebook_function_is_forked_and_its_recommendation_fits(tmp_path):
    budget = peak_rss() + 300 * MiB
    limit = budget - budget // 10
    pids: list[int] = []
    result = torchmem.tune(
        hold, budget=budget, verbose=False, on_trial=lambda trial, fit: pids.append(1)
    )
    assert result.ooms == 0 and len(pids) == len(result.trials) <= 8, [
        (t.batch_size, t.role, t.peak_bytes, t.oom) for t in result.trials
    ]
    best = next(t for t in result.trials if t.batch_size == result.max_fitting)
    assert best.ok and best.peak_bytes <= limit
    # The forked child starts from this process's pages: the room left is about what the
    # batch may take, one MiB a sample (estimated from the first trial's peak, which
    # wanders by a few MiB: what must hold exactly is the verified peak above).
    room = (limit - result.trials[0].peak_bytes) / MiB
    assert 0.85 * room <= result.recommended <= 1.05 * room, (result.recommended, room)
    assert result.fit is not None and result.fit.slope == pytest.approx(MiB, rel=0.15)
    assert any("forked" in note for note in result.notes)


def test_a_forked_trial_that_crosses_the_budget_is_stopped_and_counted_out_of_memory():
    budget = peak_rss() + 300 * MiB

    def grows_past_the_budget(batch_size: int) -> None:
        rows = batch_size if batch_size <= 64 else 4096  # a bug at large sizes: 4 GiB
        x = torch.ones(rows, ROW)
        del x

    started = time.monotonic()
    result = torchmem.tune(grows_past_the_budget, budget=budget, verbose=False)
    assert time.monotonic() - started < 60
    assert result.recommended <= 64 and result.ooms >= 1
    stopped = [t for t in result.trials if t.oom]
    assert all("crossed the budget" in t.message for t in stopped)


def test_cancelling_ends_the_running_trial(tmp_path):
    started_file = tmp_path / "child"

    def slow(batch_size: int) -> None:
        started_file.write_text(str(os.getpid()))
        time.sleep(60)

    cancel = threading.Event()

    def cancel_once_started() -> None:
        while not started_file.exists():
            time.sleep(0.01)
        cancel.set()

    watcher = threading.Thread(target=cancel_once_started)
    watcher.start()
    with pytest.raises(TuneCancelled):
        torchmem.tune(slow, budget="1GiB", cancel=cancel, verbose=False)
    watcher.join()
    child = int(started_file.read_text())
    assert not psutil.pid_exists(child)


def test_in_process_trials_on_an_accelerator_catch_its_out_of_memory_errors(stub_cuda, monkeypatch):
    capacity = 6 << 30  # the device holds 6 GiB, but the user asks for a budget of 8
    monkeypatch.setattr(torch, "cuda", stub_cuda)

    def step(batch_size: int) -> None:
        need = (100 + batch_size) * MiB
        if stub_cuda.allocated[0] + need > capacity:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {need} bytes")
        stub_cuda.alloc(0, need)
        stub_cuda.free(0, need)

    lines: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    result = torchmem.tune(step, budget="8GiB", device="cuda:0", isolation="none", max_batch=8192)
    # The device's own limit (6 GiB less the step's own 100 MiB) wins over the budget's.
    true_max = (capacity - 100 * MiB) // MiB
    assert result.ooms >= 1 and result.recommended <= true_max
    assert result.recommended >= 0.95 * true_max, "\n".join(lines)
    assert "empty_cache" in stub_cuda.calls  # what a failed trial left is given back
    assert any("OUT OF MEMORY" in line for line in lines)
    assert any(f"recommended batch size {result.recommended}" in line for line in lines)
    assert any("isolation='none'" in note for note in result.notes)


def test_bad_input_is_refused_with_what_to_do(stub_cuda, monkeypatch):
    with pytest.raises(TuneError, match="function of the batch size"):
        torchmem.tune(42)
    with pytest.raises(TuneError, match="move it into a module"):
        torchmem.tune(hold, budget="1GiB", isolation="process")
    with pytest.raises(TuneError, match="isolation must be"):
        torchmem.tune(hold, budget="1GiB", isolation="thread")
    with pytest.raises(TuneError, match="not a size"):
        torchmem.tune(hold, budget="lots")
    with pytest.raises(TuneError, match="does not fit"):
        torchmem.tune(hold, budget=peak_rss() // 2, verbose=False)
    monkeypatch.setattr(torch, "cuda", stub_cuda)  # CUDA is initialised in this process
    with pytest.raises(TuneError, match=r"CUDA is already initialised.*beside the notebook"):
        torchmem.tune(hold, budget="4GiB", device="cuda:0")
