"""HEALTHY: Adam creates its state on the first step (twice the weights), then steady."""

import torch
from _common import STEPS, batch, model, nn

adam = torch.optim.Adam(model.parameters())
for _step in range(STEPS):
    x, y = batch()
    loss = nn.functional.cross_entropy(model(x), y)
    adam.zero_grad()
    loss.backward()
    adam.step()
