"""The MLP of issue 30: 4 Linear layers of 2048 trained with Adam, the batch a small part
of the process (tens of KiB a sample beside ~600 MiB of torch, weights and Adam state).

Options: --batch-size N, --steps N. Used to measure tuning where RSS noise between
identical runs is as large as the batch's own memory.
"""

import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 10),
)  # fmt: skip
opt = torch.optim.Adam(model.parameters())
for _ in range(args.steps):
    x = torch.randn(args.batch_size, 2048)
    y = torch.randint(0, 10, (args.batch_size,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
