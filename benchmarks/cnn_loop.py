"""The CPU training loop every step-time benchmark measures: a small CNN, Adam, batches
of 64 images of 32 x 32. Torch only (no torchmem import), so that the loops run under
the peers' tools (``peer_loop.py``) are the same program as the ones torchmem watches."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def make_loop(batch: int = 64) -> Callable[[], None]:
    """One training step of the CNN, as a function."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step
