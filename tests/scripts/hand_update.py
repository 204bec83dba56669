"""Updates parameters by hand: no optimizer, one backward per step."""

import torch

w = torch.randn(16, 4, requires_grad=True)
for _ in range(7):
    loss = (torch.randn(8, 16) @ w).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
