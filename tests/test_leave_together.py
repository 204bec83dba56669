"""The ranks of a job stopped at a step limit leave together (probe/leave_together.py):
a rank that left first once cut a slower rank's last collective short, failing the trial
after every step had been measured."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from torchmem.probe.leave_together import leave_with_the_other_ranks, wait_for_ranks


def test_a_rank_at_its_step_limit_waits_until_every_rank_is_there():
    store = dist.HashStore()  # the job's store, shared by two ranks as threads
    results: list[bool] = []
    first = threading.Thread(target=lambda: results.append(wait_for_ranks(store, 2, "k", 30)))
    first.start()
    deadline = time.monotonic() + 10
    while store.add("k", 0) < 1 and time.monotonic() < deadline:  # until it has counted in
        time.sleep(0.005)
    first.join(0.3)
    assert first.is_alive(), "the first rank left before the second reached its limit"
    assert wait_for_ranks(store, 2, "k", 30)  # the last one in does not wait
    first.join(10)
    assert not first.is_alive() and results == [True]


def test_a_rank_that_never_comes_holds_the_others_only_until_the_timeout():
    store = dist.HashStore()
    started = time.monotonic()
    assert wait_for_ranks(store, 3, "k", 0.3) is False
    assert time.monotonic() - started < 5


def test_outside_a_job_a_process_leaves_at_once():
    assert not dist.is_initialized()
    started = time.monotonic()
    leave_with_the_other_ranks(4, timeout_s=30)
    assert time.monotonic() - started < 1
