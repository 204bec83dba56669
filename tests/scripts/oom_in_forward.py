"""A forward pass that asks the CPU allocator for a petabyte: an out-of-memory error
raised in a function whose local (``hidden``) holds the largest tensor."""

import torch

model = torch.nn.Linear(256, 1024)


def forward_big(batch):
    hidden = model(torch.randn(batch, 256))
    return hidden, torch.empty(1 << 50, dtype=torch.uint8)


forward_big(2048)
