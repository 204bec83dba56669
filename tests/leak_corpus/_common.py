"""Shared by the corpus scripts: a small MLP and one training step on random data."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
STEPS = 60


def batch(n=512):
    return torch.randn(n, 256), torch.randint(0, 10, (n,))


def train_step(x, y):
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss, out
