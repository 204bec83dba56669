"""HEALTHY: a large buffer allocated once during warm-up, then steady."""

import torch
from _common import STEPS, batch, train_step

buffer = None
for step in range(STEPS):
    if step == 2:
        buffer = torch.ones(8 << 20)  # 32 MiB, once
    train_step(*batch())
