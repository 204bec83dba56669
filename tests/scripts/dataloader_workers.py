"""A DataLoader with two worker processes."""

import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
n = 0
for x, y in DataLoader(data, batch_size=16, num_workers=2):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    n += 1
print(f"batches {n}")
