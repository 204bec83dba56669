"""HEALTHY: a buffer that accumulates micro-batch outputs for 8 steps, then is cleared."""

from _common import STEPS, batch, train_step

pending = []
for _step in range(STEPS):
    _, out = train_step(*batch())
    pending.append(out.detach().repeat(100, 1))  # ~1 MiB
    if len(pending) == 8:
        pending.clear()
