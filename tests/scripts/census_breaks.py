"""A script holding a module that breaks the census (its children() raises): torchmem's
census at a step boundary fails, and the script must finish as if nothing happened."""

import torch
from torch import nn


class Broken(nn.Module):
    def children(self):
        raise RuntimeError("a library's module whose children() raises")


model = nn.Linear(64, 64)
broken = Broken()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(30):
    loss = model(torch.randn(8, 64)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained 30 steps")
