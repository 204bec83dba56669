"""HEALTHY: batches of varying size (like variable sequence lengths)."""

import random

from _common import STEPS, batch, train_step

random.seed(0)
for _step in range(STEPS):
    train_step(*batch(random.choice([64, 128, 256, 512, 1024])))
