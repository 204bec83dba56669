"""LEAK: a cache keyed by step that is never evicted (2 MiB per step)."""

from _common import STEPS, batch, train_step

cache = {}
for step in range(STEPS):
    x, y = batch()
    train_step(x, y)
    cache[f"batch-{step}"] = x.repeat(2, 1)  # [1024, 256] float32: 1 MiB
    cache[f"mirror-{step}"] = x.flip(0).repeat(2, 1)
