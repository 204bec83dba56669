"""HEALTHY: a cache that fills during the first iterations, then stays the same size."""

from _common import STEPS, batch, train_step

cache = {}
for step in range(STEPS):
    x, y = batch()
    key = step % 12  # 12 distinct keys: the cache is full after 12 steps
    if key not in cache:
        cache[key] = x.repeat(4, 1)
    train_step(x, y)
