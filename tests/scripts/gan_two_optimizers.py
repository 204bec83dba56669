"""Two optimizers stepping in each iteration (a GAN's shape): one step per iteration."""

import torch

g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
og, od = torch.optim.SGD(g.parameters(), lr=0.01), torch.optim.SGD(d.parameters(), lr=0.01)
for _ in range(5):
    loss_d = d(g(torch.randn(8, 4)).detach()).mean()
    od.zero_grad()
    loss_d.backward()
    od.step()
    loss_g = -d(g(torch.randn(8, 4))).mean()
    og.zero_grad()
    loss_g.backward()
    og.step()
