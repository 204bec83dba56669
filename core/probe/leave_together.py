"""The ranks of a job that stop at a step limit leave together.

``torchmem run --max-steps N -- torchrun ...`` (each trial of ``torchmem tune`` on a job)
ends every rank at the end of its N-th step. A rank that exited as soon as its last
collective returned on its side could close its sockets while a slower rank was still
reading that collective's last bytes: the slower rank failed with gloo's "Connection
closed by peer", and the trial with it, after every step had been measured (seen in CI).
So each rank first counts itself in on the job's own store (the rendezvous store that
``init_process_group`` already holds, not a collective: nothing is allocated on a device
and no stream is synchronised) and waits, for a bounded time, until every rank has: by
then each has finished its last step's collectives.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

#: The longest a rank waits for the others (a rank that makes fewer steps, a pipeline
#: stage that never steps): it then leaves anyway, as it did before.
WAIT_S = 20.0


def leave_with_the_other_ranks(steps: int, timeout_s: float = WAIT_S) -> None:
    """Wait until every rank of this process's job has reached its step limit ``steps``;
    return at once outside a job. Never raises: a failure here only means leaving alone."""
    dist = sys.modules.get("torch.distributed")  # a job has imported it: never import it
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        world = dist.get_world_size()
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # an unusual backend or a torch without the store accessor
        return
    wait_for_ranks(store, world, f"torchmem/step-limit/{steps}", timeout_s)


def wait_for_ranks(store: Any, world_size: int, key: str, timeout_s: float) -> bool:
    """Count this rank in under ``key`` on ``store`` and wait until ``world_size`` ranks
    have; True when they all did within ``timeout_s``."""
    try:
        arrived = store.add(key, 1)
        if arrived >= world_size:
            store.set(key + "/all", b"1")  # the last one in releases the others
            return True
        store.wait([key + "/all"], timedelta(seconds=timeout_s))
        return True
    except Exception:  # the wait timed out, or the store is gone: leave alone
        return False
