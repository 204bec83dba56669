"""Step functions for ``torchmem.tune`` tests, importable by reference from a fresh process.

``linear_step(batch)`` holds ``batch`` MiB for one training step, and appends the pid of
the process it ran in and the batch size to the file named by ``TORCHMEM_TEST_PIDS`` (if set).
"""

import os

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ROW = 256 * 1024  # float32: one MiB per sample


def linear_step(batch_size: int) -> None:
    """One step whose activations take ``batch_size`` MiB."""
    pids = os.environ.get("TORCHMEM_TEST_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()} {batch_size}\n")
    activations = torch.ones(batch_size, ROW)
    loss = model(activations[:, :16]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
