"""A training step written for CUDA every way scripts move things there: ``model.cuda()``,
a pinned batch sent with ``.to(device, non_blocking=True)``, a factory with ``device=``.
The fake step must predict it like its CPU twin (``--device cpu``), on a machine without
CUDA too: on an H200 the model stayed on the CPU while its batches went to CUDA."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--device", default="cuda")
args = parser.parse_args()
device = torch.device(args.device)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
model = model.cuda() if device.type == "cuda" else model.to(device)
opt = torch.optim.Adam(model.parameters())
x = torch.randn(args.batch_size, 256)
if device.type == "cuda":
    x = x.pin_memory().to(device, non_blocking=True)
y = torch.randint(0, 10, (args.batch_size,), device=device)
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
opt.step()
