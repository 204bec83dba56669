"""HEALTHY: every 10 steps an evaluation pass with a big temporary batch, then freed."""

import torch
from _common import STEPS, batch, model, train_step

for step in range(STEPS):
    train_step(*batch())
    if step % 10 == 9:
        with torch.no_grad():
            model(torch.randn(4096, 256)).argmax(1)
