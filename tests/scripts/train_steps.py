"""N optimizer steps (argv[1], default 12), with an epoch mark every 4 steps."""

import sys

import torch

import torchmem

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
model = torch.nn.Linear(16, 4)
opt = torch.optim.Adam(model.parameters())
for step in range(steps):
    if step % 4 == 0:
        torchmem.mark(f"epoch {step // 4 + 1}")
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"done {steps} steps")
